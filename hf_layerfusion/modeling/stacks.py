"""The encoder and decoder stacks: embeddings, the layers, the connection between them, the final LayerNorm of
pre-norm models, the readout, and the loop that collects every state."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from transformers import AutoConfig
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from ..compat import accepts_either_cache_name, cache_field

from .attention import MultiHeadAttention
from .configuration import LayerFusionConfig
from .embeddings import TokenAndPositionEmbedding
from .extension_points import Connection, DecoderReadout, EncoderReadout
from .input_checks import check_decoder_groups, check_model_inputs
from .layers import TransformerLayer
from .outputs import LayerFusionDecoderOutput, LayerFusionEncoderOutput
from .pretrained import LayerFusionPreTrainedModel
from .registry import family_of


class LayerStack(LayerFusionPreTrainedModel):
    """What the encoder and decoder stacks share: token + position embeddings, the layers, the connection between
    them, the final LayerNorm of pre-norm models, the readout, and the loop that collects every state."""

    stack_name = None  # "encoder" / "decoder": the attribute of `LayerFusionModel` holding this stack
    readout_class = None  # the extension point of this stack's readout

    def __init__(
        self,
        config: LayerFusionConfig,
        embed_tokens: nn.Embedding | None = None,
        readout: EncoderReadout | DecoderReadout | None = None,
        layers: list[TransformerLayer] | None = None,
        connection: Connection | None = None,
    ):
        if layers is None:
            # a stack built from its config alone (`from_pretrained` of a saved `model.get_encoder()`): the family's
            # model builds both stacks (its builders may share modules between them), this one takes its own parts
            family = family_of(config)
            if family is None:
                raise ValueError(
                    f"{type(self).__name__} built from a {type(config).__name__} alone: its family's model builds "
                    "the stacks, and that config is not the config of a registered family."
                )
            built = getattr(family.model(config), self.stack_name)
            embed_tokens, readout, layers, connection = built.embed_tokens, built.readout, built.layers, built.connection
        if not isinstance(readout, self.readout_class):
            raise TypeError(
                f"The {self.stack_name} readout is a {type(readout).__name__}; it must be a "
                f"{self.readout_class.__name__} (hf_layerfusion.modeling.extension_points)."
            )
        if connection is not None and not isinstance(connection, Connection):
            raise TypeError(
                f"The {self.stack_name} connection is a {type(connection).__name__}; it must be a Connection "
                "(hf_layerfusion.modeling.extension_points) or None."
            )
        super().__init__(config)
        self.embed_tokens = embed_tokens
        self.embeddings = TokenAndPositionEmbedding(config)
        self.layers = nn.ModuleList(layers)
        self.connection = connection
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None
        self.readout = readout
        self.gradient_checkpointing = False
        self.post_init()

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config=None, **kwargs):
        """A saved stack of any family: the stacks serve every family, so the config is read as its family's."""
        if config is None:
            config = AutoConfig.from_pretrained(pretrained_model_name_or_path)
        return super().from_pretrained(pretrained_model_name_or_path, *model_args, config=config, **kwargs)

    def input_embeddings(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> torch.Tensor:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"{type(self).__name__}: pass exactly one of `input_ids` or `inputs_embeds`.")
        return self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds

    def connect(self, layer_idx: int, output: torch.Tensor, states: list[torch.Tensor]) -> torch.Tensor:
        """The state `s_l` from layer l's output (l = 0: the embeddings) and the states below it."""
        return output if self.connection is None else self.connection(layer_idx, output, states)

    def run_layers(
        self,
        embeddings: torch.Tensor,
        layers,
        memory_for_layer: Callable[[int], torch.Tensor | None],
        layer_kwargs: dict,
        normalize: bool = True,
    ) -> list[torch.Tensor]:
        """Run `layers`; return the states `[s_0 .. s_L]` for the readout (pre-norm: s_1..s_L normalised), or with
        `normalize=False` as the layers produced them (see `readout_states`)."""
        states = [self.connect(0, embeddings, [])]
        for layer_idx, layer in enumerate(layers):
            output = layer(states[-1], layer_kwargs["attention_mask"], memory_for_layer(layer_idx), *states, **{
                k: v for k, v in layer_kwargs.items() if k != "attention_mask"
            })[0]
            states.append(self.connect(layer_idx + 1, output, states))
        return self.readout_states(states) if normalize else states

    def readout_states(self, states: list[torch.Tensor]) -> list[torch.Tensor]:
        """The states as readouts see them: in pre-norm stacks s_1..s_L pass through the final LayerNorm."""
        if self.layer_norm is None:
            return states
        # pre-norm: every state the readout may fuse is normalised like the top one (documented choice)
        return states[:1] + [self.layer_norm(state) for state in states[1:]]


