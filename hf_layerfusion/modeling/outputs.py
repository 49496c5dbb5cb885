"""What the stacks, the output head and the models return."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)


@dataclass
class LayerFusionEncoderOutput(BaseModelOutput):
    """Encoder output. `last_hidden_state` is the memory every cross-attention reads (the readout's output);
    `layer_memories`, for families that give each decoder layer its own memory, is
    `(batch, decoder_layers, source, d_model)` (batch first, so that beam search expands it like the memory)."""

    layer_memories: torch.Tensor | None = None


# The decoder's and the bare model's outputs extend transformers' own, so that their cache field has the installed
# release's name (`past_key_values`, `cache` from 5.24 on: `hf_layerfusion.compat`).
@dataclass
class LayerFusionDecoderOutput(BaseModelOutputWithPastAndCrossAttentions):
    """Decoder stack output. `group_features[k]` is the readout of output group `decoder_groups[k]`."""

    group_features: tuple[torch.Tensor, ...] | None = None


@dataclass
class LayerFusionSeq2SeqModelOutput(Seq2SeqModelOutput):
    """The bare model's output; `group_features` as the decoder's."""

    group_features: tuple[torch.Tensor, ...] | None = None


@dataclass
class LayerFusionSeq2SeqLMOutput(Seq2SeqLMOutput):
    """`Seq2SeqLMOutput` plus, on request (`return_group_log_probs=True`), each output group's log-probabilities
    (`group_log_probs`, shape `(groups, batch, length, vocab)`) and the mixture weights (`group_weights`)."""

    group_log_probs: torch.Tensor | None = None
    group_weights: torch.Tensor | None = None


@dataclass
class HeadOutput:
    """What `LayerFusionForConditionalGeneration.output_head` returns: the loss (with `labels`), the logits (None
    where a family's training loss needs no logits, e.g. GTrans' fused Eq. 7), and, on request
    (`return_group_log_probs=True`), every output group's log-probabilities `(groups, batch, length, vocab)` and the
    mixture weights."""

    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    group_log_probs: torch.Tensor | None = None
    group_weights: torch.Tensor | None = None
