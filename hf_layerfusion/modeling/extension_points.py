"""The plain choices of the backbone's extension points (see `hf_layerfusion.modeling`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class TopLayerEncoderReadout(nn.Module):
    """Plain Transformer: cross-attention reads the top encoder layer.

    Readouts receive the states `[s_0 .. s_L]` (s_0 = embeddings; in pre-norm models s_1..s_L pass through the
    stack's final LayerNorm). Every readout also reports its learned fusion weights, as the papers plot them, via
    `fusion_weights()` (`{name: 1-D tensor}`; logged by `hf_layerfusion.callbacks.FusionWeightsCallback`). An
    encoder readout may define `layer_memories(states) -> (batch, decoder_layers, source, d_model)` to give each
    decoder layer its own memory; it receives the states as the layers produced them (pre-norm: before the final
    LayerNorm; the decoder sub-layer reading them normalises them through `LayerContext.normalize`)."""

    def fusion_weights(self) -> dict[str, torch.Tensor]:
        return {}

    def forward(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        return states[-1]


class TopLayerDecoderReadout(nn.Module):
    """Plain Transformer: one output group, the top decoder layer."""

    num_groups = 1

    def fusion_weights(self) -> dict[str, torch.Tensor]:
        return {}

    def num_layers_needed(self, groups: Sequence[int]) -> int | None:
        return None  # all layers

    def forward(self, states: Sequence[torch.Tensor], groups: Sequence[int]) -> tuple[torch.Tensor, ...]:
        return (states[-1],)
