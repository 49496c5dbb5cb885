"""The one shared encoder-decoder backbone of hf_layerfusion.

Attention, layers, embeddings, positions, cache handling and the LM head live here once. A family changes the
Transformer only through these extension points (`LayerFusionModel` builds the stacks through them):

- **layer layout** (`config.encoder_layer_layouts` / `config.decoder_layer_layouts`): the sub-layers of each layer,
  `s` self-attention, `c` cross-attention, `f` feed-forward (plain: encoder `sf`, decoder `scf`);
- **sub-layer modules** (`LayerFusionModel.build_sublayer`): what each `s` / `c` / `f` is; an attention sub-layer
  reads what it needs from the `LayerContext` (its input, the stack's lower states, the encoder memory, masks,
  cache), which is how a family changes *what attention reads*;
- **connection** (`LayerFusionModel.build_connection`): the state of layer l, i.e. what layer l+1 receives, from
  layer l's output and the states below it (plain: the output itself);
- **readouts**: the encoder readout turns the states `[s_0 .. s_L]` (s_0 = embeddings) into the memory
  cross-attention reads (plain: `s_L`), optionally one memory per decoder layer (`layer_memories`); the decoder
  readout turns them into one feature per output group (plain: `(s_L,)`);
- **output head** (`LayerFusionForConditionalGeneration.output_head`): `(f_1 .. f_N) -> logits, loss`.

With the plain choices the backbone computes exactly what `MarianMTModel` computes (tested weight for weight).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoConfig
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import BaseModelOutput, ModelOutput, Seq2SeqLMOutput
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.utils import can_return_tuple
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.import_utils import is_torchdynamo_compiling
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .configuration_backbone import LayerFusionConfig
from .registry import family_of
from .validation import CheckedSaveLoadMixin, check_decoder_groups, check_model_inputs


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
    and show up as unused in DDP. It is saved with the model, filled at construction and again by `_init_weights`
    (models built on the meta device get it there)."""

    def __init__(self, num_positions: int, embedding_dim: int):
        super().__init__()
        # in the default dtype, as parameters are: `from_pretrained(dtype=...)` builds the model under that default
        self.weight = nn.Buffer(self.create_weight(num_positions, embedding_dim, dtype=torch.get_default_dtype()))

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(position_ids, self.weight)

    @staticmethod
    def create_weight(n_pos: int, dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        position = torch.arange(n_pos, dtype=torch.float64)[:, None]
        # column j uses exponent 2*(j//2)/dim; even columns feed sin, odd columns feed cos (Marian's layout)
        exponent = 2 * (torch.arange(dim, dtype=torch.float64) // 2) / dim
        angle = position / torch.pow(torch.tensor(10000.0, dtype=torch.float64), exponent)
        sentinel = (dim + 1) // 2
        table = torch.empty(n_pos, dim, dtype=torch.float64)
        table[:, :sentinel] = torch.sin(angle[:, 0::2])
        table[:, sentinel:] = torch.cos(angle[:, 1::2])
        return table.to(dtype)


class TokenAndPositionEmbedding(nn.Module):
    """`scale * E[x] + P[pos]` (+ optional LayerNorm), then dropout. Positions come from the cache length; a config
    without position embeddings (`config.uses_position_embeddings`) adds none, and the length limit still holds."""

    def __init__(self, config: LayerFusionConfig):
        super().__init__()
        self.config = config
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.offset = config.position_offset
        if not config.uses_position_embeddings:
            self.embed_positions = None
        elif config.position_embedding_type == "sinusoidal":
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
        # a data-dependent check cannot be traced by torch.compile(fullgraph=True); compiled generation sizes its
        # static cache (and so the longest position) before the first step, where this check has already run
        if not is_torchdynamo_compiling() and past_length + seq_length > self.config.max_position_embeddings:
            raise ValueError(
                f"Sequence of length {past_length + seq_length} exceeds the position table "
                f"(max_position_embeddings={self.config.max_position_embeddings}); truncate the input or "
                "lower the generation max_length."
            )
        if self.config.position_embedding_type == "learned" and input_ids is not None:
            # RoBERTa: pads keep the padding position, real tokens count from pad_token_id + 1
            not_pad = input_ids.ne(self.config.pad_token_id).long()
            return (torch.cumsum(not_pad, dim=1) + past_length) * not_pad + self.config.pad_token_id
        # arange of the static length, then shifted: with a static cache under torch.compile `past_length` is a
        # traced value, and `arange(past_length, past_length + seq_length)` would have a data-dependent size
        positions = torch.arange(seq_length, device=inputs_embeds.device) + past_length
        return (positions + self.offset).unsqueeze(0)

    def forward(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor, past_length: int = 0
    ) -> torch.Tensor:
        positions = self.position_ids(input_ids, inputs_embeds, past_length)
        hidden_states = inputs_embeds * self.embed_scale
        if self.embed_positions is not None:
            hidden_states = hidden_states + self.embed_positions(positions)
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


@dataclass
class LayerContext:
    """What a layer's sub-layers may read besides their input, for one layer of one stack forward.

    - `attention_mask`: the stack's self-attention mask (bidirectional in the encoder, causal in the decoder);
    - `memory`, `memory_mask`: the encoder memory this decoder layer reads (None in the encoder, and in a decoder
      called without encoder states), with its mask;
    - `past_key_values`: the decoder's cache (None in the encoder);
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
    past_key_values: Cache | None
    lower_states: Sequence[torch.Tensor]
    attention_kwargs: dict
    normalize: Callable[[torch.Tensor], torch.Tensor] | None = None


class MultiHeadAttention(nn.Module):
    """Multi-head attention through transformers' attention interface (eager, sdpa, flash, flex).

    `attend(queries_from, keys_from)` is the primitive: keys/values of `keys_from` append to slot `layer_idx` of
    `cache` (a `Cache`), or, with `static_keys=True` (keys that depend on the encoder only), are computed at the first
    step and reused from that slot afterwards. `forward` is the `s` sub-layer: attention over its own input.
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

    def project_keys_values(
        self, keys_from: torch.Tensor, past_key_values: Cache | None, static_keys: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of `keys_from`, through this module's cache slot (see the class docstring)."""
        cache = past_key_values
        if isinstance(past_key_values, EncoderDecoderCache):
            if static_keys and past_key_values.is_updated.get(self.layer_idx, False):
                layer = past_key_values.cross_attention_cache.layers[self.layer_idx]
                return layer.keys, layer.values
            cache = past_key_values.cross_attention_cache if static_keys else past_key_values.self_attention_cache
        kv_shape = (*keys_from.shape[:-1], -1, self.head_dim)
        key_states = self.k_proj(keys_from).view(kv_shape).transpose(1, 2)
        value_states = self.v_proj(keys_from).view(kv_shape).transpose(1, 2)
        if cache is not None:
            key_states, value_states = cache.update(key_states, value_states, self.layer_idx)
            if static_keys and isinstance(past_key_values, EncoderDecoderCache):
                past_key_values.is_updated[self.layer_idx] = True
        return key_states, value_states

    def attend_to(
        self,
        queries_from: torch.Tensor,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        attention_mask: torch.Tensor | None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attention of `queries_from` over given keys/values, output projection included."""
        input_shape = queries_from.shape[:-1]
        query_states = self.q_proj(queries_from).view(*input_shape, -1, self.head_dim).transpose(1, 2)
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

    def attend(
        self,
        queries_from: torch.Tensor,
        keys_from: torch.Tensor,
        attention_mask: torch.Tensor | None,
        past_key_values: Cache | None = None,
        static_keys: bool = False,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        key_states, value_states = self.project_keys_values(keys_from, past_key_values, static_keys)
        return self.attend_to(queries_from, key_states, value_states, attention_mask, **kwargs)

    def forward(self, hidden_states: torch.Tensor, context: LayerContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.attend(
            hidden_states,
            hidden_states,
            context.attention_mask,
            context.past_key_values,
            **context.attention_kwargs,
        )


class CrossAttention(MultiHeadAttention):
    """The `c` sub-layer: attention over the encoder memory, whose keys/values are computed once per input."""

    def forward(self, hidden_states: torch.Tensor, context: LayerContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.attend(
            hidden_states,
            context.memory,
            context.memory_mask,
            context.past_key_values,
            static_keys=True,
            **context.attention_kwargs,
        )


# --------------------------------------------------------------------------------------------------- layers
class ResidualSublayer(nn.Module):
    """Holds the LayerNorm of one residual sub-layer `x + dropout(f(x))`, placed after the sum (post-norm, the
    default, as in GTrans and Dou et al.) or before `f` (pre-norm, as in RTAL's tensor2tensor setting).
    `enter`/`exit` are plain methods, not module calls: they run on every decoding step, where module-call overhead
    shows."""

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
            self.add_module(name, build_sublayer(kind))
            self.add_module(f"{name}_block", ResidualSublayer(config))

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        *lower_states: torch.Tensor,
        memory_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        **kwargs,
    ):
        context = LayerContext(attention_mask, memory, memory_mask, past_key_values, lower_states, kwargs)
        weights = {"s": None, "c": None}
        for kind, name in self.sublayers:
            if kind == "c" and memory is None:
                continue
            block: ResidualSublayer = self._modules[f"{name}_block"]
            sublayer = self._modules[name]
            if kind == "f":
                output = sublayer(block.enter(hidden_states))
            else:
                context.normalize = block.enter
                output, attn_weights = sublayer(block.enter(hidden_states), context)
                if weights[kind] is None:
                    weights[kind] = attn_weights
            hidden_states = block.exit(hidden_states, output)
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


# --------------------------------------------------------------------------------------------------- readouts
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


# --------------------------------------------------------------------------------------------------- outputs
@dataclass
class LayerFusionEncoderOutput(BaseModelOutput):
    """Encoder output. `last_hidden_state` is the memory every cross-attention reads (the readout's output);
    `layer_memories`, for families that give each decoder layer its own memory, is
    `(batch, decoder_layers, source, d_model)` (batch first, so that beam search expands it like the memory)."""

    layer_memories: torch.Tensor | None = None


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
class LayerFusionPreTrainedModel(CheckedSaveLoadMixin, PreTrainedModel):
    config: LayerFusionConfig
    config_class = LayerFusionConfig
    base_model_prefix = "model"
    main_input_name = "input_ids"
    supports_gradient_checkpointing = True
    _no_split_modules = ["TransformerLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _supports_flex_attn = True
    _can_compile_fullgraph = True
    # the training loss is normalised by `num_items_in_batch` when the Trainer passes it
    accepts_loss_kwargs = True

    @torch.no_grad()
    def _init_weights(self, module):
        if isinstance(module, nn.Embedding) and self.config.embedding_init == "rsqrt_d_model":
            # fairseq's `Embedding()`: N(0, d^-1/2), the padding row zero (skipped for weights loaded from a checkpoint)
            init.normal_(module.weight, mean=0.0, std=self.config.d_model**-0.5)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        else:
            super()._init_weights(module)
        if isinstance(module, SinusoidalPositionalEmbedding):
            init.copy_(module.weight, module.create_weight(*module.weight.shape, dtype=module.weight.dtype))
        elif isinstance(module, LayerFusionForConditionalGeneration):
            init.zeros_(module.final_logits_bias)
        if hasattr(module, "init_fusion_weights"):
            # family modules own their fusion parameters and say how the paper initialises them
            module.init_fusion_weights()

    def fusion_parameter_names(self) -> list[str]:
        """Names (as `named_parameters()` gives them) of the fusion weights: the parameters held directly by the
        modules that define `init_fusion_weights()` (gates, mixing weights, scales; their LayerNorms and feed-forward
        layers are sub-modules, not counted). `LayerFusionSeq2SeqTrainer` keeps them out of weight decay unless
        `config.decay_fusion_weights`."""
        return [
            f"{module_name}.{name}" if module_name else name
            for module_name, module in self.named_modules()
            if hasattr(module, "init_fusion_weights")
            for name, _ in module.named_parameters(recurse=False)
        ]


class LayerStack(LayerFusionPreTrainedModel):
    """What the encoder and decoder stacks share: token + position embeddings, the layers, the connection between
    them, the final LayerNorm of pre-norm models, the readout, and the loop that collects every state."""

    stack_name = None  # "encoder" / "decoder": the attribute of `LayerFusionModel` holding this stack

    def __init__(
        self,
        config: LayerFusionConfig,
        embed_tokens: nn.Embedding | None = None,
        readout: nn.Module | None = None,
        layers: list[TransformerLayer] | None = None,
        connection: nn.Module | None = None,
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
        layer_memories = getattr(self.readout, "layer_memories", None)
        return LayerFusionEncoderOutput(
            last_hidden_state=self.readout(self.readout_states(layer_states)),
            # per-decoder-layer memories parallel the inputs of the encoder layers, so they get the states as the
            # layers received them (pre-norm: before the final LayerNorm); the reading sub-layer normalises them
            # through `LayerContext.normalize`
            layer_memories=layer_memories(layer_states) if layer_memories is not None else None,
        )


class LayerFusionDecoder(LayerStack):
    """Embeddings, the decoder layers with KV cache, and the readout that builds the output-group features.

    Layers above the highest one the requested output groups need are not computed (GTrans pruning).
    """

    stack_name = "decoder"

    _can_record_outputs = {
        "hidden_states": TransformerLayer,
        "attentions": attentions_recorder("self_attn"),
        "cross_attentions": attentions_recorder("encoder_attn"),
    }

    @merge_with_config_defaults
    @capture_outputs(tie_last_hidden_states=False)
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
        encoder_layer_memories: torch.Tensor | None = None,
        **kwargs,
    ) -> LayerFusionDecoderOutput:
        r"""
        encoder_layer_memories: `(batch, decoder_layers, source, d_model)`, one memory per decoder layer, for
            families whose encoder readout defines `layer_memories`; else every layer reads `encoder_hidden_states`.
        """
        if use_cache and past_key_values is None:
            past_key_values = EncoderDecoderCache(DynamicCache(config=self.config), DynamicCache(config=self.config))
        past_length = past_key_values.get_seq_length() if past_key_values is not None else 0
        check_model_inputs(self.config, input_ids, attention_mask, inputs_embeds, "decoder_input_ids", past_length)
        inputs_embeds = self.input_embeddings(input_ids, inputs_embeds)
        embeddings = self.embeddings(input_ids, inputs_embeds, past_length)

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
        num_layers = self.readout.num_layers_needed(groups) or len(self.layers)
        states = self.run_layers(
            embeddings,
            self.layers[:num_layers],
            memory_for_layer,
            {"attention_mask": causal_mask, "memory_mask": cross_mask, "past_key_values": past_key_values, **kwargs},
        )
        return LayerFusionDecoderOutput(
            last_hidden_state=states[-1],
            group_features=self.readout(states, groups),
            past_key_values=past_key_values,
        )


class LayerFusionModel(LayerFusionPreTrainedModel):
    """Bare encoder-decoder (no LM head). A family overrides the builders below (see the module docstring)."""

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
            self.build_encoder_readout(config),
            self.build_layers(config, is_decoder=False),
            self.build_connection(config, is_decoder=False),
        )
        self.decoder = LayerFusionDecoder(
            config,
            nn.Embedding(config.vocab_size, config.d_model, config.pad_token_id),
            self.build_decoder_readout(config),
            self.build_layers(config, is_decoder=True),
            self.build_connection(config, is_decoder=True),
        )
        self.post_init()

    # ---- family extension points
    @classmethod
    def build_encoder_readout(cls, config: LayerFusionConfig) -> nn.Module:
        return TopLayerEncoderReadout()

    @classmethod
    def build_decoder_readout(cls, config: LayerFusionConfig) -> nn.Module:
        return TopLayerDecoderReadout()

    def build_connection(self, config: LayerFusionConfig, is_decoder: bool) -> nn.Module | None:
        """`connection(l, output, states) -> s_l`, or None for the plain stack (s_l = layer l's output)."""
        return None

    def build_sublayer(
        self, config: LayerFusionConfig, is_decoder: bool, kind: str, layer_idx: int, cache_slots: CacheSlots
    ) -> nn.Module:
        """The module of one `s` / `c` / `f` sub-layer of layer `layer_idx` (0-based). Attention modules are called
        as `module(normalised_input, context: LayerContext) -> (output, weights)`; decoder modules that keep
        keys/values take their slot from `cache_slots`."""
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

    @can_return_tuple
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
            encoder_outputs = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
            )
        elif not isinstance(encoder_outputs, BaseModelOutput):
            encoder_outputs = LayerFusionEncoderOutput(
                last_hidden_state=encoder_outputs[0],
                hidden_states=encoder_outputs[1] if len(encoder_outputs) > 1 else None,
                attentions=encoder_outputs[2] if len(encoder_outputs) > 2 else None,
            )
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids,
            attention_mask=decoder_attention_mask,
            encoder_hidden_states=encoder_outputs.last_hidden_state,
            encoder_attention_mask=attention_mask,
            encoder_layer_memories=getattr(encoder_outputs, "layer_memories", None),
            past_key_values=past_key_values,
            inputs_embeds=decoder_inputs_embeds,
            use_cache=use_cache,
            groups=decoder_groups,
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

    @can_return_tuple
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
