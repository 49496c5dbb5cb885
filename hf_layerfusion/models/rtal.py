"""RTAL, residual tree aggregation of layers (Li & Li 2021, "Residual Tree Aggregation of Layers for Neural
Machine Translation", arXiv:2107.14590; equations numbered as in `shared/papers/rtal.txt`).

The outputs of the top 2^n layers of a stack are the leaves of a full binary tree; its nodes are computed in
post-order (left sub-tree, right sub-tree, node), each by an aggregation function of its two children, and every
node except the root (the last node of the post-order) also gets a residual connection (Sec. 4.1). The root
replaces the top layer "in the subsequent process" (Fig. 1): in the encoder it is the memory every
cross-attention reads, in the decoder the feature the output projection reads. The stack itself is unchanged
("RTAL keeps the original structure of Transformer unchanged, it only add extra layers"): the tree is not fed
back into the layers, so KV-cached decoding needs nothing beyond the position-wise tree on the new positions.

Aggregation functions (Sec. 4.2, Table 4), one instance with its own parameters per tree node:
- `mean` (Eq. 7): `(x + y) / 2`;
- `concat_ffn` (Eq. 8): `FFN([x; y])`, one hidden layer, 2d -> `aggregation_ffn_dim` -> d;
- `ewp_ffn` (Eq. 9-10, the paper's best, default). The extracted paper text lost both formulas; the prose keeps:
  an element-wise product of the two inputs transformed by an FFN, "LN denotes layer normalization", one
  hyper-parameter and one trainable quantity, "dropout and residual connection are also employed". Our reading:
      Eq. 9:   m = x ⊙ y
      Eq. 10:  z = LN(m + γ · Dropout(FFN(m)))
  with FFN(m) = W_2 act(W_1 m + b_1) + b_2 of inner size `aggregation_ffn_dim` (the hyper-parameter) and a
  trainable scalar scale γ (initialised to 1, so that at the start Eq. 10 is a standard post-norm residual FFN
  block over the product); the residual is the one inside the formula, around the FFN.

**The paper's setting** (`RTALConfig.from_preset("rtal_paper")`, `RTAL_PAPER_SETTING`): EWP + FFN nodes (Table 4's
best row), the `children` residual (the most direct reading of Sec. 4.1, below), trees in both stacks (Table 3's
"+both") and pre-norm layers: the paper trained "on the tensor2tensor" with its suggested configuration (Sec.
5.1.2), and tensor2tensor's `transformer_base` normalises before each sub-layer and after each stack. At the
backbone's default size that is the paper's Transformer-Base + RTAL (6L); `from_preset("rtal_paper",
**BACKBONE_PRESETS["multi30k"])` gives other sizes. The package's defaults differ in two places, kept so that
existing checkpoints load unchanged: post-norm (GTrans and Dou et al. train post-norm Transformers) and the
`block_input` residual.

Choices where the paper is silent (tested in tests/test_rtal.py; measurements in docs/rtal.md):
- **tree**: leaves are the top `tree_leaves` layers L-n+1 .. L (default 2^floor(log2 L): the last 4 of 6, as in
  the paper); a node over layers a..b splits them in halves a..m, m+1..b. With 6 layers and 4 leaves: post-order
  (3,4), (5,6), root (3..6).
- **residual** ("In the process of generating child nodes, the residual connection is also used except for the
  last node"): `tree_residual="children"`, the paper's most direct reading, adds the node's own two inputs
  (`AGG(x, y) + x + y`, as Dou et al.'s AGG does). `"block_input"` (default; this package's reading) makes a
  node over layers a..b that is not the root add `s_{a-1}`, the state entering layer a: the sub-tree acts as a
  residual block around layers a..b in the sense of He et al. 2016, whose input it adds to its output, and brings
  the layers below the leaves into the tree (layer 2 for the 4-of-6 tree; the embeddings when the leaves start at
  layer 1). `"none"` drops the residual (an ablation). The root never gets one, so what cross-attention and the
  output projection read is not shifted.
- **root normalisation** (`root_layer_norm`, default True): the root replaces the top layer, and every reader of
  the top layer (cross-attention, the output projection) receives it layer-normalised: in post-norm stacks the top
  layer ends in a LayerNorm, in pre-norm stacks the stack's final LayerNorm follows it (and normalises every leaf,
  see `LayerStack.readout_states`). `ewp_ffn`'s Eq. 10 ends in LN already; for `mean` and `concat_ffn` the root
  passes through a LayerNorm of its own (2d parameters per tree). Without it the `concat_ffn` root is a raw FFN
  output, not normalised like the top layer it replaces, and a post-norm model collapsed (the measurements:
  docs/rtal.md). `root_layer_norm=False` gives Eq. 7 / Eq. 8 exactly as printed at the
  root (no effect on `ewp_ffn`, whose LN is part of Eq. 10). A saved config without the key gets True, the
  behaviour of the checkpoints saved before the switch existed.
- **FFN size**: `aggregation_ffn_dim` defaults to 2 * d_model. The paper's Table 1 gives +8M parameters for
  RTAL(6L)-Base over Transformer-Base, i.e. about 1.3M per node for 6 nodes at d = 512, the size of a
  512 -> ~1024-1300 -> 512 FFN.
- activation and FFN-internal dropout are the backbone's (`activation_function`, `activation_dropout`); the
  dropout of Eq. 10 is `dropout`.
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

from ..modeling.configuration import LayerFusionConfig
from ..modeling.extension_points import FusedStateReadout, FusionParameters, TopLayerReadout
from ..modeling.layers import FeedForward
from ..modeling.model import LayerFusionForConditionalGeneration, LayerFusionModel
from ..modeling.registry import register_family

AGGREGATION_FUNCTIONS = ("mean", "concat_ffn", "ewp_ffn")
TREE_RESIDUALS = ("block_input", "children", "none")
# the paper's setting (see the module docstring): `RTALConfig.from_preset("rtal_paper")`
RTAL_PAPER_SETTING = dict(aggregation_function="ewp_ffn", tree_residual="children", normalize_before=True)


def default_tree_leaves(num_layers: int) -> int:
    """2^floor(log2 L): the largest full binary tree over the top layers (4 of 6, as in the paper)."""
    return 1 << (num_layers.bit_length() - 1)


@strict
class RTALConfig(LayerFusionConfig):
    r"""
    RTAL configuration: the backbone keys of `LayerFusionConfig` plus

    Args:
        encoder_aggregation: aggregate the encoder layers; the tree's root is the cross-attention memory.
            False: cross-attention reads the top layer (Table 3, "+decoder").
        decoder_aggregation: aggregate the decoder layers; the root feeds the output projection. False: the top
            layer does (Table 3, "+encoder"). Both False is exactly the plain Transformer.
        aggregation_function: `"mean"` (Eq. 7), `"concat_ffn"` (Eq. 8) or `"ewp_ffn"` (Eq. 9-10, default).
        encoder_tree_leaves, decoder_tree_leaves: number of top layers the tree aggregates, a power of two in
            [2, layers]; `None` = 2^floor(log2 layers). Ignored (but still checked to be a power of two) for a
            stack whose aggregation is off.
        tree_residual: the residual of every non-root node: `"block_input"` (default, this package's reading; the
            state entering the node's first layer), `"children"` (the paper's most direct reading; its two inputs)
            or `"none"`. See the module docstring.
        root_layer_norm: pass a `mean` / `concat_ffn` root through a LayerNorm of its own, as the top layer it
            replaces is normalised (default True); False computes the root by Eq. 7 / Eq. 8 exactly as printed.
            No effect on `ewp_ffn`, whose Eq. 10 ends in LN.
        aggregation_ffn_dim: inner size of the FFN of Eq. 8 and Eq. 10; `None` = 2 * d_model.

    `RTALConfig.from_preset("rtal_paper")` is the paper's setting (`RTAL_PAPER_SETTING`: EWP + FFN nodes, the
    `children` residual, pre-norm) at the backbone's default Transformer-Base size; other sizes are keyword
    overrides, e.g. `RTALConfig.from_preset("rtal_paper", **BACKBONE_PRESETS["multi30k"])`.
    """

    model_type = "rtal"
    family_presets = {"rtal_paper": RTAL_PAPER_SETTING}

    encoder_aggregation: bool = True
    decoder_aggregation: bool = True
    aggregation_function: str = "ewp_ffn"
    encoder_tree_leaves: int | None = None
    decoder_tree_leaves: int | None = None
    tree_residual: str = "block_input"
    root_layer_norm: bool = True
    aggregation_ffn_dim: int | None = None

    def check_consistency(self) -> None:
        super().check_consistency()
        if self.aggregation_function not in AGGREGATION_FUNCTIONS:
            raise ValueError(
                f"Unknown `aggregation_function` {self.aggregation_function!r}; choose one of {AGGREGATION_FUNCTIONS}."
            )
        if self.tree_residual not in TREE_RESIDUALS:
            raise ValueError(f"Unknown `tree_residual` {self.tree_residual!r}; choose one of {TREE_RESIDUALS}.")
        if self.aggregation_ffn_dim is not None and self.aggregation_ffn_dim < 1:
            raise ValueError(
                f"`aggregation_ffn_dim` must be a positive integer or None, got {self.aggregation_ffn_dim}."
            )
        for side in ("encoder", "decoder"):
            leaves, layers = getattr(self, f"{side}_tree_leaves"), getattr(self, f"{side}_layers")
            if leaves is not None and (leaves < 2 or leaves & (leaves - 1)):
                raise ValueError(
                    f"`{side}_tree_leaves` must be a power of two >= 2 (the post-order binary tree needs 2^n "
                    f"leaves), got {leaves}."
                )
            if not getattr(self, f"{side}_aggregation"):
                continue
            if layers < 2:
                raise ValueError(
                    f"RTAL's tree needs at least 2 layers, but `{side}_layers` is {layers}; set "
                    f"`{side}_aggregation=False` for a single-layer {side}."
                )
            if leaves is not None and leaves > layers:
                raise ValueError(
                    f"`{side}_tree_leaves` ({leaves}) exceeds `{side}_layers` ({layers}): the tree's leaves are "
                    "layer outputs."
                )

    def tree_leaves(self, is_decoder: bool) -> int:
        """Number of top layers the encoder's or decoder's tree aggregates."""
        side = "decoder" if is_decoder else "encoder"
        leaves = getattr(self, f"{side}_tree_leaves")
        return default_tree_leaves(getattr(self, f"{side}_layers")) if leaves is None else leaves


# --------------------------------------------------------------------------------------------------- node functions
class MeanAggregation(nn.Module):
    """Eq. 7: `(x + y) / 2`, no parameters."""

    output_is_normalized = False

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x + y) / 2


class ConcatFFNAggregation(FeedForward):
    """Eq. 8: `FFN([x; y]) = W_2 act(W_1 [x; y] + b_1) + b_2`, 2d -> `ffn_dim` -> d (the backbone FFN with a
    2d-wide input)."""

    output_is_normalized = False

    def __init__(self, config: RTALConfig, ffn_dim: int):
        super().__init__(config, ffn_dim)
        self.fc1 = nn.Linear(2 * config.d_model, ffn_dim)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return super().forward(torch.cat([x, y], dim=-1))


class ProductFFNAggregation(FusionParameters):
    """Eq. 9-10 as read in the module docstring: `m = x ⊙ y`, `z = LN(m + γ · Dropout(FFN(m)))`, γ a trainable
    scalar starting at 1."""

    output_is_normalized = True  # Eq. 10 ends in LN

    def __init__(self, config: RTALConfig, ffn_dim: int):
        super().__init__()
        self.ffn = FeedForward(config, ffn_dim)
        self.scale = nn.Parameter(torch.ones(1))  # γ
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.dropout = config.dropout

    def init_fusion_weights(self):
        init.ones_(self.scale)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        product = x * y  # Eq. 9
        transformed = F.dropout(self.ffn(product), p=self.dropout, training=self.training)
        return self.layer_norm(product + self.scale.to(product.dtype) * transformed)  # Eq. 10


# --------------------------------------------------------------------------------------------------- the tree
@dataclass(frozen=True)
class TreeNode:
    """One node of the tree over 1-based layers `first..last`; its left child covers `first..split`, its right child
    `split+1..last` (a child covering one layer is that layer's output, a leaf)."""

    first: int
    split: int
    last: int
    is_root: bool

    @property
    def name(self) -> str:
        return f"layers_{self.first}_to_{self.last}"


def post_order_tree(first: int, last: int, is_root: bool = True) -> list[TreeNode]:
    """The nodes of the full binary tree over layers `first..last` (a power-of-two count) in post-order."""
    if first == last:
        return []
    split = (first + last) // 2
    return [
        *post_order_tree(first, split, is_root=False),
        *post_order_tree(split + 1, last, is_root=False),
        TreeNode(first, split, last, is_root),
    ]


class ResidualTreeAggregation(FusedStateReadout):
    """The residual tree over the top `config.tree_leaves(is_decoder)` states of a stack (Sec. 4.1); `nodes` lists
    the tree in post-order, `functions[node.name]` is each node's aggregation function (Sec. 4.2). Its root replaces
    the top layer: the memory every cross-attention reads in the encoder, the feature the output projection reads in
    the decoder (one output group)."""

    def __init__(self, config: RTALConfig, is_decoder: bool):
        super().__init__()
        num_layers = config.decoder_layers if is_decoder else config.encoder_layers
        self.nodes = post_order_tree(num_layers - config.tree_leaves(is_decoder) + 1, num_layers)
        self.residual = config.tree_residual
        ffn_dim = config.aggregation_ffn_dim or 2 * config.d_model
        function = {
            "mean": MeanAggregation,
            "concat_ffn": lambda: ConcatFFNAggregation(config, ffn_dim),
            "ewp_ffn": lambda: ProductFFNAggregation(config, ffn_dim),
        }[config.aggregation_function]
        self.functions = nn.ModuleDict({node.name: function() for node in self.nodes})
        # the root replaces the top layer, whose readers receive it layer-normalised (see the module docstring)
        root_function = self.functions[self.nodes[-1].name]
        self.root_layer_norm = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
            if config.root_layer_norm and not root_function.output_is_normalized
            else None
        )

    def fusion_weights(self) -> dict[str, torch.Tensor]:
        """γ of Eq. 10 of every node, in post-order (empty for the parameter-free or scale-free functions)."""
        scales = [f.scale for f in self.functions.values() if isinstance(f, ProductFFNAggregation)]
        return {"node_scale": torch.cat(scales)} if scales else {}

    def fuse(self, states: Sequence[torch.Tensor]) -> torch.Tensor:
        """The root from the states `[s_0 .. s_L]` (`states[l]` is the output of 1-based layer l)."""
        computed = {}  # (first, last) of a node -> its value

        def value(first: int, last: int) -> torch.Tensor:
            return states[first] if first == last else computed[first, last]

        for node in self.nodes:
            left, right = value(node.first, node.split), value(node.split + 1, node.last)
            output = self.functions[node.name](left, right)
            if not node.is_root:
                if self.residual == "block_input":
                    output = output + states[node.first - 1]
                elif self.residual == "children":
                    output = output + left + right
            computed[node.first, node.last] = output
        return output if self.root_layer_norm is None else self.root_layer_norm(output)


class RTALModel(LayerFusionModel):
    config_class = RTALConfig

    def build_readout(self, config: RTALConfig, is_decoder: bool) -> FusedStateReadout:
        aggregation = config.decoder_aggregation if is_decoder else config.encoder_aggregation
        return ResidualTreeAggregation(config, is_decoder) if aggregation else TopLayerReadout()


@register_family
class RTALForConditionalGeneration(LayerFusionForConditionalGeneration, GenerationMixin):
    """RTAL with the tied output projection reading the decoder tree's root; loss, logits and generation are the
    backbone's single-group ones."""

    config_class = RTALConfig
    model_class = RTALModel
