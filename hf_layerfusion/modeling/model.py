"""The bare encoder-decoder (`LayerFusionModel`, whose builders are the families' extension points) and the
encoder-decoder with the LM head (`LayerFusionForConditionalGeneration`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import BaseModelOutput
from transformers.utils import can_return_tuple

from ..compat import accepts_either_cache_name, cache_field, output_cache
from .attention import CrossAttention, MultiHeadAttention
from .configuration import LayerFusionConfig
from .input_checks import check_generation_arguments, check_labels
from .extension_points import (
    AttentionSublayer,
    Connection,
    DecoderReadout,
    EncoderReadout,
    FeedForwardSublayer,
    TopLayerReadout,
    probability_mixture,
)
from .layers import CacheSlots, FeedForward, TransformerLayer
from .outputs import HeadOutput, LayerFusionEncoderOutput, LayerFusionSeq2SeqLMOutput, LayerFusionSeq2SeqModelOutput
from .pretrained import LayerFusionPreTrainedModel
from .stacks import LayerFusionDecoder, LayerFusionEncoder


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher-forcing decoder input: labels shifted one step right, `-100` replaced by the pad id."""
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill_(shifted == -100, pad_token_id)


class LayerFusionModel(LayerFusionPreTrainedModel):
    """Bare encoder-decoder (no LM head). A family overrides the builders below; each returns a module of its extension
    point (`hf_layerfusion.modeling.extension_points`), and the stacks check that it does."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: LayerFusionConfig):
        super().__init__(config)
        config.check_consistency()  # attributes may have been changed after the config was built
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = LayerFusionEncoder(
            config,
            nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id),
            self.build_readout(config, is_decoder=False),
            self.build_layers(config, is_decoder=False),
            self.build_connection(config, is_decoder=False),
        )
        self.decoder = LayerFusionDecoder(
            config,
            nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id),
            self.build_readout(config, is_decoder=True),
            self.build_layers(config, is_decoder=True),
            self.build_connection(config, is_decoder=True),
        )
        self.post_init()

    # ---- family extension points
    def build_readout(self, config: LayerFusionConfig, is_decoder: bool) -> EncoderReadout | DecoderReadout:
        """The `EncoderReadout` of the encoder or the `DecoderReadout` of the decoder (plain: the top layer)."""
        return TopLayerReadout()

    def build_connection(self, config: LayerFusionConfig, is_decoder: bool) -> Connection | None:
        """The stack's `Connection`, or None for the plain stack (s_l = layer l's output)."""
        return None

    def build_sublayer(
        self, config: LayerFusionConfig, is_decoder: bool, kind: str, layer_idx: int, cache_slots: CacheSlots
    ) -> AttentionSublayer | FeedForwardSublayer:
        """The `AttentionSublayer` of an `s` / `c` sub-layer or the `FeedForwardSublayer` of an `f` sub-layer of layer
        `layer_idx` (0-based); decoder attentions that keep keys/values take their slot from `cache_slots`."""
        heads = config.decoder_attention_heads if is_decoder else config.encoder_attention_heads
        if kind == "s":
            slot = cache_slots.next_self() if is_decoder else layer_idx
            return MultiHeadAttention(config, heads, is_causal=is_decoder, layer_idx=slot)
        if kind == "c":
            if not is_decoder:
                raise ValueError("A cross-attention sub-layer ('c') can only be part of a decoder layer layout.")
            return CrossAttention(config, heads, layer_idx=cache_slots.next_cross())
        return FeedForward(config, config.decoder_ffn_dim if is_decoder else config.encoder_ffn_dim)

    def build_layers(self, config: LayerFusionConfig, is_decoder: bool) -> list[TransformerLayer]:
        layouts = config.decoder_layer_layouts if is_decoder else config.encoder_layer_layouts
        cache_slots = CacheSlots()
        layers = [
            TransformerLayer(
                config,
                layout,
                lambda kind, layer_idx=layer_idx: self.build_sublayer(config, is_decoder, kind, layer_idx, cache_slots),
            )
            for layer_idx, layout in enumerate(layouts)
        ]
        used = max(cache_slots.self_attention, cache_slots.cross_attention)
        if is_decoder and used != config.decoder_cache_layers:
            raise ValueError(
                f"{type(config).__name__}.decoder_cache_layers is {config.decoder_cache_layers} but the decoder's "
                f"attention sub-layers use {used} cache slots; the family config must report what it builds."
            )
        return layers

    # ----
    def get_input_embeddings(self):
        return self.shared

    def set_input_embeddings(self, value):
        self.shared = value
        self.encoder.embed_tokens = value
        self.decoder.embed_tokens = value

    def get_encoder(self):
        return self.encoder

    def get_decoder(self):
        return self.decoder

    @accepts_either_cache_name
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        decoder_groups: Sequence[int] | None = None,
        **kwargs,
    ) -> LayerFusionSeq2SeqModelOutput:
        output_attentions = kwargs.get("output_attentions", self.config.output_attentions)
        if output_attentions and self.config._attn_implementation not in ("eager", None):
            raise ValueError(
                f"output_attentions=True needs attn_implementation='eager' (this model uses "
                f"{self.config._attn_implementation!r}, which returns no weights): call "
                "`model.set_attn_implementation('eager')` or load with attn_implementation='eager'."
            )
        if encoder_outputs is None:
            # the stacks' outputs are read by name here whatever `config.return_dict` says (the caller's choice of a
            # tuple is made once, by `can_return_tuple` on the way out)
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, return_dict=True,
                **kwargs,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):  # a tuple (`return_dict=False`)
            encoder_outputs = LayerFusionEncoderOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        elif not isinstance(encoder_outputs, LayerFusionEncoderOutput):  # another encoder's: no per-layer memories
            encoder_outputs = LayerFusionEncoderOutput(
                last_hidden_state=encoder_outputs.last_hidden_state,
                hidden_states=encoder_outputs.hidden_states,
                attentions=encoder_outputs.attentions,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            encoder_layer_memories=encoder_outputs.layer_memories,
            cache=cache,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            groups=decoder_groups,
            return_dict=True,
            **kwargs,
        )
        return LayerFusionSeq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            group_features=decoder_outputs.group_features,
            **cache_field(output_cache(decoder_outputs)),
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


def token_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, label_smoothing: float, num_items_in_batch: int | torch.Tensor | None
) -> torch.Tensor:
    """Label-smoothed token cross entropy, pads (`-100`) ignored; the same reduction as HF's `LabelSmoother`:
    summed over tokens and divided by `num_items_in_batch` when the Trainer passes it, else by this batch's
    non-pad token count. `logits` may also be normalised log-probabilities (log_softmax is idempotent)."""
    loss = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]).float(),
        labels.reshape(-1),
        ignore_index=-100,
        label_smoothing=label_smoothing,
        reduction="sum",
    )
    if num_items_in_batch is None:
        num_items_in_batch = labels.ne(-100).sum().clamp(min=1)
    elif torch.is_tensor(num_items_in_batch):
        num_items_in_batch = num_items_in_batch.to(loss.device)
    return loss / num_items_in_batch


class LayerFusionForConditionalGeneration(LayerFusionPreTrainedModel, GenerationMixin):
    """Encoder-decoder with the tied output projection `W_o` and Marian's `final_logits_bias`.

    A family changes what this class computes through
    - `output_head`, which maps the decoder's output-group features to a `HeadOutput` (logits and loss); the base
      handles the single-group (plain Transformer) case, families with several groups override it;
    - `extra_loss`, a term added to the head's loss when `labels` are given, with the diagnostics it reports
      (fields of the family's `output_class`; `training_diagnostics` names the scalar ones the trainer logs).

    The output head computes its logits with `project` (several output groups' at once with `project_output_groups`)
    and mixes several output groups with `mix_output_groups`: the torch operations, or what an inference copy handed
    them (`set_output_kernels`: the fast path's compiled projection and mixture,
    `hf_layerfusion.modeling.extension_points`).
    """

    model_class = LayerFusionModel
    output_class: ClassVar[type[LayerFusionSeq2SeqLMOutput]] = LayerFusionSeq2SeqLMOutput
    # scalar fields of `output_class` that `LayerFusionSeq2SeqTrainer` logs as their means between two logs
    training_diagnostics: ClassVar[tuple[str, ...]] = ()
    _tied_weights_keys = {
        "lm_head.weight": "model.shared.weight",
        "model.encoder.embed_tokens.weight": "model.shared.weight",
        "model.decoder.embed_tokens.weight": "model.shared.weight",
    }

    def __init__(self, config: LayerFusionConfig):
        super().__init__(config)
        self.model = self.model_class(config)
        self.final_logits_bias = nn.Buffer(torch.zeros((1, config.vocab_size)))
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        # what `project`, `project_output_groups` and `mix_output_groups` run instead of their torch operations
        # (`set_output_kernels`)
        self.output_projection: nn.Module | None = None
        self.output_groups_projection: nn.Module | None = None
        self.output_mixture_kernel: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None] | None = None
        self.post_init()

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if module is self:
            init.zeros_(self.final_logits_bias)  # Marian's logits bias starts at zero

    def get_output_embeddings(self):
        return self.lm_head

    def set_output_embeddings(self, new_embeddings):
        self.lm_head = new_embeddings

    def get_encoder(self):
        return self.model.encoder

    def get_decoder(self):
        return self.model.decoder

    def resize_token_embeddings(self, new_num_tokens=None, pad_to_multiple_of=None, mean_resizing=True):
        embeddings = super().resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        # Marian's final_logits_bias follows the vocabulary: keep old entries, zeros for new tokens
        old_bias, new_size = self.final_logits_bias, embeddings.weight.shape[0]
        new_bias = old_bias.new_zeros((1, new_size))
        new_bias[:, : min(new_size, old_bias.shape[1])] = old_bias[:, :new_size]
        self.final_logits_bias = nn.Buffer(new_bias)
        return embeddings

    def _reorder_cache(self, cache: Cache, beam_idx: torch.LongTensor) -> Cache:
        """Beam search (`generate()` calls this hook when a model defines it): reorder the self-attention keys/values
        only. The cross-attention slots hold keys/values computed from the encoder output alone, the same for every
        beam of a sentence (beam indices never leave their sentence), so reordering them, as
        `EncoderDecoderCache.reorder_cache` does, would copy every slot into an equal one at each step."""
        if isinstance(cache, EncoderDecoderCache):
            cache.self_attention_cache.reorder_cache(beam_idx)
        else:
            cache.reorder_cache(beam_idx)
        return cache

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def generate(self, inputs=None, generation_config=None, **kwargs):
        """`GenerationMixin.generate`, its search settings checked first (`check_generation_arguments`)."""
        check_generation_arguments(kwargs, generation_config or self.generation_config)
        return super().generate(inputs, generation_config, **kwargs)

    # ---- the output head's fast-path hooks (hf_layerfusion.modeling.extension_points)
    def project(self, features: torch.Tensor) -> torch.Tensor:
        """`h W_o + b`: the vocabulary logits of one feature tensor; through `output_projection` where an inference
        copy set one (`set_output_kernels`). It calls `lm_head` as a module, as Marian does, rather than reading its
        weight: a model whose linear layers were swapped for other modules (`torch.ao`'s dynamic quantization, an
        adapter library) projects through them."""
        if self.output_projection is not None:
            return self.output_projection(features)
        return self.lm_head(features) + self.final_logits_bias[0].to(features.dtype)

    def project_output_groups(self, group_features: Sequence[torch.Tensor]) -> torch.Tensor:
        """`project` of several output groups' features at once, the group logits `(groups, ..., vocab)`, for an
        output head that reads them only before it returns (to mix them, or for the groups' losses): through
        `output_groups_projection` where an inference copy set one (`set_output_kernels`), which may write them into
        memory that its next call in the same thread writes again."""
        stacked = torch.stack(tuple(group_features))
        if self.output_groups_projection is not None:
            return self.output_groups_projection(stacked)
        return self.project(stacked)

    def mix_output_groups(self, group_logits: torch.Tensor, psi: torch.Tensor) -> torch.Tensor:
        """The mixture of several output groups' distributions, `probability_mixture(group_logits, psi)` (log sum_g
        psi_g softmax(z_g); GTrans' Eq. 5), for an output head with several groups: through `output_mixture_kernel`
        where an inference copy set one and it takes these inputs (it returns None where it does not: gradients,
        another dtype or device), else in torch operations. A family whose mixture is another function overrides
        this method (the copies then run the override)."""
        kernel = self.output_mixture_kernel
        mixed = None if kernel is None else kernel(group_logits, psi)
        return probability_mixture(group_logits, psi) if mixed is None else mixed

    def set_output_kernels(
        self,
        projection: nn.Module | None = None,
        mixture: Callable[[torch.Tensor, torch.Tensor], torch.Tensor | None] | None = None,
        groups_projection: nn.Module | None = None,
    ) -> None:
        """What the output head runs instead of its torch operations, set by the inference copies
        (`hf_layerfusion.inference`; None: the torch operations): `projection`, a module computing `project`'s
        `h W_o + b` (its own layer of `lm_head`'s weight and `final_logits_bias`); `mixture`, a function computing
        `probability_mixture` (or returning None where it does not apply), which `mix_output_groups` calls; and
        `groups_projection`, a module computing `project_output_groups`' group logits from the stacked features
        (None: `project`'s)."""
        for name, module in (("projection", projection), ("groups_projection", groups_projection)):
            if module is not None and not isinstance(module, nn.Module):
                raise TypeError(
                    f"set_output_kernels: {name} must be an nn.Module or None, got {type(module).__name__}."
                )
        if mixture is not None and not callable(mixture):
            raise TypeError(f"set_output_kernels: mixture must be callable or None, got {type(mixture).__name__}.")
        self.output_projection = projection
        self.output_groups_projection = groups_projection
        self.output_mixture_kernel = mixture

    # ---- family extension points
    def output_head(
        self,
        group_features: tuple[torch.Tensor, ...],
        groups: Sequence[int] | None,
        labels: torch.Tensor | None,
        num_items_in_batch: int | torch.Tensor | None,
        return_group_log_probs: bool,
    ) -> HeadOutput:
        """Single output group: the loss, logits and (on request) group log-probabilities of the plain Transformer."""
        logits = self.project(group_features[0])
        loss = None
        if labels is not None:
            loss = token_cross_entropy(logits, labels, self.config.label_smoothing, num_items_in_batch)
        if not return_group_log_probs:
            return HeadOutput(loss=loss, logits=logits)
        return HeadOutput(
            loss=loss,
            logits=logits,
            group_log_probs=F.log_softmax(logits.float(), dim=-1).unsqueeze(0),
            group_weights=logits.new_ones(1),
        )

    def extra_loss_needs_hidden_states(self) -> bool:
        """Whether `extra_loss` reads the stacks' hidden states on this forward pass with `labels`: the forward then
        collects them, and leaves them out of the output unless they were asked for. Default: no."""
        return False

    def extra_loss(
        self, outputs: LayerFusionSeq2SeqModelOutput, attention_mask: torch.Tensor | None, labels: torch.Tensor
    ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """A family's term of the training objective, added to the output head's loss on forward passes with `labels`,
        and the diagnostics it reports (fields of `output_class`), from the bare model's `outputs`. Default: none.
        The term is a mean over this batch; under gradient accumulation (`num_items_in_batch` given) the forward pass
        weights it by the batch's share of the step's target tokens."""
        return None, {}

    # ----
    @accepts_either_cache_name
    @can_return_tuple
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        decoder_groups: Sequence[int] | None = None,
        return_group_log_probs: bool = False,
        logits_to_keep: int = 0,
        num_items_in_batch: int | torch.Tensor | None = None,
        **kwargs,
    ) -> LayerFusionSeq2SeqLMOutput:
        r"""
        decoder_groups: 1-based output groups to predict from (families with several decoder groups, e.g.
            GTrans; `None` = all). Decoder layers above the highest requested group are not computed.
        return_group_log_probs: also return every output group's log-probabilities and mixture weights.
        logits_to_keep: compute logits for the last `logits_to_keep` positions only (0 = all); `generate()`
            sets it to 1.
        num_items_in_batch: token count the loss sum is divided by (passed by the Trainer for gradient
            accumulation); default: this batch's non-pad label count.
        """
        hidden_states_requested = kwargs.get("output_hidden_states", self.config.output_hidden_states)
        collect_hidden_states = labels is not None and self.extra_loss_needs_hidden_states()
        if labels is not None:
            decoder_inputs = decoder_input_ids if decoder_input_ids is not None else decoder_inputs_embeds
            check_labels(self.config, labels, decoder_inputs)
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        if collect_hidden_states:
            kwargs["output_hidden_states"] = True
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            cache=cache,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            decoder_groups=decoder_groups,
            return_dict=True,
            **kwargs,
        )
        group_features = outputs.group_features
        if logits_to_keep:
            group_features = tuple(feature[:, -logits_to_keep:] for feature in group_features)
        head = self.output_head(group_features, decoder_groups, labels, num_items_in_batch, return_group_log_probs)
        loss, diagnostics = head.loss, {}
        if labels is not None:
            term, diagnostics = self.extra_loss(outputs, attention_mask, labels)
            if term is not None:
                if num_items_in_batch is not None:
                    # the head's loss is this batch's token sum over the target tokens of every micro-batch of the
                    # optimizer step, on every process (the Trainer then neither divides by the accumulation steps
                    # nor lets DDP's mean shrink it): the term, a mean over this batch, counts by the batch's share of
                    # those tokens, so that the micro-batches' terms add up to the whole batch's term (exactly for a
                    # mean over target tokens) rather than to k times it
                    term = term * (labels.ne(-100).sum() / num_items_in_batch)
                loss = loss + term
        keep_hidden_states = hidden_states_requested or not collect_hidden_states
        return self.output_class(
            loss=loss,
            logits=head.logits,
            **cache_field(output_cache(outputs)),
            decoder_hidden_states=outputs.decoder_hidden_states if keep_hidden_states else None,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states if keep_hidden_states else None,
            encoder_attentions=outputs.encoder_attentions,
            group_log_probs=head.group_log_probs,
            group_weights=head.group_weights,
            **diagnostics,
        )
