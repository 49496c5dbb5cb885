"""Layer-wise coordination (He, Tan, Xia, He, Qin, Zhao, Liu, "Layer-Wise Coordination between Encoder and Decoder
for Neural Machine Translation", NeurIPS 2018; equations numbered as in `shared/papers/layerwise-coordination.txt`).

Encoder and decoder have the same number of layers N, and decoder layer i is coordinated with encoder layer i:
- **mixed attention** (Sec. 3, Eq. 3): target position t of decoder layer i attends with ONE attention over
  `[all source states of layer i-1 ; target states of layer i-1 at positions <= t]`, i.e. the source and the target
  prefix processed as one concatenated sequence with the mask
  `M(t, j) = 0 if j < n or j <= t + n, -inf otherwise` (n = source length, plus the source padding). It replaces the
  decoder's separate self- and cross-attention (decoder layout `"sf"`).
- **parameter sharing** (Sec. 3): encoder layer i and decoder layer i share their attention and feed-forward
  parameters, including the LayerNorms of the two residual blocks, so the model has one stack's parameters. The
  paper's small model (Sec. 4.2) stacks 14 shared layers at d 256, FFN 1024, 4 heads, about the parameters of the
  6 + 6 Transformer of that size (preset `layerwise_paper_small`; 19.07M with the IWSLT De-En vocabulary, Table 3).
- **resettable positions** (Sec. 3, "Position Embedding"): source positions start at 0 and target positions start
  at 0 again (sinusoidal), which is what the backbone's two position tables already do.
- **source/target embeddings**: one learned vector for the source language and one for the target language, added
  to every position (`LanguageEmbedding`, the connection at l = 0).

Generation: decoder layer i's source keys/values are computed from the encoder state once per input and kept in the
cross-attention slot of the cache (like encoder memory), the target part grows in the self-attention slot; beam
search reorders both (`EncoderDecoderCache`), so incremental decoding equals the full forward.

First target step (Sec. 4.3: "we append the source tokens with EOS, and then with SOS, and feed them into the model to
generate the first target token"): the source ends with EOS (as the tokenizers of this package encode it) and the
decoder starts from SOS: this family's start token is `bos_token_id` (`decoder_start_token`), so an unset
`decoder_start_token_id` is the bos id (0 by default), not EOS as in the other families. Give the config your
tokenizer's bos id (`examples/run_translation.py` gives the tokenizer's pad / bos / eos ids and leaves the start
token to the family).

Choices where the paper is silent (tested in tests/test_layerwise_coordination.py):
- decoder layer i reads encoder state s_{i-1} (the input of encoder layer i), so the source and target states a
  mixed attention reads are of the same depth; the output of the top encoder layer is read by no decoder layer, as
  in the paper's concatenated model, whose top-layer source outputs predict nothing (with sharing on its parameters
  are the top decoder layer's and get their gradient there; with sharing off they get none: train with
  `ddp_find_unused_parameters=True` on several GPUs);
- pre-norm (`normalize_before=True`): the source part goes through the same LayerNorm as the target part (the
  mixed-attention block's), i.e. with sharing on exactly what encoder layer i's self-attention read; with sharing on
  the two stacks' final LayerNorms are one (the concatenated sequence's), so every parameter gets a gradient;
- the language embedding is added after the embedding dropout (it is a connection at l = 0), and is initialised
  like the token embeddings (`embedding_init`);
- ablations (Table 3): `share_layer_parameters=False` builds separate decoder layers (the paper halves the layers);
  `mixed_attention=False` separates the mixed attention inside the shared layer into a causal self-attention (its
  own residual block) followed by a source-target attention over s_{i-1} (a second residual block): the paper says
  "as usual" and keeps the parameter count, so both attentions use the layer's attention parameters and the second
  block reuses the first block's LayerNorm (which in pre-norm also normalises s_{i-1}, as the mixed attention's
  does); `unshared_cross_attention=True` gives that source-target attention parameters and a LayerNorm of its own
  instead; `language_embeddings=False` drops the source/target embeddings; `position_embeddings=False` drops the
  position embeddings of both stacks (the paper does not say more; nothing replaces them).
  `layerwise_memory=False` (only with `mixed_attention=False`) makes every source-target attention read the top
  encoder layer: with sharing and language embeddings off and `unshared_cross_attention=True` this is exactly the
  plain Transformer, so `from_marian(..., model_type="layerwise_coordination", share_layer_parameters=False,
  mixed_attention=False, unshared_cross_attention=True, layerwise_memory=False, language_embeddings=False)`
  reproduces Marian's logits;
- dropout and the initialisation are the backbone's (the paper gives neither); the paper's beam 6 and length
  penalty 1.1 (Sec. 4.3) are generation settings (`generate(num_beams=6, length_penalty=1.1)`);
- attention implementations: eager and SDPA (the mixed mask is a materialised 4-D mask); flash and flex attention
  are not supported by this family;
- attention maps (`output_attentions=True`, eager): each decoder map spans the keys `[source ; target]` (one
  softmax) and `cross_attentions` is empty. transformers' assisted generation (`generate(assistant_model=...)`) cuts
  every decoder map to its first `target length` keys, assuming self-attention maps: the translations are exact, the
  maps it returns are not the mixed attention; inspect maps with a forward pass or plain `generate()`.
"""

