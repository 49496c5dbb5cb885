"""The one shared encoder-decoder backbone of hf_layerfusion.

Attention, layers, embeddings, positions, cache handling and the LM head live here once. A family adds its
fusion by giving the stacks a *readout*: the module that turns the list of layer outputs into what the rest of
the model consumes.

- encoder readout: `[h_1 .. h_L] -> memory` fed to every cross-attention (plain Transformer: `h_L`);
- decoder readout: `[h_1 .. h_L] -> (f_1 .. f_N)`, one feature per output group (plain Transformer: `(h_L,)`);
- output head (`LayerFusionForConditionalGeneration.output_head`): `(f_1 .. f_N) -> logits, loss`.

With the plain readouts the backbone computes exactly what `MarianMTModel` computes (tested weight for weight).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, ModelOutput, Seq2SeqLMOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel

from .configuration_backbone import LayerFusionConfig


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Teacher-forcing decoder input: labels shifted one step right, `-100` replaced by the pad id."""
    shifted = labels.new_zeros(labels.shape)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill_(shifted == -100, pad_token_id)


# --------------------------------------------------------------------------------------------------- positions
class SinusoidalPositionalEmbedding(nn.Module):
    """Fixed sin/cos table as Marian builds it: sin features in the first half, cos in the second, from 0.

    The table is a buffer, not a frozen parameter: a parameter would come back trainable from `from_pretrained`
    and show up as unused in DDP. It is saved with the model and filled by `_init_weights`."""

    def __init__(self, num_positions: int, embedding_dim: int):
        super().__init__()
        self.weight = nn.Buffer(torch.empty(num_positions, embedding_dim))

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(position_ids, self.weight)

    def create_weight(self) -> torch.Tensor:
        n_pos, dim = self.weight.shape
        position = torch.arange(n_pos, dtype=torch.float64)[:, None]
        # column j uses exponent 2*(j//2)/dim; even columns feed sin, odd columns feed cos (Marian's layout)
        exponent = 2 * (torch.arange(dim, dtype=torch.float64) // 2) / dim
        angle = position / torch.pow(torch.tensor(10000.0, dtype=torch.float64), exponent)
        sentinel = (dim + 1) // 2
        table = torch.empty(n_pos, dim, dtype=torch.float64)
        table[:, :sentinel] = torch.sin(angle[:, 0::2])
        table[:, sentinel:] = torch.cos(angle[:, 1::2])
        return table.to(self.weight.dtype)


class TokenAndPositionEmbedding(nn.Module):
    """`scale * E[x] + P[pos]` (+ optional LayerNorm), then dropout. Positions come from the cache length."""

    def __init__(self, config: LayerFusionConfig):
        super().__init__()
        self.config = config
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.offset = config.position_offset
        if config.position_embedding_type == "sinusoidal":
            self.embed_positions = SinusoidalPositionalEmbedding(config.max_position_embeddings, config.d_model)
        else:
            self.embed_positions = nn.Embedding(
                config.max_position_embeddings + self.offset, config.d_model, padding_idx=config.pad_token_id
            )
        self.layernorm_embedding = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.layernorm_embedding else None
        )
        self.dropout = config.dropout

    def position_ids(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor, past_length: int
    ) -> torch.Tensor:
        seq_length = inputs_embeds.shape[1]
        if past_length + seq_length > self.config.max_position_embeddings:
            raise ValueError(
                f"Sequence of length {past_length + seq_length} exceeds the position table "
                f"(max_position_embeddings={self.config.max_position_embeddings}); truncate the input or "
                "lower the generation max_length."
            )
        if self.config.position_embedding_type == "learned" and input_ids is not None:
            # RoBERTa: pads keep the padding position, real tokens count from pad_token_id + 1
            not_pad = input_ids.ne(self.config.pad_token_id).long()
            return (torch.cumsum(not_pad, dim=1) + past_length) * not_pad + self.config.pad_token_id
        positions = torch.arange(past_length, past_length + seq_length, device=inputs_embeds.device)
        return (positions + self.offset).unsqueeze(0)

    def forward(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor, past_length: int = 0
    ) -> torch.Tensor:
        positions = self.position_ids(input_ids, inputs_embeds, past_length)
        hidden_states = inputs_embeds * self.embed_scale + self.embed_positions(positions)
        if self.layernorm_embedding is not None:
            hidden_states = self.layernorm_embedding(hidden_states)
        return F.dropout(hidden_states, p=self.dropout, training=self.training)


