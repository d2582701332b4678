"""The inference engine: Llama-family models (Llama 2/3/3.1, Mistral, Qwen2) in PyTorch with a
paged KV cache, continuous batching and the prompt/token KV handoff. Needs the `engine` extra
(torch, safetensors, tokenizers); importing this package alone does not import torch.

    from splitserve.engine.engine import EngineConfig, LLMEngine
    from splitserve.engine.sampler import SamplingParams
"""

__all__ = ["LLMEngine", "EngineConfig", "SamplingParams", "KVExport", "ModelConfig", "RequestOutput", "PrefillResult"]


def __getattr__(name: str):
    if name in ("LLMEngine", "RequestOutput", "PrefillResult"):
        from . import engine
        return getattr(engine, name)
    if name == "EngineConfig":
        from .engine_config import EngineConfig
        return EngineConfig
    if name == "SamplingParams":
        from .sampler import SamplingParams
        return SamplingParams
    if name == "KVExport":
        from .kv_cache import KVExport
        return KVExport
    if name == "ModelConfig":
        from .config import ModelConfig
        return ModelConfig
    raise AttributeError(name)