from __future__ import annotations

import torch
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers.cache_utils import EncoderDecoderCache
from transformers.generation import GenerationMixin

from ..modeling.attention import LayerContext, MultiHeadAttention
from ..modeling.configuration import LayerFusionConfig
from ..modeling.extension_points import AttentionSublayer, Connection, FeedForwardSublayer, TopLayerReadout
from ..modeling.layers import CacheSlots
from ..modeling.model import LayerFusionForConditionalGeneration, LayerFusionModel
from ..modeling.presets import BACKBONE_PRESETS
from ..modeling.registry import register_family


@strict
class LayerwiseCoordinationConfig(LayerFusionConfig):
    r"""
    Layer-wise coordination configuration: the backbone keys of `LayerFusionConfig` plus

    Args:
        share_layer_parameters: encoder layer i and decoder layer i share their attention and feed-forward
            parameters and the LayerNorms of those blocks, and in pre-norm models the stacks' final LayerNorm (paper
            Sec. 3; False: Table 3 "w/o weight sharing", which the paper runs with half the layers). The two
            layers are two modules holding one set of tensors (tied, saved once), so PEFT gives each its own
            adapter, and `merge_and_unload()` adds both to the one weight: the merged model is not the adapted one
            (tests/test_adapters.py); keep adapters of a shared-layer model unmerged.
        mixed_attention: the decoder's one attention over [source states ; target prefix] (Eq. 3). False: Table 3
            "w/o mixed attention", the mixed attention separated "into self-attention and source-target attention as
            usual" inside the same layer: a causal self-attention over the target, then a source-target attention
            over the encoder state s_{i-1}, each a residual block, both computed with the layer's one set of
            attention parameters and its attention block's LayerNorm (two softmaxes, no parameter added, so Table
            3's parameter count is the full model's).
        unshared_cross_attention: only with `mixed_attention=False`: the source-target attention gets parameters
            and a LayerNorm of its own, never shared (the Transformer decoder's cross-attention; +4 d^2 + 6 d
            parameters per decoder layer, not the paper's ablation). With sharing, mixed attention and language
            embeddings off and `layerwise_memory=False` this is exactly the plain Transformer (`from_marian`).
        language_embeddings: learned source/target embeddings added to every position (False: Table 3 "w/o
            source/target embedding").
        position_embeddings: add the (resettable) position embeddings (False: Table 3 "w/o position embedding";
            tokens then carry no position at all).
        layerwise_memory: decoder layer i reads encoder state s_{i-1}; False (only with `mixed_attention=False`):
            every source-target attention reads the top encoder layer, as in the plain Transformer.

    `encoder_layers` must equal `decoder_layers`; with sharing on the encoder and decoder attention heads and
    feed-forward sizes must be equal too. `decoder_start_token_id` defaults to `bos_token_id` (the paper's SOS after
    the source's EOS; see the module docstring). `LayerwiseCoordinationConfig.from_preset("layerwise_paper_small")`
    is the paper's small model (Sec. 4.2: 14 shared layers, d 256, FFN 1024, 4 heads, about the parameters of the
    6 + 6 Transformer of that size); the backbone's defaults fill what the paper does not give (dropout 0.1).

    A config.json saved before `unshared_cross_attention` existed with `mixed_attention=False` loads with
    `unshared_cross_attention=True`, the model it was trained as; one without `position_embeddings` loads with them.
    """

    model_type = "layerwise_coordination"
    decoder_start_token = "bos_token_id"
    # Sec. 4.2's small configuration (d 256, FFN 1024, 4 heads: the backbone's `multi30k` size), 14 shared layers
    family_presets = {
        "layerwise_paper_small": {**BACKBONE_PRESETS["multi30k"], "encoder_layers": 14, "decoder_layers": 14},
    }

    share_layer_parameters: bool = True
    mixed_attention: bool = True
    unshared_cross_attention: bool = False
    language_embeddings: bool = True
    position_embeddings: bool = True
    layerwise_memory: bool = True

    @classmethod
    def upgrade_saved_config(cls, config_dict: dict) -> dict:
        # until `unshared_cross_attention` existed, `mixed_attention=False` built a cross-attention of its own
        if config_dict.get("mixed_attention") is False and "unshared_cross_attention" not in config_dict:
            return {**config_dict, "unshared_cross_attention": True}
        return config_dict

    def check_consistency(self) -> None:
        super().check_consistency()
        if self.encoder_layers != self.decoder_layers:
            raise ValueError(
                f"Layer-wise coordination pairs encoder layer i with decoder layer i: `encoder_layers` "
                f"({self.encoder_layers}) must equal `decoder_layers` ({self.decoder_layers})."
            )
        if self.share_layer_parameters:
            for encoder_name, decoder_name in (
                ("encoder_attention_heads", "decoder_attention_heads"),
                ("encoder_ffn_dim", "decoder_ffn_dim"),
            ):
                if getattr(self, encoder_name) != getattr(self, decoder_name):
                    raise ValueError(
                        f"`share_layer_parameters=True` shares encoder and decoder layers: `{encoder_name}` "
                        f"({getattr(self, encoder_name)}) must equal `{decoder_name}` ({getattr(self, decoder_name)})."
                    )
        if self.mixed_attention and not self.layerwise_memory:
            raise ValueError(
                "`layerwise_memory=False` (cross-attention reads the top encoder layer) needs "
                "`mixed_attention=False`: the mixed attention reads the encoder layer parallel to its decoder layer."
            )
        if self.mixed_attention and self.unshared_cross_attention:
            raise ValueError(
                "`unshared_cross_attention=True` gives the source-target attention of `mixed_attention=False` "
                "parameters of its own; with `mixed_attention=True` there is no such attention."
            )

    @property
    def decoder_layer_layouts(self) -> list[str]:
        """Mixed attention replaces self- and cross-attention: `"sf"`; without it the usual `"scf"`."""
        return ["sf" if self.mixed_attention else "scf"] * self.decoder_layers

    @property
    def uses_position_embeddings(self) -> bool:
        return self.position_embeddings


