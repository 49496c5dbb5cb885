"""A layer of either stack: a sequence of residual sub-layers (`s` self-attention, `c` cross-attention, `f`
feed-forward) given by a layout string, and the decoder's cache slots."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache
from transformers.modeling_layers import GradientCheckpointingLayer

from .configuration import LayerFusionConfig
from .extension_points import AttentionSublayer, FeedForwardSublayer, LayerContext


class ResidualSublayer(nn.Module):
    """Holds the LayerNorm of one residual sub-layer `x + dropout(f(x))`, placed after the sum (post-norm, the
    default, as in GTrans and Dou et al.) or before `f` (pre-norm, as in RTAL's tensor2tensor setting).
    `run`, `enter` and `exit` are plain methods, not module calls: they run on every decoding step, where module-call
    overhead shows."""

    def __init__(self, config: LayerFusionConfig):
        super().__init__()
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.normalize_before = config.normalize_before
        self.dropout = config.dropout

    def enter(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The input of `f`."""
        return self.layer_norm(hidden_states) if self.normalize_before else hidden_states

    def exit(self, residual: torch.Tensor, sublayer_output: torch.Tensor) -> torch.Tensor:
        """The sub-layer's output from its input `residual` and `f`'s output."""
        hidden_states = residual + F.dropout(sublayer_output, p=self.dropout, training=self.training)
        return hidden_states if self.normalize_before else self.layer_norm(hidden_states)

    def run(
        self, kind: str, sublayer: nn.Module, hidden_states: torch.Tensor, context: LayerContext
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The residual sub-layer of `kind` (`s`, `c` or `f`) around `sublayer`: its output, and the attention weights
        of an attention sub-layer (None otherwise, or where the implementation returns none). The float32 inference
        copy overrides it to run a decoding step of a sub-layer that declares one (`Sublayer.decoding_step()`) in one
        compiled call."""
        if kind == "f":
            return self.exit(hidden_states, sublayer(self.enter(hidden_states))), None
        context.normalize = self.enter
        output, attn_weights = sublayer(self.enter(hidden_states), context)
        return self.exit(hidden_states, output), attn_weights


class FeedForward(FeedForwardSublayer, decoding_step="feed_forward"):
    """The `f` sub-layer: `W_2 act(W_1 x + b_1) + b_2`, dropout after the activation."""

    def __init__(self, config: LayerFusionConfig, ffn_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]
        self.activation_dropout = config.activation_dropout

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        hidden_states = self.activation_fn(self.fc1(hidden_states))
        hidden_states = F.dropout(hidden_states, p=self.activation_dropout, training=self.training)
        return self.fc2(hidden_states)


SUBLAYER_KINDS = {"s": "self_attn", "c": "encoder_attn", "f": "ffn"}


def sublayer_names(layout: str) -> list[tuple[str, str]]:
    """`(kind, module name)` of each sub-layer of a layout such as `"scf"`. The first sub-layer of a kind has the
    Marian/BART name (`self_attn`, `encoder_attn`, `ffn`, each with its `<name>_block` LayerNorm holder), so that
    Marian checkpoints map one to one; a repeated kind is numbered from 2 (`ffn_2`)."""
    names, seen = [], {}
    for kind in layout:
        if kind not in SUBLAYER_KINDS:
            raise ValueError(f"Unknown sub-layer {kind!r} in layout {layout!r}; choose from {sorted(SUBLAYER_KINDS)}.")
        seen[kind] = seen.get(kind, 0) + 1
        base = SUBLAYER_KINDS[kind]
        names.append((kind, base if seen[kind] == 1 else f"{base}_{seen[kind]}"))
    return names


class TransformerLayer(GradientCheckpointingLayer):
    """One layer: a sequence of residual sub-layers given by `layout` (`s` self-attention, `c` cross-attention,
    `f` feed-forward; `"sf"` is the encoder layer of Vaswani et al., `"scf"` the decoder layer).

    Returns `(hidden_states, self_attn_weights, cross_attn_weights)` (weights only with eager attention; of the first
    attention sub-layer of each kind). `c` sub-layers are skipped when there is no memory (a decoder run on its own,
    as Marian does). The lower states come in positionally so that gradient checkpointing with `use_reentrant=True`
    still propagates their gradients.
    """

    def __init__(self, config: LayerFusionConfig, layout: str, build_sublayer: Callable[[str], nn.Module]):
        super().__init__()
        self.layout = layout
        self.sublayers = sublayer_names(layout)
        for kind, name in self.sublayers:
            sublayer = build_sublayer(kind)
            expected = FeedForwardSublayer if kind == "f" else AttentionSublayer
            if not isinstance(sublayer, expected):
                raise TypeError(
                    f"The {kind!r} sub-layer {name} is a {type(sublayer).__name__}; a {kind!r} sub-layer must be a "
                    f"{expected.__name__} (hf_layerfusion.modeling.extension_points)."
                )
            self.add_module(name, sublayer)
            self.add_module(f"{name}_block", ResidualSublayer(config))

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        *lower_states: torch.Tensor,
        memory_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        **kwargs,
    ):
        context = LayerContext(attention_mask, memory, memory_mask, cache, lower_states, kwargs)
        weights = {"s": None, "c": None}
        for kind, name in self.sublayers:
            if kind == "c" and memory is None:
                continue
            block: ResidualSublayer = self._modules[f"{name}_block"]
            hidden_states, attn_weights = block.run(kind, self._modules[name], hidden_states, context)
            if kind != "f" and weights[kind] is None:
                weights[kind] = attn_weights
        return hidden_states, weights["s"], weights["c"]


class CacheSlots:
    """Hands out decoder cache slots while a stack is built: every attention sub-layer that keeps keys/values gets
    its own slot of the self-attention cache (and of the cross-attention cache for `c` sub-layers). The config
    says how many slots generation must allocate (`decoder_cache_layers`); the decoder checks the two agree."""

    def __init__(self):
        self.self_attention = 0
        self.cross_attention = 0

    def next_self(self) -> int:
        self.self_attention += 1
        return self.self_attention - 1

    def next_cross(self) -> int:
        self.cross_attention += 1
        return self.cross_attention - 1
