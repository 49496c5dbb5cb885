"""Re-Transformer (Liu & Chen 2021, "Re-Transformer: A Self-Attention Based Model for Machine Translation";
`shared/papers/re-transformer.txt`).

The Re-Transformer re-arranges the sub-layers of the encoder and shortens the decoder. An encoder layout string
names the sub-layers of every encoder layer, `s` a self-attention sub-layer and `f` a feed-forward sub-layer, with
`-` between layers (paper Sec. 3.3, Table 2): `sf-sf-sf-sf-sf-sf` is the Transformer encoder, `s-sf-s-sf-s-sf` the
Re-Transformer's (two self-attention sub-layers per feed-forward sub-layer). Re-Transformer-n has that 6-layer
encoder and an n-layer decoder (Sec. 3.4; presets `re_transformer_2` and `re_transformer_4`). `ReTransformerConfig()`
without a preset or layer counts is Re-Transformer-2, the paper's best (Table 3), at the backbone's Transformer-base
size; the backbone size presets (`multi30k`, `iwslt`, `opus100`) set `decoder_layers` themselves (6 for the first
two), so name the decoder depth with them (`from_preset("multi30k", decoder_layers=2)`).

Choices where the paper is silent (tested in tests/test_re_transformer.py):
- every sub-layer is a residual block with its own LayerNorm, as in the Transformer (post-norm by default), so a
  layer `s` is `LN(x + SelfAttn(x))` and `sff` applies two feed-forward blocks in a row;
- the paper counts "layers" as the `-`-separated groups, so `encoder_layers` is the number of groups in the layout
  (`s-s-sf-sf-sf` has 5); it is derived from the layout, and an explicit `encoder_layers` that disagrees is an
  error rather than silently ignored;
- the paper only changes the encoder; the decoder layout is configurable the same way (`decoder_layout`, default
  `scf` in every layer, i.e. the Transformer decoder), since the backbone builds any layout;
- an encoder layout needs at least one self-attention sub-layer (every Table 2 layout has several; without one the
  encoder never relates source positions to each other): `"f-f"` is refused;
- loading a Marian / plain checkpoint (`from_marian(..., model_type="re_transformer", encoder_layout=...)`) maps
  layer by layer: layer i's first `s` / `c` / `f` sub-layer takes checkpoint layer i's self-attention /
  cross-attention / feed-forward sub-layer (with its LayerNorm). Repeated sub-layers of a kind within a layer
  (`ffn_2` of `sff`) and layers beyond the checkpoint's have no source and keep their fresh initialisation
  (listed in `conversion_report["freshly_initialised"]`); checkpoint sub-layers the layout has no place for are
  listed in `conversion_report["not_loaded"]`.
"""

from __future__ import annotations

import re

from huggingface_hub.dataclasses import strict
from transformers.generation import GenerationMixin

from ..modeling.configuration import LayerFusionConfig
from ..modeling.layers import SUBLAYER_KINDS
from ..modeling.model import LayerFusionForConditionalGeneration, LayerFusionModel
from ..modeling.registry import register_family

LAYER_SEPARATOR = "-"
ENCODER_SUBLAYERS = {"s": "self-attention", "f": "feed-forward"}
DECODER_SUBLAYERS = {"s": "self-attention", "c": "cross-attention", "f": "feed-forward"}
RE_TRANSFORMER_ENCODER_LAYOUT = "s-sf-s-sf-s-sf"
# the decoder depth of the default config: Re-Transformer-2, the paper's best (Table 3)
RE_TRANSFORMER_DECODER_LAYERS = 2
# a backbone state-dict key of the first sub-layer of a kind (as Marian checkpoints map): stack, layer, sub-layer
SUBLAYER_KEY = re.compile(
    rf"^model\.(encoder|decoder)\.layers\.(\d+)\.({'|'.join(SUBLAYER_KINDS.values())})(?:_block)?\."
)


def parse_layout(layout: str, field_name: str, sublayers: dict[str, str]) -> list[str]:
    """The per-layer sub-layer strings of a layout such as `"s-sf"` (-> `["s", "sf"]`), or a `ValueError` naming
    the offending character and its 0-based position."""
    if not isinstance(layout, str) or not layout:
        raise ValueError(f"`{field_name}` must be a non-empty layout string such as 'sf-sf', got {layout!r}.")
    allowed = ", ".join(f"'{kind}' ({what})" for kind, what in sublayers.items())
    for position, char in enumerate(layout):
        if char == LAYER_SEPARATOR:
            if position == 0 or position == len(layout) - 1 or layout[position - 1] == LAYER_SEPARATOR:
                raise ValueError(
                    f"`{field_name}` {layout!r}: '-' at position {position} leaves an empty layer; '-' goes between "
                    "two layers, never at the start, the end or twice in a row."
                )
        elif char not in sublayers:
            raise ValueError(
                f"`{field_name}` {layout!r}: character {char!r} at position {position} is not a sub-layer of this "
                f"stack; use {allowed}, with '-' between layers."
            )
    return layout.split(LAYER_SEPARATOR)


