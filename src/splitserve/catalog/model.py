"""The model entries of the catalog (models.toml): the shape of a decoder-only transformer, dense
or mixture of experts, and the sizes that follow from it (KV bytes per token, weights)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Shape of a decoder-only transformer, dense or mixture of experts (MoE).

    An MoE model (`experts` > 1) replaces every layer's MLP by `experts` SwiGLU MLPs of width
    `intermediate` (three hidden x intermediate matrices each) and a router; each token runs
    `experts_per_token` of them. `params` counts every expert; `active_params` what one token uses.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int        # MLP width; an MoE model's width of ONE expert
    vocab: int
    params: int              # all weights, every expert included
    max_context: int
    dtype_bytes: int
    experts: int = 1                 # MLPs per layer (1 = dense)
    experts_per_token: int = 1       # MLPs each token runs (top-k routing)
    mlp: str = "swiglu"              # swiglu (gated, three matrices), gelu or relu (two matrices)
    positions: str = "rope"          # rope (rotary, applied per layer), alibi or learned

    def __post_init__(self) -> None:
        if not 1 <= self.experts_per_token <= self.experts:
            raise ValueError(
                f"model {self.name!r}: need 1 <= experts_per_token ({self.experts_per_token}) "
                f"<= experts ({self.experts})"
            )
        if self.experts > 1 and self.params <= self.expert_params:
            raise ValueError(
                f"model {self.name!r}: params {self.params} must exceed the experts' "
                f"{self.expert_params} (attention, embeddings and router come on top)"
            )

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token: 2 * layers * kv_heads * head_dim * dtype_bytes."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        """Every weight, all experts included (what the GPUs must hold)."""
        return self.params * self.dtype_bytes

    @property
    def params_per_expert(self) -> int:
        """One expert's SwiGLU MLP summed over the layers: layers * 3 * hidden * intermediate.
        0 for a dense model (its MLP counts as shared, not as an expert)."""
        return 3 * self.layers * self.hidden * self.intermediate if self.is_moe else 0

    @property
    def expert_params(self) -> int:
        """All experts of all layers: experts * params_per_expert (0 for a dense model)."""
        return self.experts * self.params_per_expert

    @property
    def shared_params(self) -> int:
        """Weights every token uses: embeddings, attention, norms, router (all of a dense model)."""
        return self.params - self.expert_params

    @property
    def active_params(self) -> int:
        """Weights one token computes with: shared + experts_per_token experts (params if dense)."""
        return self.shared_params + self.experts_per_token * self.params_per_expert