# --------------------------------------------------------------------------------------------------- attention
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


class MultiHeadAttention(nn.Module):
    """Multi-head attention through transformers' attention interface (eager, sdpa, flash, flex).

    Self-attention keys/values append to `past_key_values.self_attention_cache`; cross-attention keys/values are
    computed once from the encoder memory and reused from `cross_attention_cache` afterwards.
    """

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

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        is_cross_attention = key_value_states is not None
        input_shape = hidden_states.shape[:-1]
        query_states = self.q_proj(hidden_states).view(*input_shape, -1, self.head_dim).transpose(1, 2)

        is_encoder_decoder_cache = isinstance(past_key_values, EncoderDecoderCache)
        cache = past_key_values
        if is_encoder_decoder_cache:
            cache = past_key_values.cross_attention_cache if is_cross_attention else past_key_values.self_attention_cache
        if is_cross_attention and is_encoder_decoder_cache and past_key_values.is_updated.get(self.layer_idx, False):
            # cross-attention keys/values depend on the encoder memory only: computed at the first step, reused
            key_states = cache.layers[self.layer_idx].keys
            value_states = cache.layers[self.layer_idx].values
        else:
            source = key_value_states if is_cross_attention else hidden_states
            kv_shape = (*source.shape[:-1], -1, self.head_dim)
            key_states = self.k_proj(source).view(kv_shape).transpose(1, 2)
            value_states = self.v_proj(source).view(kv_shape).transpose(1, 2)
            if cache is not None:
                key_states, value_states = cache.update(key_states, value_states, self.layer_idx)
                if is_cross_attention and is_encoder_decoder_cache:
                    past_key_values.is_updated[self.layer_idx] = True

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
        attn_output = self.out_proj(attn_output.reshape(*input_shape, -1).contiguous())
        return attn_output, attn_weights


# --------------------------------------------------------------------------------------------------- layers
class ResidualSublayer(nn.Module):
    """Holds the LayerNorm of one residual sub-layer `x + dropout(f(x))`, placed after the sum (post-norm, the
    papers' default) or before `f` (pre-norm). `enter`/`exit` are plain methods, not module calls: they run on
    every decoding step, where module-call overhead shows."""

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


class FeedForward(nn.Module):
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


class EncoderLayer(GradientCheckpointingLayer):
    """Self-attention then feed-forward, each a residual sub-layer. Returns `(hidden_states, self_attn_weights)`
    (weights only with eager attention)."""

    def __init__(self, config: LayerFusionConfig, layer_idx: int):
        super().__init__()
        self.self_attn = MultiHeadAttention(config, config.encoder_attention_heads, layer_idx=layer_idx)
        self.self_attn_block = ResidualSublayer(config)
        self.ffn = FeedForward(config, config.encoder_ffn_dim)
        self.ffn_block = ResidualSublayer(config)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        attn_output, self_attn_weights = self.self_attn(
            self.self_attn_block.enter(hidden_states), attention_mask=attention_mask, **kwargs
        )
        hidden_states = self.self_attn_block.exit(hidden_states, attn_output)
        hidden_states = self.ffn_block.exit(hidden_states, self.ffn(self.ffn_block.enter(hidden_states)))
        return hidden_states, self_attn_weights


