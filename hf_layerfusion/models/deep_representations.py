"""Deep representations (Dou, Tu, Wang, Shi, Zhang 2018, "Exploiting Deep Representations for Neural Machine
Translation", EMNLP; equations numbered as in `shared/papers/deep-representations.txt`).

Instead of reading only the top layer, the encoder and/or the decoder fuse all their layers with one of five
strategies (Sec. 3.1), chosen per stack by `encoder_aggregation` / `decoder_aggregation`:

- `"dense"`, dense connection (Eq. 4): `H^l = Layer(H^{l-1}) + sum_{i=1}^{l-1} H^i`, no parameters; it changes what
  every layer receives, so it is the backbone's *connection* between layers;
- `"linear"`, linear combination (Eq. 5): `Ĥ = sum_{l=1}^{L} W_l H^l` with trainable d x d matrices `W_l` (not
  scalars), a *readout* after the stack;
- `"iterative"`, iterative aggregation (Eq. 6-7): `Ĥ^1 = H^1`, `Ĥ^l = AGG(H^l, Ĥ^{l-1})`, the output is `Ĥ^L`
  (a readout), with `AGG(x, y) = LN(FF([x; y]) + x + y)`;
- `"hierarchical"`, hierarchical aggregation (Fig. 2, Sec. 3.1.1): a CNN-like tree of filter size 2 whose nodes are
  `Ĥ^1 = AGG(H^1, H^2)` and `Ĥ^i = AGG(H^{2i-1}, H^{2i}, Ĥ^{i-1})` (i >= 2), `AGG(x, y, z) = LN(FF([x; y; z]) + x +
  y + z)`; each node's output is fed back into the backbone as the input of layer 2i+1 (the backbone's
  connection), and the top node `Ĥ^{L/2}` is the stack's output. For L = 4: Ĥ^1 = AGG(H^1, H^2),
  Ĥ^2 = AGG(H^3, H^4, Ĥ^1); L = 6 (the paper): plus Ĥ^3 = AGG(H^5, H^6, Ĥ^2); L = 8: plus Ĥ^4 = AGG(H^7, H^8,
  Ĥ^3). The tree pairs layers, so an odd number of layers is refused with a `ValueError`;
- `"multi_layer_attention"` (Eq. 8): the self-attention of layer l queries each of the k layers below it with its
  own attention model, `C^l_{-i} = ATT(Q^l, K^{l-i}, V^{l-i})`, and `C^l = AGG(C^l_{-1}, .., C^l_{-k})` replaces
  the self-attention output in Eq. 1 / 2; cross-attention is unchanged. In the decoder every one of these
  attentions keeps its own KV-cache slot, so incremental decoding equals the full forward;
- `"none"`: the plain Transformer stack.

`AGG`'s FF is `W_2 act(W_1 [x_1; ..; x_n] + b_1) + b_2` with inner size the stack's FFN size (`encoder_ffn_dim` /
`decoder_ffn_dim`): with it the added parameters are exactly Table 1's for Transformer-Base (iterative: 5 two-input
nodes per stack, +31.5M; hierarchical: one two-input and two three-input nodes per stack, +23.1M; multi-layer
attention, k = 2: +33.6M, k = 3: +37.8M, see below).

Layer diversity (Sec. 3.2, Eq. 9-10): `D = 1/(L-1) sum_{l=1}^{L-1} 1/N sum_n (1 - cos^2(h^l_n, h^{l+1}_n))`, and
the training loss is `CE - lambda * D` (Eq. 9 maximises likelihood and diversity; lambda = `diversity_weight`).

**The diversity term fine-tunes a trained model; it is off (lambda = 0) in a freshly built config.** The paper sets
lambda = 1.0 and always starts from a trained model ("the parameters of the proposed models were initialized by the
pre-trained model", Sec. 4.1). D has a degenerate maximum, every layer's output a constant vector orthogonal to its
neighbours' (1 - cos^2 = 1 at every position, whatever the input), and a model trained from random initialisation
with lambda > 0 falls into it and stops reading the source (the measurements: docs/deep_representations.md). So
`diversity_weight` defaults to 0.0, and the paper's recipe sets lambda = 1.0 when it loads a trained model:

    model = DeepRepresentationsForConditionalGeneration.from_pretrained(
        trained_checkpoint, encoder_aggregation="hierarchical", decoder_aggregation="hierarchical",
        diversity_weight=1.0)   # a plain Transformer checkpoint: the backbone loads, the AGG nodes start fresh

(`examples/run_translation.py --model_name_or_path <checkpoint> --model_type deep_representations --config_overrides
"diversity_weight=1.0"` from the command line). A checkpoint saved before this default changed keeps its lambda:
transformers writes every family key into config.json, so its `diversity_weight: 1.0` loads back. Even from a trained
model the term can push the layers that only feed AGG nodes towards constants (measured in
docs/deep_representations.md), so training never runs blind: in every training forward pass with `labels` (and in every
pass with `labels` when lambda > 0) the output carries each stack's D (`encoder_layer_diversity`,
`decoder_layer_diversity`), their mean `layer_diversity` (the D of Eq. 9) and `memory_spread`, the spread of the
cross-attention memory across source positions (`position_spread`); `hf_layerfusion.LayerFusionSeq2SeqTrainer` logs
their means over the steps between two logs and warns once the memory's spread falls below
`hf_layerfusion.training.trainer.COLLAPSE_SPREAD`. The collapse's signature is D -> 1 with the spread -> 0. With lambda
= 0 they are measured without gradient (the loss is the cross entropy).

Choices where the paper is ambiguous (all tested in tests/test_deep_representations.py):
- **Table 4 residual** (`aggregation_residual`): `"all"` (the paper's default) adds every input of AGG to FF's
  output; `"top"` adds only "the top level of the input layers", the input coming from the highest layer: `H^{2i}`
  in a hierarchical node (Ĥ^{i-1} aggregates layers below it), `H^l` in an iterative node (Eq. 6's x),
  `C^l_{-1}` (the context from layer l-1) in multi-layer attention; `"none"` adds nothing (`LN(FF([..]))`).
  `aggregation_activation` is FF's inner activation, `"sigmoid"` (the paper's) or `"relu"` (Table 4).
- **AGG dropout**: `activation_dropout` after the inner activation and `dropout` on FF's output, as in the
  backbone's feed-forward sub-layers (the paper is silent).
- **linear combination init**: `W_L = I`, every other `W_l = 0`, so Eq. 5 starts as the plain Transformer (the paper
  initialises its models from a trained baseline); gradients reach every `W_l` from the first step. Eq. 5 has no
  bias and no LayerNorm, and none is added. (Table 1's +14.7M is not what Eq. 5 as written adds, 2 x 6 d x d
  matrices = 3.1M at d = 512; we follow the equation.)
- **multi-layer attention, first layers**: the embedding layer is not one of "the layers lower than l", so layer
  l attends k layers only when l > k; layers 1..k keep the plain self-attention. This reproduces Table 1's parameter
  counts exactly (k = 2: layers 3-6 of both stacks, 8 x (one extra attention + a 2-input AGG) = 33.6M; k = 3:
  6 x (two extra attentions + a 3-input AGG) = 37.8M). The attention over layer l-1 is the layer's ordinary
  `self_attn` (so Marian weights load into it); the queries of every attention come from layer l's input through
  that attention's own projection. Pre-norm models give each extra attended state its own LayerNorm, as the
  layer's own input gets one. `output_attentions` returns the weights of the attention over layer l-1.
- **diversity states**: h^l is the paper's layer representation H^l, l = 1..L, of *both* stacks: the output of
  backbone layer l (what HF returns as hidden state l) for iterative, hierarchical and multi-layer attention (the
  paper's rows 8-10; the layers, not the aggregation nodes Ĥ), and for the dense connection Eq. 4's
  `H^l = Layer(H^{l-1}) + sum_{i<l} H^i`, what the next layer receives (`layer_representations`; the paper never
  combines the two). N runs over the non-pad positions: source positions with `attention_mask = 1`, target
  positions whose label is not -100; the mean is over all such positions of the batch (token-weighted, like the
  cross entropy).
- **two stacks, one D**: the paper writes one Eq. 10 over "the layers" and applies it with both stacks aggregated
  without saying how the two terms combine; D (`layer_diversity`, weighted by lambda) is the plain mean of the
  encoder's and the decoder's Eq. 10, each reported too.
- **when D is computed**: in every forward pass with `labels` when `diversity_weight > 0`, in evaluation too (an
  evaluation `loss` is then the training objective `CE - lambda * D`, not the cross entropy alone), and in every
  training-mode pass with `labels` for the logs; generation never computes it.
- "aggregation off" is `encoder_aggregation = decoder_aggregation = "none"` with `diversity_weight = 0`: exactly
  the plain backbone (and `MarianMTModel` through `from_marian`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from huggingface_hub.dataclasses import strict
from torch import nn
from transformers import initialization as init
from transformers.generation import GenerationMixin

from ..compat import CACHE_NAME
from ..modeling.attention import LayerContext, MultiHeadAttention
from ..modeling.configuration import LayerFusionConfig
from ..modeling.extension_points import (
    AttentionSublayer,
    Connection,
    FeedForwardSublayer,
    FusedStateReadout,
    FusionParameters,
    TopLayerReadout,
)
from ..modeling.layers import CacheSlots
from ..modeling.model import LayerFusionForConditionalGeneration, LayerFusionModel
from ..modeling.outputs import LayerFusionSeq2SeqLMOutput, LayerFusionSeq2SeqModelOutput
from ..modeling.registry import register_family

AGGREGATIONS = ("none", "dense", "linear", "iterative", "hierarchical", "multi_layer_attention")
AGGREGATION_ACTIVATIONS = {"sigmoid": torch.sigmoid, "relu": F.relu}
AGGREGATION_RESIDUALS = ("none", "top", "all")
# what the output carries besides the loss when D is computed (see the module docstring)
DIVERSITY_DIAGNOSTICS = ("layer_diversity", "encoder_layer_diversity", "decoder_layer_diversity", "memory_spread")


@strict
class DeepRepresentationsConfig(LayerFusionConfig):
    r"""
    Deep-representations configuration: the backbone keys of `LayerFusionConfig` plus

    Args:
        encoder_aggregation, decoder_aggregation: the strategy of each stack, one of `"none"`, `"dense"` (Eq. 4),
            `"linear"` (Eq. 5), `"iterative"` (Eq. 6-7), `"hierarchical"` (Fig. 2, the paper's best, default) and
            `"multi_layer_attention"` (Eq. 8). `"hierarchical"` needs an even number of layers.
        aggregation_activation: inner activation of AGG's feed-forward network, `"sigmoid"` (paper) or `"relu"`
            (Table 4).
        aggregation_residual: which inputs of AGG are added to its output (Table 4): `"all"` (paper), `"top"`
            (the input from the highest layer) or `"none"`.
        multi_layer_attention_k: k of Eq. 8, the number of layers below that each self-attention queries (the paper
            tries 2 and 3); layers 1..k keep the plain self-attention. Must be smaller than the number of layers of
            a stack that uses it.
        diversity_weight: lambda of Eq. 9; the loss is `CE - lambda * D` (D of Eq. 10). Default 0.0, the term
            off: it is for fine-tuning a trained model, with the paper's lambda = 1.0 set when loading one
            (`DeepRepresentationsForConditionalGeneration.from_pretrained(checkpoint, diversity_weight=1.0)`); from
            random weights it collapses training (see the module docstring).
    """

    model_type = "deep_representations"
    # training diagnostics of the output, scalars: not part of the predictions the Trainer gathers in evaluation
    keys_to_ignore_at_inference = [CACHE_NAME, *DIVERSITY_DIAGNOSTICS]

    encoder_aggregation: str = "hierarchical"
    decoder_aggregation: str = "hierarchical"
    aggregation_activation: str = "sigmoid"
    aggregation_residual: str = "all"
    multi_layer_attention_k: int = 2
    diversity_weight: float | int = 0.0

    def check_consistency(self) -> None:
        super().check_consistency()
        # checked even where no stack uses it (as GTrans' group sizes): a saved config must not carry a bad value
        if self.multi_layer_attention_k < 2:
            raise ValueError(
                f"`multi_layer_attention_k` must be at least 2 (layers 1..k keep the plain self-attention), got "
                f"{self.multi_layer_attention_k}."
            )
        for stack in ("encoder", "decoder"):
            strategy, layers = getattr(self, f"{stack}_aggregation"), getattr(self, f"{stack}_layers")
            if strategy not in AGGREGATIONS:
                raise ValueError(f"Unknown `{stack}_aggregation` {strategy!r}; choose one of {AGGREGATIONS}.")
            if strategy == "hierarchical" and layers % 2:
                raise ValueError(
                    f"`{stack}_aggregation='hierarchical'` merges pairs of layers (a tree of filter size 2) and needs "
                    f"an even number of layers; `{stack}_layers` is {layers}."
                )
            if strategy == "multi_layer_attention" and not 2 <= self.multi_layer_attention_k < layers:
                raise ValueError(
                    f"`multi_layer_attention_k` must lie in [2, {stack}_layers - 1 = {layers - 1}] (layers 1..k keep "
                    f"the plain self-attention), got {self.multi_layer_attention_k}."
                )
        if self.aggregation_activation not in AGGREGATION_ACTIVATIONS:
            raise ValueError(
                f"Unknown `aggregation_activation` {self.aggregation_activation!r}; "
                f"choose one of {tuple(AGGREGATION_ACTIVATIONS)}."
            )
        if self.aggregation_residual not in AGGREGATION_RESIDUALS:
            raise ValueError(
                f"Unknown `aggregation_residual` {self.aggregation_residual!r}; choose one of {AGGREGATION_RESIDUALS}."
            )
        if self.diversity_weight < 0:
            raise ValueError(f"`diversity_weight` (lambda of Eq. 9) must be >= 0, got {self.diversity_weight}.")
        if self.diversity_weight > 0 and min(self.encoder_layers, self.decoder_layers) < 2:
            raise ValueError(
                "Layer diversity (Eq. 10) compares adjacent layers and needs at least 2 layers per stack; "
                f"encoder_layers={self.encoder_layers}, decoder_layers={self.decoder_layers} with "
                f"diversity_weight={self.diversity_weight} (set it to 0)."
            )

    def stack_settings(self, is_decoder: bool) -> tuple[str, int, int]:
        """`(aggregation, layers, FFN size)` of the decoder or the encoder stack."""
        if is_decoder:
            return self.decoder_aggregation, self.decoder_layers, self.decoder_ffn_dim
        return self.encoder_aggregation, self.encoder_layers, self.encoder_ffn_dim

    def attends_lower_layers(self, is_decoder: bool, layer_idx: int) -> bool:
        """Whether 0-based layer `layer_idx` uses multi-layer attention: paper layer l = layer_idx + 1 > k."""
        strategy = self.stack_settings(is_decoder)[0]
        return strategy == "multi_layer_attention" and layer_idx >= self.multi_layer_attention_k

    @property
    def decoder_cache_layers(self) -> int:
        """One self-attention cache slot per attention: k for the multi-layer-attention layers, else one."""
        return sum(
            self.multi_layer_attention_k if self.attends_lower_layers(True, layer_idx) else 1
            for layer_idx in range(self.decoder_layers)
        )


# --------------------------------------------------------------------------------------------------- AGG
class LayerAggregation(nn.Module):
    """AGG of Eq. 7 (two inputs), of the hierarchical nodes (three) and of Eq. 8 (k contexts):
    `AGG(x_1, .., x_n) = LN(FF([x_1; ..; x_n]) + residual)`, FF = `W_2 act(W_1 z + b_1) + b_2`.

    The residual follows `config.aggregation_residual` (Table 4): `"all"` adds every input, `"top"` only
    `inputs[top_input]` (the input from the highest layer), `"none"` nothing."""

    def __init__(self, config: DeepRepresentationsConfig, num_inputs: int, ffn_dim: int, top_input: int):
        super().__init__()
        self.num_inputs = num_inputs
        self.top_input = top_input
        self.residual = config.aggregation_residual
        self.activation = AGGREGATION_ACTIVATIONS[config.aggregation_activation]
        self.fc1 = nn.Linear(num_inputs * config.d_model, ffn_dim)
        self.fc2 = nn.Linear(ffn_dim, config.d_model)
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.activation_dropout = config.activation_dropout
        self.dropout = config.dropout

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        hidden = self.activation(self.fc1(torch.cat(inputs, dim=-1)))
        hidden = F.dropout(hidden, p=self.activation_dropout, training=self.training)
        output = F.dropout(self.fc2(hidden), p=self.dropout, training=self.training)
        if self.residual == "all":
            output = output + sum(inputs)
        elif self.residual == "top":
            output = output + inputs[self.top_input]
        return self.layer_norm(output)

    def input_exploitation(self) -> torch.Tensor:
        """Eq. 11 (Fig. 5): `s_j = sum |W_j| / sum_j' sum |W_j'|`, W_j the columns of W_1 reading input j."""
        mass = self.fc1.weight.detach().abs().reshape(self.fc1.out_features, self.num_inputs, -1).sum(dim=(0, 2))
        return mass / mass.sum()


# --------------------------------------------------------------------------------------------------- readouts
class LayerAggregationReadout(FusedStateReadout):
    """A readout that fuses the paper's layer representations H^1..H^L into one tensor (`aggregate`): the encoder
    memory, or the decoder's single output feature."""

    def fuse(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        # states[0] is the embedding output; the paper's H^1..H^L are states[1:]
        return self.aggregate(states[1:])

    def aggregate(self, layers: Sequence[torch.Tensor]) -> torch.Tensor:
        raise NotImplementedError


class LinearCombination(LayerAggregationReadout, FusionParameters):
    """Eq. 5: `Ĥ = sum_{l=1}^{L} W_l H^l`, trainable d x d matrices W_l (no normalisation, no bias)."""

    def __init__(self, config: DeepRepresentationsConfig, num_layers: int):
        super().__init__()
        self.weight = nn.Parameter(self.top_layer_identity(num_layers, config.d_model))  # weight[l-1] = W_l

    @staticmethod
    def top_layer_identity(num_layers: int, d_model: int) -> torch.Tensor:
        """W_L = I, W_l = 0 below: Eq. 5 starts as the plain Transformer (see the module docstring)."""
        weight = torch.zeros(num_layers, d_model, d_model)
        weight[-1] = torch.eye(d_model)
        return weight

    def init_fusion_weights(self):
        init.copy_(self.weight, self.top_layer_identity(*self.weight.shape[:2]).to(self.weight))

    def fusion_weights(self) -> dict[str, torch.Tensor]:
        """Frobenius norm of each W_l."""
        return {"linear_combination_norm": self.weight.detach().flatten(1).norm(dim=1)}

    def aggregate(self, layers: Sequence[torch.Tensor]) -> torch.Tensor:
        # h W_l^T for row vectors h, summed over l
        return torch.einsum("lbtd,led->bte", torch.stack(list(layers)), self.weight.to(layers[0].dtype))


class IterativeAggregation(LayerAggregationReadout):
    """Eq. 6: `Ĥ^1 = H^1`, `Ĥ^l = AGG(H^l, Ĥ^{l-1})` for l = 2..L; the output is Ĥ^L. `nodes[l-2]` computes Ĥ^l."""

    def __init__(self, config: DeepRepresentationsConfig, num_layers: int, ffn_dim: int):
        super().__init__()
        # Eq. 6's x = H^l is the input from the higher layer: "top" for Table 4's residual
        self.nodes = nn.ModuleList(LayerAggregation(config, 2, ffn_dim, top_input=0) for _ in range(num_layers - 1))

    def fusion_weights(self) -> dict[str, torch.Tensor]:
        """Eq. 11 exploitation of (H^l, Ĥ^{l-1}) by each node Ĥ^l."""
        return {f"iterative_node{l}_exploitation": node.input_exploitation() for l, node in enumerate(self.nodes, 2)}

    def aggregate(self, layers: Sequence[torch.Tensor]) -> torch.Tensor:
        aggregated = layers[0]
        for node, layer in zip(self.nodes, layers[1:]):
            aggregated = node(layer, aggregated)
        return aggregated


# --------------------------------------------------------------------------------------------------- connections
class DenseConnection(Connection):
    """Eq. 4: `H^l = Layer(H^{l-1}) + sum_{i=1}^{l-1} H^i` (H^0, the embeddings, is not added)."""

    def forward(self, layer_idx: int, output: torch.Tensor, states: Sequence[torch.Tensor]) -> torch.Tensor:
        # states = [H^0 .. H^{l-1}]
        return output + sum(states[1:layer_idx]) if layer_idx >= 2 else output


class HierarchicalAggregation(Connection):
    """Fig. 2 / Sec. 3.1.1: after layer 2i, node `Ĥ^i = AGG(H^{2i-1}, H^{2i}[, Ĥ^{i-1}])` replaces H^{2i} as the
    state of the stack, so layer 2i+1 (the next sub-tree) reads Ĥ^i and the top state is Ĥ^{L/2}. `nodes[i-1]`
    computes Ĥ^i; `node_inputs()` names what each node combines."""

    def __init__(self, config: DeepRepresentationsConfig, num_layers: int, ffn_dim: int):
        super().__init__()
        # input order of the paper's formula: (H^{2i-1}, H^{2i}, Ĥ^{i-1}); H^{2i} is the "top" one (Table 4)
        self.nodes = nn.ModuleList(
            LayerAggregation(config, 2 if i == 1 else 3, ffn_dim, top_input=1) for i in range(1, num_layers // 2 + 1)
        )

    def node_inputs(self) -> list[tuple[str, ...]]:
        """What each node Ĥ^i combines, e.g. `[("H1", "H2"), ("H3", "H4", "Ĥ1")]` for 4 layers."""
        return [
            (f"H{2 * i - 1}", f"H{2 * i}") + ((f"Ĥ{i - 1}",) if i > 1 else ()) for i in range(1, len(self.nodes) + 1)
        ]

    def forward(self, layer_idx: int, output: torch.Tensor, states: Sequence[torch.Tensor]) -> torch.Tensor:
        if layer_idx == 0 or layer_idx % 2:
            return output  # the embeddings, or H^{2i-1}: kept as the input of layer 2i
        i = layer_idx // 2
        # states[2i-1] = H^{2i-1}, states[2i-2] = Ĥ^{i-1} (the state entering the sub-tree of node i)
        lower = (states[layer_idx - 2],) if i > 1 else ()
        return self.nodes[i - 1](states[layer_idx - 1], output, *lower)


# --------------------------------------------------------------------------------------------------- attention
class MultiLayerSelfAttention(MultiHeadAttention):
    """Eq. 8: `C^l_{-i} = ATT_i(Q^l, K^{l-i}, V^{l-i})`, i = 1..k, each with its own projections, and
    `C^l = AGG(C^l_{-1}, .., C^l_{-k})`. This module's own projections are ATT_1 (over layer l-1, the layer's input);
    `lower_attentions[i-2]` is ATT_i over `lower_states[-i]` = H^{l-i}. In the decoder each ATT_i keys/values through
    its own cache slot."""

    def __init__(
        self,
        config: DeepRepresentationsConfig,
        num_heads: int,
        is_decoder: bool,
        cache_slot: int | None,
        lower_cache_slots: Sequence[int | None],
        ffn_dim: int,
    ):
        super().__init__(config, num_heads, is_causal=is_decoder, layer_idx=cache_slot)
        self.lower_attentions = nn.ModuleList(
            MultiHeadAttention(config, num_heads, is_causal=is_decoder, layer_idx=slot) for slot in lower_cache_slots
        )
        # pre-norm: every attended state is normalised, like the layer's own input
        self.lower_norms = (
            nn.ModuleList(nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) for _ in lower_cache_slots)
            if config.normalize_before
            else None
        )
        # C^l_{-1}, from the highest layer, is "top" for Table 4's residual
        self.aggregation = LayerAggregation(config, len(lower_cache_slots) + 1, ffn_dim, top_input=0)

    def forward(self, hidden_states: torch.Tensor, context: LayerContext) -> tuple[torch.Tensor, torch.Tensor | None]:
        # the extra attentions are called through their methods, not as modules, so that `output_attentions` records
        # one map per layer (this module's, over layer l-1)
        contexts = []
        top_context, weights = self.attend(
            hidden_states, hidden_states, context.attention_mask, context.cache, **context.attention_kwargs
        )
        contexts.append(top_context)
        for i, attention in enumerate(self.lower_attentions, start=2):
            lower = context.lower_states[-i]
            if self.lower_norms is not None:
                lower = self.lower_norms[i - 2](lower)
            key_states, value_states = attention.project_keys_values(lower, context.cache)
            contexts.append(
                attention.attend_to(
                    hidden_states, key_states, value_states, context.attention_mask, **context.attention_kwargs
                )[0]
            )
        return self.aggregation(*contexts), weights


# --------------------------------------------------------------------------------------------------- diversity
def layer_diversity(layer_states: Sequence[torch.Tensor], mask: torch.Tensor | None) -> torch.Tensor:
    """Eq. 10 of one stack: `1/(L-1) sum_{l=1}^{L-1} mean_n (1 - cos^2(h^l_n, h^{l+1}_n))` over the positions where
    `mask` (batch, length) is true (all positions when None), pooled over the batch."""
    states = torch.stack(list(layer_states))  # (L, batch, length, d)
    cosine = F.cosine_similarity(states[:-1].float(), states[1:].float(), dim=-1)  # (L-1, batch, length)
    distance = (1 - cosine.square()).mean(dim=0)  # mean over the L-1 adjacent pairs, per position
    if mask is None:
        return distance.mean()
    mask = mask.bool()
    return distance[mask].sum() / mask.sum().clamp(min=1)


def layer_representations(connection: nn.Module | None, hidden_states: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """H^1..H^L, the layer representations Eq. 10 compares, from a stack's hidden states `[H^0, h^1 .. h^L]` (h^l
    the output of backbone layer l): h^l itself, except under the dense connection, whose H^l is Eq. 4's
    `h^l + sum_{i<l} H^i` (replayed with the stack's own connection)."""
    if not isinstance(connection, DenseConnection):
        return list(hidden_states[1:])
    states = [hidden_states[0]]
    for layer_idx, output in enumerate(hidden_states[1:], start=1):
        states.append(connection(layer_idx, output, states))
    return states[1:]


def position_spread(states: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
    """`||X - mean_positions(X)|| / ||X||` over each sentence's real positions (`mask`, (batch, length); all when
    None), averaged over the sentences: 0 when every position holds the same vector (a collapsed memory)."""
    states = states.float()
    mask = (states.new_ones(states.shape[:2]) if mask is None else mask.to(states.dtype)).unsqueeze(-1)
    mean = (states * mask).sum(1, keepdim=True) / mask.sum(1, keepdim=True)
    return (((states - mean) * mask).norm(dim=(1, 2)) / (states * mask).norm(dim=(1, 2))).mean()


@dataclass
class DeepRepresentationsSeq2SeqLMOutput(LayerFusionSeq2SeqLMOutput):
    """`LayerFusionSeq2SeqLMOutput` plus, in forward passes with `labels` in training mode or with
    `diversity_weight > 0`: `encoder_layer_diversity` and `decoder_layer_diversity`, each stack's Eq. 10;
    `layer_diversity`, D of Eq. 9, their mean (`loss` is `CE - diversity_weight * D`); `memory_spread`, the
    `position_spread` of the cross-attention memory over the real source positions."""

    layer_diversity: torch.Tensor | None = None
    encoder_layer_diversity: torch.Tensor | None = None
    decoder_layer_diversity: torch.Tensor | None = None
    memory_spread: torch.Tensor | None = None


# --------------------------------------------------------------------------------------------------- models
class DeepRepresentationsModel(LayerFusionModel):
    config_class = DeepRepresentationsConfig

    def build_readout(self, config: DeepRepresentationsConfig, is_decoder: bool) -> FusedStateReadout:
        strategy, layers, ffn_dim = config.stack_settings(is_decoder)
        if strategy == "linear":
            return LinearCombination(config, layers)
        if strategy == "iterative":
            return IterativeAggregation(config, layers, ffn_dim)
        return TopLayerReadout()

    def build_connection(self, config: DeepRepresentationsConfig, is_decoder: bool) -> Connection | None:
        strategy, layers, ffn_dim = config.stack_settings(is_decoder)
        if strategy == "dense":
            return DenseConnection()
        if strategy == "hierarchical":
            return HierarchicalAggregation(config, layers, ffn_dim)
        return None

    def build_sublayer(
        self, config: DeepRepresentationsConfig, is_decoder: bool, kind: str, layer_idx: int, cache_slots: CacheSlots
    ) -> AttentionSublayer | FeedForwardSublayer:
        if kind != "s" or not config.attends_lower_layers(is_decoder, layer_idx):
            return super().build_sublayer(config, is_decoder, kind, layer_idx, cache_slots)
        k = config.multi_layer_attention_k
        if is_decoder:
            slot, lower_slots = cache_slots.next_self(), [cache_slots.next_self() for _ in range(k - 1)]
        else:
            slot, lower_slots = layer_idx, [None] * (k - 1)
        return MultiLayerSelfAttention(
            config,
            config.decoder_attention_heads if is_decoder else config.encoder_attention_heads,
            is_decoder,
            slot,
            lower_slots,
            config.stack_settings(is_decoder)[2],
        )


@register_family
class DeepRepresentationsForConditionalGeneration(LayerFusionForConditionalGeneration, GenerationMixin):
    """Deep representations with the layer-diversity objective (Eq. 9): with `labels` and `diversity_weight > 0`,
    `loss = CE - diversity_weight * D`; D, each stack's term and the memory's spread are in the output (see
    `DeepRepresentationsSeq2SeqLMOutput`)."""

    config_class = DeepRepresentationsConfig
    model_class = DeepRepresentationsModel
    output_class = DeepRepresentationsSeq2SeqLMOutput
    training_diagnostics = DIVERSITY_DIAGNOSTICS

    def measures_diversity(self) -> bool:
        """Whether a forward pass with `labels` computes D: when it is part of the loss (lambda > 0), and in training
        for the logs (Eq. 10 needs two layers per stack; the config refuses lambda > 0 with fewer)."""
        logged = self.training and min(self.config.encoder_layers, self.config.decoder_layers) >= 2
        return self.config.diversity_weight > 0 or logged

    def extra_loss_needs_hidden_states(self) -> bool:
        return self.measures_diversity()  # the layer outputs h^l of both stacks

    def extra_loss(self, outputs, attention_mask, labels) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """`-lambda * D` (Eq. 9) and the diagnostics of `DeepRepresentationsSeq2SeqLMOutput`."""
        weight = self.config.diversity_weight
        if not self.measures_diversity():
            return None, {}
        if not outputs.encoder_hidden_states:
            if weight > 0:
                raise ValueError(
                    "Layer diversity (Eq. 10) needs the encoder's layer outputs: pass `input_ids` with the labels, or "
                    "`encoder_outputs` computed with `output_hidden_states=True` (or set diversity_weight=0)."
                )
            return None, {}
        # lambda = 0: measured for the logs only, without gradient
        with torch.set_grad_enabled(torch.is_grad_enabled() and weight > 0):
            diagnostics = self.diversity_diagnostics(outputs, attention_mask, labels)
        return (-(weight * diagnostics["layer_diversity"]) if weight > 0 else None), diagnostics

    def diversity_diagnostics(
        self, outputs: LayerFusionSeq2SeqModelOutput, attention_mask: torch.Tensor | None, labels: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Each stack's Eq. 10 over its layer representations, their mean D, and the memory's spread."""
        encoder = layer_diversity(
            layer_representations(self.model.encoder.connection, outputs.encoder_hidden_states), attention_mask
        )
        decoder = layer_diversity(
            layer_representations(self.model.decoder.connection, outputs.decoder_hidden_states), labels.ne(-100)
        )
        return {
            "layer_diversity": (encoder + decoder) / 2,
            "encoder_layer_diversity": encoder,
            "decoder_layer_diversity": decoder,
            "memory_spread": position_spread(outputs.encoder_last_hidden_state, attention_mask),
        }