@strict
class ReTransformerConfig(LayerFusionConfig):
    r"""
    Re-Transformer configuration: the backbone keys of `LayerFusionConfig` plus

    Args:
        encoder_layout: sub-layers of each encoder layer, `s` self-attention, `f` feed-forward, `-` between layers
            (paper Table 2). Default: the Re-Transformer's `s-sf-s-sf-s-sf`; `sf-sf-sf-sf-sf-sf` is the Transformer.
        decoder_layout: the same for the decoder, with `c` for cross-attention; `None` (default) means `scf` in
            each of `decoder_layers` layers (the Transformer decoder), 2 of them when `decoder_layers` is not given
            either (Re-Transformer-2). The decoder as a whole needs at least one `s`
            (generation counts decoded positions in its cache) and one `c` (else the source is never read); any
            non-empty combination of `s`, `c`, `f` is allowed in a layer. Stored as the explicit string.
        encoder_layers / decoder_layers: derived from the layouts when not given (the number of `-`-separated
            layers); a given value that disagrees with its layout is a `ValueError`.

    `ReTransformerConfig()` is Re-Transformer-2 (paper Table 3: the Re-Transformer encoder, 2 decoder layers) at
    the Transformer-base size of the backbone defaults (d 512, FFN 2048, 8 heads), as is
    `ReTransformerConfig.from_preset("re_transformer_2")`; `"re_transformer_4"` has 4 decoder layers. Other sizes
    are keyword overrides; a backbone size preset brings its own `decoder_layers` (see the module docstring).
    """

    model_type = "re_transformer"
    family_presets = {
        "re_transformer_2": dict(
            encoder_layout=RE_TRANSFORMER_ENCODER_LAYOUT, decoder_layers=RE_TRANSFORMER_DECODER_LAYERS
        ),
        "re_transformer_4": dict(encoder_layout=RE_TRANSFORMER_ENCODER_LAYOUT, decoder_layers=4),
    }

    encoder_layers: int | None = None
    decoder_layers: int | None = None
    encoder_layout: str = RE_TRANSFORMER_ENCODER_LAYOUT
    decoder_layout: str | None = None

    def __post_init__(self, **kwargs):
        # layer counts follow the layouts; check_consistency (run by the base __post_init__) rejects a mismatch
        self.check_types()  # before the layer counts and layouts are derived from each other
        if self.encoder_layers is None:
            self.encoder_layers = len(parse_layout(self.encoder_layout, "encoder_layout", ENCODER_SUBLAYERS))
        if self.decoder_layout is None:
            layers = RE_TRANSFORMER_DECODER_LAYERS if self.decoder_layers is None else self.decoder_layers
            self.decoder_layout = LAYER_SEPARATOR.join(["scf"] * layers)
        if self.decoder_layers is None:
            self.decoder_layers = len(parse_layout(self.decoder_layout, "decoder_layout", DECODER_SUBLAYERS))
        super().__post_init__(**kwargs)

    def check_consistency(self) -> None:
        super().check_consistency()
        for stack, sublayers in (("encoder", ENCODER_SUBLAYERS), ("decoder", DECODER_SUBLAYERS)):
            layout = getattr(self, f"{stack}_layout")
            layers = parse_layout(layout, f"{stack}_layout", sublayers)
            if len(layers) != getattr(self, f"{stack}_layers"):
                raise ValueError(
                    f"`{stack}_layers` ({getattr(self, f'{stack}_layers')}) contradicts `{stack}_layout` {layout!r}, "
                    f"which has {len(layers)} layers; leave `{stack}_layers` out (it follows the layout) or change "
                    "the layout."
                )
        if "s" not in self.encoder_layout:
            raise ValueError(
                f"`encoder_layout` {self.encoder_layout!r} has no self-attention sub-layer ('s'): its encoder would "
                "never relate source positions to each other; every layout of the paper (Table 2) has several."
            )
        for kind in ("s", "c"):
            if kind not in self.decoder_layout:
                raise ValueError(
                    f"`decoder_layout` {self.decoder_layout!r} has no {DECODER_SUBLAYERS[kind]} sub-layer ('{kind}'); "
                    "the decoder needs at least one ('s': generation counts decoded positions in its cache; 'c': "
                    "the source is read through it)."
                )

    @property
    def encoder_layer_layouts(self) -> list[str]:
        return parse_layout(self.encoder_layout, "encoder_layout", ENCODER_SUBLAYERS)

    @property
    def decoder_layer_layouts(self) -> list[str]:
        return parse_layout(self.decoder_layout, "decoder_layout", DECODER_SUBLAYERS)

    @classmethod
    def adapt_marian_checkpoint(
        cls, backbone: dict, overrides: dict, state_dict: dict
    ) -> tuple[dict, dict, list[str]]:
        """`from_marian` hook: the config keywords and the part of a Marian checkpoint (backbone names) that fits
        the requested layouts, plus the checkpoint keys left out (see the module docstring for the rule). A stack
        given a layout but no layer count takes its count from the layout, not from the checkpoint."""
        config_kwargs = dict(backbone)
        for stack in ("encoder", "decoder"):
            if f"{stack}_layout" in overrides and f"{stack}_layers" not in overrides:
                del config_kwargs[f"{stack}_layers"]
        config_kwargs.update(overrides)
        config = cls(**config_kwargs)
        layer_sublayers = {
            stack: [{SUBLAYER_KINDS[kind] for kind in layout} for layout in layouts]
            for stack, layouts in (("encoder", config.encoder_layer_layouts), ("decoder", config.decoder_layer_layouts))
        }
        kept, not_loaded = {}, []
        for key, value in state_dict.items():
            match = SUBLAYER_KEY.match(key)
            if match is not None:
                stack, layer, name = match.group(1), int(match.group(2)), match.group(3)
                layers = layer_sublayers[stack]
                if layer >= len(layers) or name not in layers[layer]:
                    not_loaded.append(key)
                    continue
            kept[key] = value
        return config_kwargs, kept, sorted(not_loaded)


class ReTransformerModel(LayerFusionModel):
    """The backbone built from the config's layer layouts (`TransformerLayer` builds any `s`/`c`/`f` sequence)."""

    config_class = ReTransformerConfig


@register_family
class ReTransformerForConditionalGeneration(LayerFusionForConditionalGeneration, GenerationMixin):
    config_class = ReTransformerConfig
    model_class = ReTransformerModel