class DecoderLayer(GradientCheckpointingLayer):
    """Causal self-attention, cross-attention over the encoder memory, feed-forward. Returns
    `(hidden_states, self_attn_weights, cross_attn_weights)` (weights only with eager attention)."""

    def __init__(self, config: LayerFusionConfig, layer_idx: int):
        super().__init__()
        self.self_attn = MultiHeadAttention(config, config.decoder_attention_heads, is_causal=True, layer_idx=layer_idx)
        self.self_attn_block = ResidualSublayer(config)
        self.encoder_attn = MultiHeadAttention(config, config.decoder_attention_heads, layer_idx=layer_idx)
        self.encoder_attn_block = ResidualSublayer(config)
        self.ffn = FeedForward(config, config.decoder_ffn_dim)
        self.ffn_block = ResidualSublayer(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        **kwargs,
    ):
        attn_output, self_attn_weights = self.self_attn(
            self.self_attn_block.enter(hidden_states),
            past_key_values=past_key_values,
            attention_mask=attention_mask,
            **kwargs,
        )
        hidden_states = self.self_attn_block.exit(hidden_states, attn_output)
        attn_output, cross_attn_weights = self.encoder_attn(
            self.encoder_attn_block.enter(hidden_states),
            key_value_states=encoder_hidden_states,
            past_key_values=past_key_values,
            attention_mask=encoder_attention_mask,
            **kwargs,
        )
        hidden_states = self.encoder_attn_block.exit(hidden_states, attn_output)
        hidden_states = self.ffn_block.exit(hidden_states, self.ffn(self.ffn_block.enter(hidden_states)))
        return hidden_states, self_attn_weights, cross_attn_weights


# --------------------------------------------------------------------------------------------------- readouts
class TopLayerEncoderReadout(nn.Module):
    """Plain Transformer: cross-attention reads the top encoder layer.

    Every readout also reports its learned fusion weights, as the paper plots them, via `fusion_weights()`
    (`{name: 1-D tensor}`; logged by `hf_layerfusion.callbacks.FusionWeightsCallback`)."""

    def fusion_weights(self) -> dict[str, torch.Tensor]:
        return {}

    def forward(self, layer_states: Sequence[torch.Tensor]) -> torch.Tensor:
        return layer_states[-1]


class TopLayerDecoderReadout(nn.Module):
    """Plain Transformer: one output group, the top decoder layer."""

    num_groups = 1

    def fusion_weights(self) -> dict[str, torch.Tensor]:
        return {}

    def num_layers_needed(self, groups: Sequence[int]) -> int | None:
        return None  # all layers

    def forward(self, layer_states: Sequence[torch.Tensor], groups: Sequence[int]) -> tuple[torch.Tensor, ...]:
        return (layer_states[-1],)


def check_groups(groups: Sequence[int] | None, num_groups: int) -> list[int]:
    """Validate 1-based decoder group numbers; `None` means every group."""
    if groups is None:
        return list(range(1, num_groups + 1))
    groups = sorted(set(int(g) for g in groups))
    if not groups or groups[0] < 1 or groups[-1] > num_groups:
        raise ValueError(f"`decoder_groups` must be 1-based group numbers in [1, {num_groups}], got {groups}.")
    return groups


# --------------------------------------------------------------------------------------------------- outputs
@dataclass
class LayerFusionDecoderOutput(ModelOutput):
    """Decoder stack output. `group_features[k]` is the readout of output group `decoder_groups[k]`."""

    last_hidden_state: torch.Tensor | None = None
    group_features: tuple[torch.Tensor, ...] | None = None
    past_key_values: Cache | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class LayerFusionSeq2SeqModelOutput(ModelOutput):
    last_hidden_state: torch.Tensor | None = None
    group_features: tuple[torch.Tensor, ...] | None = None
    past_key_values: Cache | None = None
    decoder_hidden_states: tuple[torch.Tensor, ...] | None = None
    decoder_attentions: tuple[torch.Tensor, ...] | None = None
    cross_attentions: tuple[torch.Tensor, ...] | None = None
    encoder_last_hidden_state: torch.Tensor | None = None
    encoder_hidden_states: tuple[torch.Tensor, ...] | None = None
    encoder_attentions: tuple[torch.Tensor, ...] | None = None


