"""The attention of the inference copies (float32 and int8): an attention implementation registered with
transformers' `AttentionInterface` (and, for its masks, `AttentionMaskInterface`, as SDPA's boolean masks) under
`DECODING_ATTENTION` (`register_decoding_attention`), which runs the C++ kernel `decode_attention`
(kernels/decode_attention.cpp) at decoding steps and SDPA everywhere else.

A decoding step attends with one query per row (or a sentence's beams folded into a few query positions over its
shared cross-attention keys), where SDPA's CPU kernel spends most of its time on fixed per-row-head work. The kernel
computes the same function, not bit for bit (float rounding, about 1e-6): the sums in another order, as the
float32 copy's `Float32Linear` layers."""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from transformers.modeling_utils import AttentionInterface

from .cpu_kernels import compiled_kernels

DECODING_ATTENTION = "hf_layerfusion_cpu_decoding"
MAX_DECODING_QUERIES = 16  # a step's queries per row: 1, or the beams of a sentence folded together
HEAD_DIMS = range(16, 129, 16)  # the kernel's 16-float vectors


def decode_attention_applies(module, query, key, value, attention_mask, dropout, kwargs) -> bool:
    """Whether `decoding_attention_forward` runs the kernel: a float32 CPU decoding step (at most
    `MAX_DECODING_QUERIES` queries, nothing causal among them), no dropout, keys/values for each row and head of the
    queries, head_dim a multiple of 16 up to 128, contiguous last dimensions, and no mask or a boolean padding mask
    (`is_padding_mask`). Anything else runs SDPA rather than fail in the kernel's checks."""
    queries = query.shape[2]
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    return (
        queries <= MAX_DECODING_QUERIES
        and not (causal and queries > 1 and attention_mask is None)
        and dropout == 0.0
        and query.dtype == key.dtype == value.dtype == torch.float32
        and query.device.type == "cpu"
        and query.shape[-1] in HEAD_DIMS
        and key.shape == value.shape
        and key.shape[:2] == query.shape[:2]
        and key.shape[2] > 0
        and all(tensor.stride(-1) == 1 for tensor in (query, key, value))
        and kwargs.get("position_bias") is None
        and not kwargs.get("output_attentions", False)  # SDPA warns that it returns no weights
        and (attention_mask is None or is_padding_mask(attention_mask, query, key))
    )


def is_padding_mask(mask: torch.Tensor, query: torch.Tensor, key: torch.Tensor) -> bool:
    """A boolean mask the kernel reads: `(rows or 1, 1, queries or 1, keys)`, keys contiguous."""
    return (
        mask.dtype == torch.bool
        and mask.dim() == 4
        and mask.shape[0] in (1, query.shape[0])
        and mask.shape[1] == 1
        and mask.shape[2] in (1, query.shape[2])
        and mask.shape[3] == key.shape[2]
        and mask.stride(-1) == 1
    )


def decoding_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The `DECODING_ATTENTION` implementation: `sdpa_attention_forward`'s signature and output
    `(rows, queries, heads, head_dim)`, through the kernel where `decode_attention_applies`, else SDPA itself."""
    kernels = compiled_kernels()
    if kernels is None or not decode_attention_applies(module, query, key, value, attention_mask, dropout, kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    return kernels.decode_attention(query, key, value, attention_mask, scaling), None


def register_decoding_attention() -> str:
    """Registers `DECODING_ATTENTION` with transformers (idempotent; the inference copies call it before switching to it)
    and returns its name."""
    AttentionInterface.register(DECODING_ATTENTION, decoding_attention_forward)
    AttentionMaskInterface.register(DECODING_ATTENTION, sdpa_mask)
    return DECODING_ATTENTION