def mixed_attention_mask(
    source_mask: torch.Tensor | None,
    target_mask: torch.Tensor | None,
    batch_size: int,
    query_length: int,
    source_length: int,
    target_length: int,
    dtype: torch.dtype,
    device: torch.device,
    additive: bool,
) -> torch.Tensor:
    """Eq. 3 with padding: the 4-D mask `(batch, 1, queries, source + target)` = `[source padding ; causal]`.

    The parts come as transformers' mask functions build them for the attention implementation: additive float
    masks (0 / dtype min) for eager (`additive=True`), boolean masks (True = attend) for SDPA, or None where nothing
    needs masking (no source padding; plain causal attention without padding, which SDPA would run as `is_causal`).
    A None part is materialised, with the causal part's queries being the last `query_length` target positions.
    """
    parts = []
    for mask, length, causal in ((source_mask, source_length, False), (target_mask, target_length, True)):
        if mask is None:
            if causal:
                keys = torch.arange(length, device=device)
                queries = torch.arange(length - query_length, length, device=device)
                allowed = keys[None, :] <= queries[:, None]
            else:
                allowed = torch.ones(query_length, length, dtype=torch.bool, device=device)
            mask = allowed if not additive else torch.zeros((), dtype=dtype, device=device).masked_fill(
                ~allowed, torch.finfo(dtype).min
            )
        parts.append(mask.expand(batch_size, 1, query_length, length))
    return torch.cat(parts, dim=-1)


