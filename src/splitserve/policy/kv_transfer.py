"""How a prompt machine ships a batch's KV cache (paper §IV-C): one shot after the prompt for
small batches, layer by layer, overlapped with the prompt computation, for large ones."""

from enum import IntEnum


class TransferMode(IntEnum):
    SERIALIZED = 0
    LAYERWISE = 1


DEFAULT_LAYERWISE_THRESHOLD = 512   # prompt tokens; the paper uses serialized below 512 on H100


def choose_mode(batch_prompt_tokens: int, threshold: int = DEFAULT_LAYERWISE_THRESHOLD) -> TransferMode:
    """The batch's size is known when it starts, so the mode is chosen per batch."""
    return TransferMode.LAYERWISE if batch_prompt_tokens >= threshold else TransferMode.SERIALIZED
