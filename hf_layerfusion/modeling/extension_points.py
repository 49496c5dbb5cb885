"""The backbone's extension points: the base classes of what a family may replace, with the methods the backbone
calls, and the plain Transformer's choice of each.

`LayerFusionModel` builds both stacks through its builders, which a family overrides (`hf_layerfusion.modeling`):

- `build_readout(config, is_decoder)` returns an `EncoderReadout` for the encoder and a `DecoderReadout` for the
  decoder. Readouts receive the states `[s_0 .. s_L]` (s_0 = embeddings; in pre-norm models s_1..s_L pass through the
  stack's final LayerNorm) and report their learned fusion weights as the papers plot them (`fusion_weights()`,
  logged by `hf_layerfusion.training.callbacks.FusionWeightsCallback`). A `FusedStateReadout` fuses the states into one
  tensor and serves either stack; `TopLayerReadout` is the plain Transformer's;
- `build_connection(config, is_decoder)` returns a `Connection`, or None for the plain stack (s_l = layer l's output);
- `build_sublayer(config, is_decoder, kind, layer_idx, cache_slots)` returns an `AttentionSublayer` for `s` / `c` and
  a `FeedForwardSublayer` for `f`; an attention sub-layer reads what it needs from the `LayerContext`.

The stacks and layers check what the builders return against these classes. A module that holds fusion parameters
(gates, mixing weights, scales) directly is also a `FusionParameters`. The output head, the fourth extension point, is
`LayerFusionForConditionalGeneration.output_head`, which returns a `HeadOutput` (`hf_layerfusion.modeling.outputs`),
and `extra_loss` there adds a family's term to the loss.

The fast path (`hf_layerfusion.inference`: `fast_generate` and its inference copies) runs every family through these
same modules, so a family's Python path runs in the fast decoding loop as it is. What the copies run as compiled
kernels instead is declared here, each with a default that runs the family's Python path:

- a sub-layer's decoding step: the class keyword `decoding_step=` of a `Sublayer` (one of `DECODING_STEP_FORMS`),
  read through `Sublayer.decoding_step()`. It is the class's own declaration, never inherited: a subclass that does
  not declare one runs its Python forward at decoding steps too (it may compute something else than its parent);
- a connection that changes the embeddings alone: the class keyword `changes_only_embeddings=True` of a
  `Connection`, read through `Connection.changes_only_embeddings()` (never inherited either); a stack with another
  connection runs a step's layers one by one, the connection between them;
- the output head's projection and group mixture: `LayerFusionForConditionalGeneration.project` (h W_o + b),
  `project_output_groups` (several output groups' logits at once, read before the head returns: the copies write
  them into memory kept across steps) and `mix_output_groups` (`probability_mixture` of several output groups'
  distributions, GTrans' Eq. 5), which read what an inference copy hands them through
  `LayerFusionForConditionalGeneration.set_output_kernels` (None by default: the torch operations). A family whose
  head calls them gets the copies' kernels; one that overrides them runs its override.

Nothing else is looked up by name: the copies replace `nn.Linear` layers and the backbone's `ResidualSublayer` blocks
by their types (folding a ReLU into the first layer of a module whose forward is `FeedForward`'s), set the attention
implementation, and change nothing else of a family's modules. docs/adding_a_family.md ("The fast path") says what a
family gets for free, what it may declare, and the tests that hold its fast path to `generate()`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache


# --------------------------------------------------------------------------------------------------- sub-layers
@dataclass
class LayerContext:
    """What a layer's sub-layers may read besides their input, for one layer of one stack forward.

    - `attention_mask`: the stack's self-attention mask (bidirectional in the encoder, causal in the decoder);
    - `memory`, `memory_mask`: the encoder memory this decoder layer reads (None in the encoder, and in a decoder
      called without encoder states), with its mask;
    - `cache`: the decoder's cache (None in the encoder);
    - `lower_states`: `[s_0 .. s_{l-1}]`, the states of the layers below (s_0 = embeddings; s_{l-1} is this layer's
      input), for attention that reads lower layers (multi-layer attention);
    - `attention_kwargs`: passed through to the attention interface;
    - `normalize`: what the running sub-layer's residual block does to its input before the sub-layer (its
      LayerNorm in pre-norm models, the identity in post-norm ones), for attention that also reads states other than
      its input (the memory, lower states) and must see them as it sees its input (set per sub-layer by the layer).
    """

    attention_mask: torch.Tensor | None
    memory: torch.Tensor | None
    memory_mask: torch.Tensor | None
    cache: Cache | None
    lower_states: Sequence[torch.Tensor]
    attention_kwargs: dict
    normalize: Callable[[torch.Tensor], torch.Tensor] | None = None


class Sublayer(nn.Module):
    """What the two sub-layer extension points share: the declaration of their compiled decoding step.

    A class declares the form of `DECODING_STEP_FORMS` its forward computes at a decoding step with the class keyword
    `decoding_step`, e.g. `class CrossAttention(MultiHeadAttention, decoding_step="memory")`; the inference copies
    then run that step of a residual block around it as one compiled call (the same kernels on the same views as the
    Python path, so the same numbers). The declaration belongs to the class that makes it: a subclass that does not
    repeat it declares none (its forward may compute something else than its parent's) and runs its Python forward
    at every step, which is always correct, only slower. A form of the other extension point, or an unknown one, is
    refused when the class is defined."""

    _declared_decoding_step: ClassVar[str | None] = None

    def __init_subclass__(cls, decoding_step: str | None = None, **kwargs):
        super().__init_subclass__(**kwargs)
        if decoding_step is not None:
            point = DECODING_STEP_FORMS.get(decoding_step) if isinstance(decoding_step, str) else None
            if point is None or not issubclass(cls, point):
                forms = sorted(form for form, owner in DECODING_STEP_FORMS.items() if issubclass(cls, owner))
                raise TypeError(
                    f"{cls.__name__}: decoding_step={decoding_step!r} is not a decoding step form of its extension "
                    f"point (this class may declare {forms or 'none'}: extension_points.DECODING_STEP_FORMS)."
                )
        cls._declared_decoding_step = decoding_step  # set on every class: never inherited

    def decoding_step(self) -> str | None:
        """The decoding step form this sub-layer's own class declares (`decoding_step=`), or None: its Python forward
        runs at decoding steps."""
        return type(self)._declared_decoding_step


class AttentionSublayer(Sublayer):
    """An `s` or `c` sub-layer. Every attention of the package is a `MultiHeadAttention`
    (`hf_layerfusion.modeling.attention`), whose weights transformers' output capture records as `attentions` /
    `cross_attentions`. A class may declare the decoding step `"self"` or `"memory"` (`Sublayer`); the fast path
    compiles it where the module has `MultiHeadAttention`'s projections (`q_proj`, `k_proj`, `v_proj`, `out_proj`),
    `head_dim`, `scaling` and cache slot `layer_idx`."""

    def forward(
        self, hidden_states: torch.Tensor, context: LayerContext
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(output, attention weights or None)` of the sub-layer's normalised input (pre-norm: after its residual
        block's LayerNorm), reading what else it needs from `context`."""
        raise NotImplementedError


class FeedForwardSublayer(Sublayer):
    """An `f` sub-layer. A class may declare the decoding step `"feed_forward"` (`Sublayer`): `fc2(act(fc1(x)))`
    with `FeedForward`'s `fc1`, `activation_fn`, `fc2`."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """The output of the sub-layer's normalised input."""
        raise NotImplementedError


# What one step of the fast decoding loop (`hf_layerfusion.inference`: one new position per row, the decoder's cache
# holding the earlier ones) computes, in the forms the inference copies run as one compiled call
# (kernels/decoding_step.cpp), with the extension point whose classes may declare each (`Sublayer`)
DECODING_STEP_FORMS: dict[str, type[Sublayer]] = {
    # attention over its own self-attention cache slot (the keys/values of every position so far, after a prefix if
    # the slot has one, the prefix masked by the memory mask), with `MultiHeadAttention`'s projections
    "self": AttentionSublayer,
    # attention over the keys/values of the memory, kept in its cross-attention slot since the first step, with the
    # memory mask, with `MultiHeadAttention`'s projections
    "memory": AttentionSublayer,
    # fc2(act(fc1(x))) with `FeedForward`'s layers (compiled where act is ReLU)
    "feed_forward": FeedForwardSublayer,
}


# --------------------------------------------------------------------------------------------------- connections
class Connection(nn.Module):
    """What layer l+1 of a stack receives: the state s_l.

    A class whose s_l is layer l's output unchanged for every l >= 1 (it changes the embeddings alone, l = 0)
    declares it with the class keyword `changes_only_embeddings=True`, e.g. layer-wise coordination's language
    embedding; the inference copies then run a decoding step's layers as one compiled call, the connection applied to
    the embeddings before it. Like a sub-layer's decoding step the declaration belongs to the class that makes it (a
    subclass may connect its layers otherwise): without one, every step's layers run through `run_layers`, the
    connection called between them, which is always correct."""

    _declared_changes_only_embeddings: ClassVar[bool] = False

    def __init_subclass__(cls, changes_only_embeddings: bool = False, **kwargs):
        super().__init_subclass__(**kwargs)
        if not isinstance(changes_only_embeddings, bool):
            raise TypeError(
                f"{cls.__name__}: changes_only_embeddings must be True or False, got {changes_only_embeddings!r}."
            )
        cls._declared_changes_only_embeddings = changes_only_embeddings  # set on every class: never inherited

    def changes_only_embeddings(self) -> bool:
        """Whether this connection's own class declares that it changes s_0 (the embeddings) alone."""
        return type(self)._declared_changes_only_embeddings

    def forward(self, layer_idx: int, output: torch.Tensor, states: Sequence[torch.Tensor]) -> torch.Tensor:
        """s_l from layer l's output and the states `[s_0 .. s_{l-1}]` below it; l = 0 is the embedding output
        (`output` the embeddings, `states` empty)."""
        raise NotImplementedError


# --------------------------------------------------------------------------------------------------- readouts
class Readout(nn.Module):
    """What both readouts have: the fusion weights the papers plot."""

    def fusion_weights(self) -> dict[str, torch.Tensor]:
        """`{name: 1-D tensor}`, with the transforms of the paper (sigmoid gates, softmax mixtures); empty without
        fusion weights."""
        return {}


class EncoderReadout(Readout):
    """The encoder's readout: what cross-attention reads."""

    def memory(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        """The memory every cross-attention reads, `(batch, source, d_model)`."""
        raise NotImplementedError

    def layer_memories(self, states: Sequence[torch.Tensor]) -> torch.Tensor | None:
        """One memory per decoder layer, `(batch, decoder_layers, source, d_model)` (batch first, so that beam search
        expands it like the memory), or None: every decoder layer reads `memory`. It receives the states as the
        layers produced them (pre-norm: before the final LayerNorm; the decoder sub-layer reading them normalises them
        through `LayerContext.normalize`)."""
        return None


class DecoderReadout(Readout):
    """The decoder's readout: one feature per output group, which the output head turns into logits and loss."""

    num_groups = 1

    def group_features(self, states: Sequence[torch.Tensor], groups: Sequence[int]) -> tuple[torch.Tensor, ...]:
        """The feature of each requested 1-based output group, in the order of `groups`."""
        raise NotImplementedError

    def num_layers_needed(self, groups: Sequence[int], num_layers: int) -> int:
        """How many of the stack's `num_layers` layers the requested groups read; the decoder computes no layer above
        them (GTrans pruning). Default: all."""
        return num_layers


class FusedStateReadout(EncoderReadout, DecoderReadout):
    """A readout that fuses a stack's states into one tensor: the memory of an encoder, the single output group of a
    decoder."""

    def fuse(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError

    def memory(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        return self.fuse(states)

    def group_features(self, states: Sequence[torch.Tensor], groups: Sequence[int]) -> tuple[torch.Tensor, ...]:
        return (self.fuse(states),)


class TopLayerReadout(FusedStateReadout):
    """The plain Transformer's readout of either stack: the top layer."""

    def fuse(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        return states[-1]


# --------------------------------------------------------------------------------------------------- output head
def probability_mixture(group_logits: torch.Tensor, psi: torch.Tensor) -> torch.Tensor:
    """The mixture of several output groups' distributions in probability space (GTrans' Eq. 5),
    log sum_g psi_g softmax(z_g), from the group logits `(groups, ..., vocab)` and the groups' weights `psi`
    `(groups,)`: one softmax per group, one weighted sum; the clamp at the smallest normal float keeps the log finite
    for tokens whose probability underflows in every group. What
    `LayerFusionForConditionalGeneration.mix_output_groups` computes, unless an inference copy handed it the compiled
    kernel of the same function (kernels/mixture_log_probs.cpp, float rounding apart)."""
    mixture = torch.tensordot(psi, F.softmax(group_logits, dim=-1), dims=1)
    return mixture.clamp_min(torch.finfo(mixture.dtype).tiny).log()


# --------------------------------------------------------------------------------------------------- parameters
class FusionParameters(nn.Module):
    """A module that holds fusion parameters (gates, mixing weights, scales) directly; its LayerNorms and feed-forward
    networks are sub-modules, initialised as such. `LayerFusionPreTrainedModel._init_weights` calls
    `init_fusion_weights`, and `LayerFusionSeq2SeqTrainer` keeps the parameters these modules hold directly out of
    weight decay unless `config.decay_fusion_weights` (`LayerFusionPreTrainedModel.fusion_parameter_names`)."""

    def init_fusion_weights(self) -> None:
        """Set the fusion parameters as the paper initialises them."""
        raise NotImplementedError