@dataclass
class LayerFusionSeq2SeqLMOutput(Seq2SeqLMOutput):
    """`Seq2SeqLMOutput` plus, on request (`return_group_log_probs=True`), each output group's log-probabilities
    (`group_log_probs`, shape `(groups, batch, length, vocab)`) and the mixture weights (`group_weights`)."""

    group_log_probs: torch.Tensor | None = None
    group_weights: torch.Tensor | None = None


# --------------------------------------------------------------------------------------------------- stacks
class LayerFusionPreTrainedModel(PreTrainedModel):
    config: LayerFusionConfig
    config_class = LayerFusionConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["EncoderLayer", "DecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    # the training loss is normalised by `num_items_in_batch` when the Trainer passes it
    accepts_loss_kwargs = True

    @torch.no_grad()
    def _init_weights(self, module):
        super()._init_weights(module)
        if isinstance(module, SinusoidalPositionalEmbedding):
            init.copy_(module.weight, module.create_weight())
        elif isinstance(module, LayerFusionForConditionalGeneration):
            init.zeros_(module.final_logits_bias)
        if hasattr(module, "init_fusion_weights"):
            # family readouts own their fusion parameters and say how the paper initialises them
            module.init_fusion_weights()


class LayerStack(nn.Module):
    """What the encoder and decoder stacks share: token + position embeddings, the layers, the final LayerNorm of
    pre-norm models, the readout, and the loop that collects every layer's output for the readout."""

    def __init__(self, config: LayerFusionConfig, embed_tokens: nn.Embedding, readout: nn.Module, layers: list):
        super().__init__()
        self.config = config
        self.embed_tokens = embed_tokens
        self.embeddings = TokenAndPositionEmbedding(config)
        self.layers = nn.ModuleList(layers)
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None
        self.readout = readout
        self.gradient_checkpointing = False

    def input_embeddings(self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None) -> torch.Tensor:
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"{type(self).__name__}: pass exactly one of `input_ids` or `inputs_embeds`.")
        return self.embed_tokens(input_ids) if inputs_embeds is None else inputs_embeds

    def run_layers(
        self,
        hidden_states: torch.Tensor,
        layers,
        layer_args: tuple,
        layer_kwargs: dict,
        output_hidden_states: bool | None,
        output_attentions: bool | None,
    ) -> tuple[list[torch.Tensor], tuple | None, list[tuple] | None]:
        """Run `layers`; return every layer's output (for the readout), the hidden-states tuple (embedding output
        first) and, per attention kind of the layer, the tuple of attention weights."""
        all_hidden_states = [hidden_states] if output_hidden_states else None
        all_attentions = None
        layer_states = []
        for layer in layers:
            hidden_states, *attention_weights = layer(hidden_states, *layer_args, **layer_kwargs)
            layer_states.append(hidden_states)
            if output_hidden_states:
                all_hidden_states.append(hidden_states)
            if output_attentions:
                all_attentions = all_attentions or [[] for _ in attention_weights]
                for collected, weights in zip(all_attentions, attention_weights):
                    collected.append(weights)
        if self.layer_norm is not None:
            # pre-norm: every state the readout may fuse is normalised like the top one (documented choice)
            layer_states = [self.layer_norm(state) for state in layer_states]
        return (
            layer_states,
            tuple(all_hidden_states) if output_hidden_states else None,
            [tuple(weights) for weights in all_attentions] if all_attentions else None,
        )