def memory_keys_values(attention: MultiHeadAttention, context: LayerContext) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys/values of the encoder state a decoder layer reads (`context.memory`), normalised like the sub-layer's own
    input (`context.normalize`: the block's pre-norm LayerNorm, identity in post-norm), computed once per input and
    kept in the attention's cross-attention cache slot."""
    cache = context.cache
    if isinstance(cache, EncoderDecoderCache) and cache.is_updated.get(attention.layer_idx, False):
        memory = context.memory  # keys/values come from the cache; the memory is not read (nor normalised) again
    else:
        memory = context.normalize(context.memory)
    return attention.project_keys_values(memory, cache, static_keys=True)


class MixedAttention(MultiHeadAttention, decoding_step="self"):
    """The decoder's `s` sub-layer with mixed attention (Eq. 3): queries from the target states of layer i-1, keys
    and values from `[source states of layer i-1 ; target states of layer i-1 up to the query]`, one softmax.

    The source part (`context.memory`, the encoder state s_{i-1}) goes through the block's input normalisation
    (`context.normalize`, pre-norm LayerNorm) like the target part, and its keys/values are computed once per input
    and kept in this module's cross-attention cache slot; the target part grows in its self-attention slot. A
    decoding step is the `"self"` form: attention over its slot [source ; target so far], the source (the slot's
    prefix) masked by the memory mask.
    """

    accepts_key_groups = False  # the source keys are concatenated with each row's own target keys

    def forward(self, hidden_states: torch.Tensor, context: LayerContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        if context.memory is None:
            raise ValueError(
                "The layer-wise coordination decoder attends over the source and the target together (mixed "
                "attention): call it with the encoder's outputs (`encoder_hidden_states` and "
                "`encoder_layer_memories`)."
            )
        source_keys, source_values = memory_keys_values(self, context)
        # [source ; target] keys/values (the source part first, as a prefix of the cached target part)
        keys, values = self.project_keys_values(
            hidden_states, context.cache, prefix=(source_keys, source_values)
        )
        batch_size, query_length = hidden_states.shape[:2]
        mask = mixed_attention_mask(
            context.memory_mask,
            context.attention_mask,
            batch_size,
            query_length,
            source_keys.shape[2],
            keys.shape[2] - source_keys.shape[2],
            hidden_states.dtype,
            hidden_states.device,
            additive=self.config._attn_implementation == "eager",
        )
        return self.attend_to(hidden_states, keys, values, mask, **context.attention_kwargs)


class LayerwiseCrossAttention(MultiHeadAttention, decoding_step="memory"):
    """The `c` sub-layer of the `mixed_attention=False` ablation: attention over the per-layer encoder state s_{i-1},
    normalised like its own input (pre-norm; the plain model's top-layer memory is normalised by the encoder). Its
    parameters are the layer's self-attention's unless `unshared_cross_attention` (`_tied_weights_keys`). A decoding
    step is the `"memory"` form: attention over the keys/values of s_{i-1} kept since the first step."""

    def forward(self, hidden_states: torch.Tensor, context: LayerContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        keys, values = memory_keys_values(self, context)
        return self.attend_to(hidden_states, keys, values, context.memory_mask, **context.attention_kwargs)


class LayerwiseMemoryReadout(TopLayerReadout):
    """Decoder layer i (1-based) reads encoder state s_{i-1}, the input of encoder layer i."""

    def layer_memories(self, states: list[torch.Tensor]) -> torch.Tensor:
        return torch.stack(states[:-1], dim=1)


class LanguageEmbedding(Connection, changes_only_embeddings=True):
    """The connection at l = 0: adds the learned source (encoder) or target (decoder) embedding to every position
    (Sec. 3, "Source/Target Embedding"); position-wise, so KV caching is unaffected. Initialised like the token
    embeddings (an `nn.Embedding` with one row). It changes s_0 alone (`changes_only_embeddings`): the fast path runs
    a decoding step's layers in one compiled call after it."""

    def __init__(self, config: LayerwiseCoordinationConfig):
        super().__init__()
        self.language_embedding = nn.Embedding(1, config.d_model)

    def forward(self, layer_idx: int, output: torch.Tensor, states: list[torch.Tensor]) -> torch.Tensor:
        return output + self.language_embedding.weight[0] if layer_idx == 0 else output


# the sub-layers (and their residual blocks) decoder layer i shares with encoder layer i, by `TransformerLayer` name
SHARED_SUBLAYERS = ("self_attn", "self_attn_block", "ffn", "ffn_block")
# without mixed attention (and unless `unshared_cross_attention`), the source-target attention sub-layer and its
# block are computed with the parameters of the layer's self-attention and its block
CROSS_ATTENTION_PARAMETERS = {"encoder_attn": "self_attn", "encoder_attn_block": "self_attn_block"}


class LayerwiseCoordinationModel(LayerFusionModel):
    config_class = LayerwiseCoordinationConfig
    # the mixed attention needs a materialised 4-D mask
    _supports_flash_attn = False
    _supports_flex_attn = False

    def build_readout(self, config: LayerwiseCoordinationConfig, is_decoder: bool) -> TopLayerReadout:
        return LayerwiseMemoryReadout() if config.layerwise_memory and not is_decoder else TopLayerReadout()

    def build_connection(self, config: LayerwiseCoordinationConfig, is_decoder: bool) -> Connection | None:
        return LanguageEmbedding(config) if config.language_embeddings else None

    def build_sublayer(
        self, config: LayerwiseCoordinationConfig, is_decoder: bool, kind: str, layer_idx: int, cache_slots: CacheSlots
    ) -> AttentionSublayer | FeedForwardSublayer:
        if is_decoder and kind == "s" and config.mixed_attention:
            return MixedAttention(config, config.decoder_attention_heads, is_causal=True, layer_idx=cache_slots.next_self())
        if is_decoder and kind == "c" and config.layerwise_memory:
            return LayerwiseCrossAttention(config, config.decoder_attention_heads, layer_idx=cache_slots.next_cross())
        return super().build_sublayer(config, is_decoder, kind, layer_idx, cache_slots)

    @property
    def _tied_weights_keys(self) -> dict[str, str]:
        """The embedding ties plus the parameters a decoder layer computes with but does not own:

        - with sharing on, every parameter of decoder layer i's self-attention (mixed or causal), feed-forward
          network and their blocks' LayerNorms is the same parameter of encoder layer i (Sec. 3: with sharing a
          decoder layer is its encoder layer), and in pre-norm models the decoder's final LayerNorm is the encoder's
          (the concatenated sequence of the paper passes through one; the encoder's own output is read by no
          decoder layer, so unshared it would never get a gradient);
        - without mixed attention, the source-target attention and its block's LayerNorm are the layer's
          self-attention and its block's (unless `unshared_cross_attention`).

        The decoder layers are built with parameters of their own and `tie_weights()` (run by `post_init` and
        `from_pretrained`) makes them the sources', the way transformers ties embeddings: each tied tensor is saved
        once and tied back on load, and a source tensor is never mistaken for an already-initialised tie target."""
        config = self.config
        tied = dict(LayerFusionModel._tied_weights_keys)
        encoder_names = {name for name, _ in self.encoder.layers.named_parameters()}
        for name, _ in self.decoder.layers.named_parameters(remove_duplicate=False):
            layer_idx, sublayer, rest = name.split(".", 2)
            if not config.unshared_cross_attention and sublayer in CROSS_ATTENTION_PARAMETERS:
                sublayer = CROSS_ATTENTION_PARAMETERS[sublayer]
            source = f"{layer_idx}.{sublayer}.{rest}"
            if config.share_layer_parameters and sublayer in SHARED_SUBLAYERS and source in encoder_names:
                tied[f"decoder.layers.{name}"] = f"encoder.layers.{source}"
            elif source != name:
                tied[f"decoder.layers.{name}"] = f"decoder.layers.{source}"
        if config.share_layer_parameters and config.normalize_before:
            for name in ("weight", "bias"):
                tied[f"decoder.layer_norm.{name}"] = f"encoder.layer_norm.{name}"
        return tied


@register_family
class LayerwiseCoordinationForConditionalGeneration(LayerFusionForConditionalGeneration, GenerationMixin):
    """Layer-wise coordination with the tied output projection of the backbone (one output group)."""

    config_class = LayerwiseCoordinationConfig
    model_class = LayerwiseCoordinationModel
    _supports_flash_attn = False
    _supports_flex_attn = False
