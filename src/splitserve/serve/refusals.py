"""What this server does not implement, refused by name: every field of the OpenAI API (as the
official `openai` client sends it) and of vLLM's extensions that splitserve does not implement
(`suffix`, `functions`, ...; the table
UNSUPPORTED) is refused with 400 `unsupported`, naming the field, when it asks for anything but the
default, never accepted and ignored; so are the keys of a chat message other than `role`,
`content`, `name`, `tool_calls` and `tool_call_id` (`function_call`, ...), OpenAI's
`stream_options.include_obfuscation`, and tools on /v1/completions (`refuse_tools`). The
fields that only describe a request (`user`, `metadata`, `store`, ...) are not here: bodies.py
takes them (`Described`). Names that
are neither OpenAI's nor vLLM's are ignored, as vLLM does, so that clients sending vendor extras
still work."""

from __future__ import annotations

from .openai_io import bad

# field -> the values that ask for nothing (anything else: 400 unsupported). The OpenAI API's
# fields (those of the `openai` client's create params that no model above has) and vLLM's
# extensions (its CompletionRequest, ChatCompletionRequest and TokenizeChatRequest); `echo` on
# chat is refused in prepare (vLLM's chat echo means something else).
UNSUPPORTED: dict[str, tuple[object, ...]] = {
    # OpenAI
    "suffix": (None, ""),
    "functions": (None, []), "function_call": (None, "none"), "audio": (None,),
    "modalities": (None, ["text"]), "prediction": (None,), "verbosity": (None,), "web_search_options": (None,),
    "moderation": (None,), "prompt_cache_retention": (None,), "prompt_cache_options": (None,),
    # vLLM's extensions
    "use_beam_search": (None, False),
    "length_penalty": (None, 1.0), "guided_decoding_backend": (None,), "guided_whitespace_pattern": (None,),
    "structured_outputs": (None,), "structural_tag": (None,), "spaces_between_special_tokens": (None, True),
    "allowed_token_ids": (None,), "bad_words": (None, []), "truncate_prompt_tokens": (None,),
    "prompt_embeds": (None,), "priority": (None, 0), "request_id": (None,), "logits_processors": (None, []),
    "return_tokens_as_token_ids": (None, False), "return_token_ids": (None, False), "cache_salt": (None,),
    "kv_transfer_params": (None,), "vllm_xargs": (None, {}), "max_repetition_pattern_size": (None, 0),
    "min_repetition_pattern_size": (None, 0), "repetition_min_count": (None, 0), "include_reasoning": (None, True),
    "continue_final_message": (None, False), "documents": (None,), "chat_template": (None,),
    "chat_template_kwargs": (None, {}), "mm_processor_kwargs": (None,), "media_io_kwargs": (None,),
}
_STREAM_OPTIONS_UNSUPPORTED = {"include_obfuscation": (None, False)}
_MESSAGE_UNSUPPORTED: dict[str, tuple[object, ...]] = {
    "function_call": (None,), "audio": (None,),
    "refusal": (None,)}


def refuse_unsupported(body: dict) -> None:
    """400 `unsupported` for the first field of `body` (or of its stream_options) that asks for
    something not implemented."""
    for name, ok in UNSUPPORTED.items():
        if body.get(name) not in ok:
            raise bad(f"'{name}' is not supported by this server", name, "unsupported")
    so = body.get("stream_options")
    if isinstance(so, dict):
        for name, ok in _STREAM_OPTIONS_UNSUPPORTED.items():
            if so.get(name) not in ok:
                raise bad(f"'stream_options.{name}' is not supported by this server", f"stream_options.{name}",
                          "unsupported")


def refuse_tools(body: dict) -> None:
    """400 `unsupported` for tools asked of /v1/completions (chat completions take them)."""
    for name in ("tools", "tool_choice", "parallel_tool_calls"):
        if body.get(name) is not None:
            raise bad(f"'{name}' is for /v1/chat/completions, not /v1/completions", name, "unsupported")


def refuse_in_message(i: int, m: dict) -> None:
    """400 `unsupported` for a key of chat message `i` that asks for something not implemented."""
    for key, ok in _MESSAGE_UNSUPPORTED.items():
        if m.get(key) not in ok:
            raise bad(f"messages[{i}].{key} is not supported by this server", f"messages.{key}", "unsupported")