class LayerFusionEncoder(LayerStack):
    """Embeddings, `encoder_layers` layers, and the readout that builds the cross-attention memory."""

    def __init__(self, config: LayerFusionConfig, embed_tokens: nn.Embedding, readout: nn.Module):
        super().__init__(config, embed_tokens, readout, [EncoderLayer(config, i) for i in range(config.encoder_layers)])

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        inputs_embeds = self.input_embeddings(input_ids, inputs_embeds)
        hidden_states = self.embeddings(input_ids, inputs_embeds)
        mask = create_bidirectional_mask(config=self.config, inputs_embeds=inputs_embeds, attention_mask=attention_mask)
        layer_states, all_hidden_states, all_attentions = self.run_layers(
            hidden_states, self.layers, (mask,), kwargs, output_hidden_states, output_attentions
        )
        return BaseModelOutput(
            last_hidden_state=self.readout(layer_states),
            hidden_states=all_hidden_states,
            attentions=all_attentions[0] if all_attentions else None,
        )


class LayerFusionDecoder(LayerStack):
    """Embeddings, `decoder_layers` layers with KV cache, and the readout that builds the output-group features.

    Layers above the highest one the requested output groups need are not computed (GTrans pruning).
    """

    def __init__(self, config: LayerFusionConfig, embed_tokens: nn.Embedding, readout: nn.Module):
        super().__init__(config, embed_tokens, readout, [DecoderLayer(config, i) for i in range(config.decoder_layers)])

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        groups: Sequence[int] | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> LayerFusionDecoderOutput:
        inputs_embeds = self.input_embeddings(input_ids, inputs_embeds)
        if use_cache and past_key_values is None:
            past_key_values = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        hidden_states = self.embeddings(input_ids, inputs_embeds, past_length)

        batch_size, seq_length = inputs_embeds.shape[:2]
        if attention_mask is None:
            attention_mask = torch.ones(batch_size, past_length + seq_length, device=inputs_embeds.device)
        self_attn_cache = (
            past_key_values.self_attention_cache if isinstance(past_key_values, EncoderDecoderCache) else past_key_values
        )
        causal_mask = create_causal_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            past_key_values=self_attn_cache,
        )
        cross_mask = create_bidirectional_mask(
            config=self.config,
            inputs_embeds=inputs_embeds,
            attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )

        groups = check_groups(groups, self.readout.num_groups)
        num_layers = self.readout.num_layers_needed(groups) or len(self.layers)
        layer_states, all_hidden_states, all_attentions = self.run_layers(
            hidden_states,
            self.layers[:num_layers],
            (causal_mask, encoder_hidden_states),  # positional for gradient checkpointing
            {"encoder_attention_mask": cross_mask, "past_key_values": past_key_values, **kwargs},
            output_hidden_states,
            output_attentions,
        )
        return LayerFusionDecoderOutput(
            last_hidden_state=layer_states[-1],
            group_features=self.readout(layer_states, groups),
            past_key_values=past_key_values,
            hidden_states=all_hidden_states,
            attentions=all_attentions[0] if all_attentions else None,
            cross_attentions=all_attentions[1] if all_attentions else None,
        )


