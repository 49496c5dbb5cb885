"""Multi-head attention through transformers' attention interface: the `s` and `c` sub-layers of the backbone, and the
base of every family's attention."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .configuration import LayerFusionConfig
from .extension_points import AttentionSublayer, LayerContext


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    attn_weights = torch.matmul(query, key.transpose(2, 3)) * scaling
    if attention_mask is not None:
        attn_weights = attn_weights + attention_mask
    attn_weights = F.softmax(attn_weights, dim=-1)
    attn_weights = F.dropout(attn_weights, p=dropout, training=module.training)
    attn_output = torch.matmul(attn_weights, value).transpose(1, 2).contiguous()
    return attn_output, attn_weights


class MultiHeadAttention(AttentionSublayer, decoding_step="self"):
    """Multi-head attention through transformers' attention interface (eager, sdpa, flash, flex).

    `attend(queries_from, keys_from)` is the primitive: keys/values of `keys_from` append to slot `layer_idx` of
    `cache` (a `Cache`), or, with `static_keys=True` (keys that depend on the encoder only), are computed at the first
    step and reused from that slot afterwards. `forward` is the `s` sub-layer: attention over its own input.

    Keys/values with fewer rows than the queries are shared by groups of consecutive query rows (a decoding loop that
    keeps one copy of the encoder's keys per sentence for all its beams, `hf_layerfusion.inference`): each group's
    rows are attended as extra query positions. Modules whose attention combines such keys with per-row keys set
    `accepts_key_groups = False`, and are then always given one key row per query row.
    """

    accepts_key_groups = True

    def __init__(self, config: LayerFusionConfig, num_heads: int, is_causal: bool = False, layer_idx: int | None = None):
        super().__init__()
        self.config = config
        self.head_dim = config.d_model // num_heads
        self.scaling = self.head_dim**-0.5
        self.dropout = config.attention_dropout
        self.is_causal = is_causal
        self.layer_idx = layer_idx
        self.k_proj = nn.Linear(config.d_model, config.d_model)
        self.v_proj = nn.Linear(config.d_model, config.d_model)
        self.q_proj = nn.Linear(config.d_model, config.d_model)
        self.out_proj = nn.Linear(config.d_model, config.d_model)

    def project_keys_values(
        self,
        keys_from: torch.Tensor,
        cache: Cache | None,
        static_keys: bool = False,
        prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of `keys_from`, through this module's cache slot (see the class docstring).

        `prefix`: keys/values `(rows, heads, positions, head_dim)` that come before the cached ones, the same at every
        step of an input (layer-wise coordination's source part of the mixed attention): the result is
        `[prefix ; keys]` along positions. A cache with `update_with_prefix` (the fast decoding loop's) keeps them in
        one buffer; with any other the two are concatenated here, at every step."""
        slot = cache
        if isinstance(cache, EncoderDecoderCache):
            if static_keys and cache.is_updated.get(self.layer_idx, False):
                layer = cache.cross_attention_cache.layers[self.layer_idx]
                return layer.keys, layer.values
            slot = cache.cross_attention_cache if static_keys else cache.self_attention_cache
        kv_shape = (*keys_from.shape[:-1], -1, self.head_dim)
        key_states = self.k_proj(keys_from).view(kv_shape).transpose(1, 2)
        value_states = self.v_proj(keys_from).view(kv_shape).transpose(1, 2)
        if prefix is not None and hasattr(slot, "update_with_prefix"):
            return slot.update_with_prefix(key_states, value_states, self.layer_idx, *prefix)
        if slot is not None:
            key_states, value_states = slot.update(key_states, value_states, self.layer_idx)
            if static_keys and isinstance(cache, EncoderDecoderCache):
                cache.is_updated[self.layer_idx] = True
        if prefix is not None:
            key_states = torch.cat([prefix[0], key_states], dim=2)
            value_states = torch.cat([prefix[1], value_states], dim=2)
        return key_states, value_states

    def attend_to(
        self,
        queries_from: torch.Tensor,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of `queries_from` over given keys/values, output projection included (keys shared by groups of
        query rows: see the class docstring)."""
        input_shape = queries_from.shape[:-1]
        query_states = self.q_proj(queries_from).view(*input_shape, -1, self.head_dim).transpose(1, 2)
        rows, heads, length, head_dim = query_states.shape
        groups = rows // key_states.shape[0]
        if groups > 1:  # (rows, heads, length, d) -> (rows / groups, heads, groups * length, d)
            query_states = query_states.reshape(-1, groups, heads, length, head_dim).transpose(1, 2)
            query_states = query_states.reshape(-1, heads, groups * length, head_dim)
            if attention_mask is not None and attention_mask.shape[2] != 1:
                attention_mask = attention_mask.repeat(1, 1, groups, 1)
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, eager_attention_forward
        )
        attn_output, attn_weights = attention_interface(
            self,
            query_states,
            key_states,
            value_states,
            attention_mask,
            dropout=self.dropout if self.training else 0.0,
            scaling=self.scaling,
            **kwargs,
        )
        if groups > 1:  # back to one row per query row: (rows / groups, groups * length, heads, d) -> (rows, length, ...)
            attn_output = attn_output.reshape(rows, length, heads, head_dim)
            if attn_weights is not None:
                attn_weights = attn_weights.reshape(-1, heads, groups, length, attn_weights.shape[-1]).transpose(1, 2)
                attn_weights = attn_weights.reshape(rows, heads, length, -1)
        attn_output = self.out_proj(attn_output.reshape(*input_shape, -1).contiguous())
        return attn_output, attn_weights

    def attend(
        self,
        queries_from: torch.Tensor,
        keys_from: torch.Tensor,
        attention_mask: torch.Tensor | None,
        cache: Cache | None = None,
        static_keys: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        key_states, value_states = self.project_keys_values(keys_from, cache, static_keys)
        return self.attend_to(queries_from, key_states, value_states, attention_mask, **kwargs)

    def forward(self, hidden_states: torch.Tensor, context: LayerContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.attend(
            hidden_states,
            hidden_states,
            context.attention_mask,
            context.cache,
            **context.attention_kwargs,
        )


class CrossAttention(MultiHeadAttention, decoding_step="memory"):
    """The `c` sub-layer: attention over the encoder memory, whose keys/values are computed once per input."""

    def forward(self, hidden_states: torch.Tensor, context: LayerContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.attend(
            hidden_states,
            context.memory,
            context.memory_mask,
            context.cache,
            static_keys=True,
            **context.attention_kwargs,
        )