def attentions_recorder(layer_name: str) -> OutputRecorder:
    return OutputRecorder(MultiHeadAttention, index=1, layer_name=layer_name)


class LayerFusionEncoder(LayerStack):
    """Embeddings, the encoder layers, and the readout that builds the cross-attention memory."""

    stack_name = "encoder"
    readout_class = EncoderReadout

    _can_record_outputs = {"hidden_states": TransformerLayer, "attentions": attentions_recorder("self_attn")}

    @merge_with_config_defaults
    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> LayerFusionEncoderOutput:
        check_model_inputs(self.config, input_ids, attention_mask, inputs_embeds)
        inputs_embeds = self.input_embeddings(input_ids, inputs_embeds)
        embeddings = self.embeddings(input_ids, inputs_embeds)
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
        layer_states = self.run_layers(
            embeddings, self.layers, lambda layer_idx: None, {"attention_mask": mask, **kwargs}, normalize=False
        )
        return LayerFusionEncoderOutput(
            last_hidden_state=self.readout.memory(self.readout_states(layer_states)),
            # per-decoder-layer memories parallel the inputs of the encoder layers, so they get the states as the
            # layers received them (pre-norm: before the final LayerNorm); the reading sub-layer normalises them
            # through `LayerContext.normalize`
            layer_memories=self.readout.layer_memories(layer_states),
        )


class LayerFusionDecoder(LayerStack):
    """Embeddings, the decoder layers with KV cache, and the readout that builds the output-group features.

    Layers above the highest one the requested output groups need are not computed (GTrans pruning).
    """

    stack_name = "decoder"
    readout_class = DecoderReadout

    _can_record_outputs = {
        "hidden_states": TransformerLayer,
        "attentions": attentions_recorder("self_attn"),
        "cross_attentions": attentions_recorder("encoder_attn"),
    }

    @accepts_either_cache_name
    @merge_with_config_defaults
    @capture_outputs(tie_last_hidden_states=False)
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        groups: Sequence[int] | None = None,
        encoder_layer_memories: torch.Tensor | None = None,
        **kwargs,
    ) -> LayerFusionDecoderOutput:
        r"""
        encoder_layer_memories: `(batch, decoder_layers, source, d_model)`, one memory per decoder layer, for
            families whose encoder readout gives them (`EncoderReadout.layer_memories`); else every layer reads
            `encoder_hidden_states`.
        """
        if use_cache and cache is None:
            cache = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = cache.get_seq_length() if cache is not None else 0
        check_model_inputs(self.config, input_ids, attention_mask, inputs_embeds, "decoder_input_ids", past_length)
        inputs_embeds = self.input_embeddings(input_ids, inputs_embeds)
        embeddings = self.embeddings(input_ids, inputs_embeds, past_length)

        batch_size, seq_length = inputs_embeds.shape[:2]
        if attention_mask is None:
            attention_mask = torch.ones(batch_size, past_length + seq_length, device=inputs_embeds.device)
        self_attn_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        # the cache goes by position: transformers 5.24 renamed this argument `past_key_values` -> `cache`
        causal_mask = create_causal_mask(self.config, inputs_embeds, attention_mask, self_attn_cache)
        cross_mask = None
        if encoder_hidden_states is not None:
            cross_mask = create_bidirectional_mask(
                config=self.config,
                inputs_embeds=inputs_embeds,
                attention_mask=encoder_attention_mask,
                encoder_hidden_states=encoder_hidden_states,
            )

        def memory_for_layer(layer_idx: int) -> torch.Tensor | None:
            if encoder_layer_memories is not None:
                return encoder_layer_memories[:, layer_idx]
            return encoder_hidden_states

        groups = check_decoder_groups(groups, self.readout.num_groups)
        num_layers = self.readout.num_layers_needed(groups, len(self.layers))
        states = self.run_layers(
            embeddings,
            self.layers[:num_layers],
            memory_for_layer,
            {"attention_mask": causal_mask, "memory_mask": cross_mask, "cache": cache, **kwargs},
        )
        return LayerFusionDecoderOutput(
            last_hidden_state=states[-1],
            group_features=self.readout.group_features(states, groups),
            **cache_field(cache),
        )