class LayerFusionModel(LayerFusionPreTrainedModel):
    """Bare encoder-decoder (no LM head). Families override `build_encoder_readout` / `build_decoder_readout`."""

    _tied_weights_keys = {
        "encoder.embed_tokens.weight": "shared.weight",
        "decoder.embed_tokens.weight": "shared.weight",
    }

    def __init__(self, config: LayerFusionConfig):
        super().__init__(config)
        self.shared = nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id)
        self.encoder = LayerFusionEncoder(
            config, nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id), self.build_encoder_readout(config)
        )
        self.decoder = LayerFusionDecoder(
            config, nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id), self.build_decoder_readout(config)
        )
        self.post_init()

    @classmethod
    def build_encoder_readout(cls, config: LayerFusionConfig) -> nn.Module:
        return TopLayerEncoderReadout()

    @classmethod
    def build_decoder_readout(cls, config: LayerFusionConfig) -> nn.Module:
        return TopLayerDecoderReadout()

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

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        decoder_groups: Sequence[int] | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        **kwargs,
    ) -> LayerFusionSeq2SeqModelOutput:
        if output_attentions and self.config._attn_implementation not in ("eager", None):
            raise ValueError(
                f"output_attentions=True needs attn_implementation='eager' (this model uses "
                f"{self.config._attn_implementation!r}, which returns no weights): call "
                "`model.set_attn_implementation('eager')` or load with attn_implementation='eager'."
            )
        if encoder_outputs is None:
            encoder_outputs = self.encoder(
                input_ids=input_ids,
                attention_mask=attention_mask,
                inputs_embeds=inputs_embeds,
                output_attentions=output_attentions,
                output_hidden_states=output_hidden_states,
                **kwargs,
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = BaseModelOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            past_key_values=past_key_values,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            groups=decoder_groups,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            **kwargs,
        )
        return LayerFusionSeq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            group_features=decoder_outputs.group_features,
            past_key_values=decoder_outputs.past_key_values,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


# --------------------------------------------------------------------------------------------------- LM head
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

    `output_head` maps the decoder's output-group features to logits and loss; the base handles the single-group
    (plain Transformer) case, families with several groups override it.
    """

    model_class = LayerFusionModel
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
        self.post_init()

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

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def project(self, features: torch.Tensor) -> torch.Tensor:
        """`h W_o + b`: the vocabulary logits of one feature tensor."""
        return F.linear(features, self.lm_head.weight, self.final_logits_bias[0].to(features.dtype))

    def output_head(
        self,
        group_features: tuple[torch.Tensor, ...],
        groups: Sequence[int] | None,
        labels: torch.Tensor | None,
        num_items_in_batch: int | torch.Tensor | None,
        return_group_log_probs: bool,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """Single output group: `(loss, logits, group_log_probs, group_weights)` of the plain Transformer."""
        logits = self.project(group_features[0])
        loss = None
        if labels is not None:
            loss = token_cross_entropy(logits, labels, self.config.label_smoothing, num_items_in_batch)
        group_log_probs = F.log_softmax(logits.float(), dim=-1).unsqueeze(0) if return_group_log_probs else None
        group_weights = logits.new_ones(1) if return_group_log_probs else None
        return loss, logits, group_log_probs, group_weights

    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple | BaseModelOutput | None = None,
        past_key_values: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        decoder_groups: Sequence[int] | None = None,
        return_group_log_probs: bool = False,
        logits_to_keep: int = 0,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
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
        if labels is not None:
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs = self.model(
            input_ids,
            attention_mask=attention_mask,
            decoder_input_ids=decoder_input_ids,
            decoder_attention_mask=decoder_attention_mask,
            encoder_outputs=encoder_outputs,
            past_key_values=past_key_values,
            inputs_embeds=inputs_embeds,
            decoder_inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            decoder_groups=decoder_groups,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            **kwargs,
        )
        group_features = outputs.group_features
        if logits_to_keep:
            group_features = tuple(feature[:, -logits_to_keep:] for feature in group_features)
        loss, logits, group_log_probs, group_weights = self.output_head(
            group_features, decoder_groups, labels, num_items_in_batch, return_group_log_probs
        )
        return LayerFusionSeq2SeqLMOutput(
            loss=loss,
            logits=logits,
            past_key_values=outputs.past_key_values,
            decoder_hidden_states=outputs.decoder_hidden_states,
            decoder_attentions=outputs.decoder_attentions,
            cross_attentions=outputs.cross_attentions,
            encoder_last_hidden_state=outputs.encoder_last_hidden_state,
            encoder_hidden_states=outputs.encoder_hidden_states,
            encoder_attentions=outputs.encoder_attentions,
            group_log_probs=group_log_probs,
            group_weights=group_weights,
        )
