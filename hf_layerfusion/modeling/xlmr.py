"""Initialise any hf_layerfusion family from XLM-R (Conneau et al. 2020), as in XLM-T (Ma et al. 2020) and the
OPUS-100 experiments of GTrans (Table V): 12-layer encoder from XLM-R base, 6-layer decoder, one shared vocabulary.

`from_xlmr` maps an `XLMRobertaModel` onto the backbone weight for weight:

| XLM-R                                              | backbone                                             |
|----------------------------------------------------|------------------------------------------------------|
| `embeddings.word_embeddings`                       | `model.shared` (= encoder/decoder tokens, `lm_head`) |
| `embeddings.position_embeddings` + token type 0    | `model.{encoder,decoder}.embeddings.embed_positions` |
| `embeddings.LayerNorm`                             | `model.{encoder,decoder}.embeddings.layernorm_embedding` |
| `encoder.layer.i.attention.self.{query,key,value}` | `...layers.i.self_attn.{q,k,v}_proj`                 |
| `encoder.layer.i.attention.output.dense`           | `...layers.i.self_attn.out_proj`                     |
| `encoder.layer.i.attention.output.LayerNorm`       | `...layers.i.self_attn_block.layer_norm`             |
| `encoder.layer.i.intermediate.dense`               | `...layers.i.ffn.fc1`                                |
| `encoder.layer.i.output.dense`                     | `...layers.i.ffn.fc2`                                |
| `encoder.layer.i.output.LayerNorm`                 | `...layers.i.ffn_block.layer_norm`                   |

Choices (tested in tests/test_xlmr.py):
- Positions: XLM-R's table has `max_position_embeddings` rows *including* RoBERTa's padding offset (514 = 512 + pad 1
  + 1), the backbone's `"learned"` table has `max_position_embeddings + pad_token_id + 1` rows, so the backbone gets
  `max_position_embeddings = xlmr.max_position_embeddings - pad_token_id - 1` (512 for XLM-R base) and the tables
  have the same shape. Position ids are computed the same way (from `pad_token_id + 1`, pads keep the pad position).
- Token types: the backbone has none; XLM-R adds `token_type_embeddings[0]` to every token (its default token type),
  which is folded exactly into every row of the position table.
- The decoder's embedding sub-layer (positions + LayerNorm) is initialised from XLM-R's too, always: the decoder reads
  the same XLM-R token embeddings, and XLM-R's positions and embedding LayerNorm are what those embeddings were
  trained with (fairseq's `transformer_from_pretrained_xlm`, on which XLM-T builds, does the same).
- `init_decoder=True` initialises decoder layer i's self-attention, feed-forward and their LayerNorms from XLM-R layer
  i (the bottom `decoder_layers` XLM-R layers; for 6 decoder layers from 12 XLM-R layers: layers 0-5), as fairseq's
  `transformer_from_pretrained_xlm` does by matching layer names. Cross-attention and its LayerNorm stay fresh.
- Everything else (cross-attention without `init_decoder`, the whole decoder stack without it, `final_logits_bias`,
  fusion parameters, XLM-R's pooler and MLM head, which are not used) is listed in `model.conversion_report`.
- The backbone keys that fix XLM-R's function (sizes, activation, LayerNorm epsilon, embedding conventions) are taken
  from the XLM-R config; overriding one of them with another value is refused with a `ValueError`. Dropouts, the
  decoder depth and every family knob may be overridden. The decoder defaults to half XLM-R's depth (12 -> 6, the
  XLM-T / GTrans OPUS-100 setting) with XLM-R's widths, so XLM-R base gives exactly the `"opus100"` preset.
"""

from __future__ import annotations

import os

import torch
from transformers import (
    AutoConfig,
    AutoTokenizer,
    PreTrainedModel,
    XLMRobertaConfig,
    XLMRobertaModel,
)
from transformers.models.xlm_roberta.modeling_xlm_roberta import XLMRobertaPreTrainedModel

from ..file_checks import check_local_or_hub, reraise_hub_error
from .conversion import build_with_weights
from .registry import check_model_type

# XLM-R sub-module name -> backbone name inside one encoder/decoder layer (the self-attention and FFN sub-layers)
_XLMR_LAYER_RENAMES = {
    "attention.self.query.": "self_attn.q_proj.",
    "attention.self.key.": "self_attn.k_proj.",
    "attention.self.value.": "self_attn.v_proj.",
    "attention.output.dense.": "self_attn.out_proj.",
    "attention.output.LayerNorm.": "self_attn_block.layer_norm.",
    "intermediate.dense.": "ffn.fc1.",
    "output.dense.": "ffn.fc2.",
    "output.LayerNorm.": "ffn_block.layer_norm.",
}

# Backbone keys whose value is dictated by the XLM-R checkpoint (shapes or the function the encoder computes).
_ENCODER_KEYS_FROM_XLMR = (
    "vocab_size",
    "d_model",
    "encoder_layers",
    "encoder_attention_heads",
    "encoder_ffn_dim",
    "max_position_embeddings",
    "position_embedding_type",
    "layernorm_embedding",
    "scale_embedding",
    "normalize_before",
    "activation_function",
    "layer_norm_eps",
    "pad_token_id",
)
# ... and, with `init_decoder=True`, for the decoder layers too
_DECODER_KEYS_FROM_XLMR = ("decoder_attention_heads", "decoder_ffn_dim")

XLMR_SPECIAL_TOKENS = {"bos_token_id": 0, "cls_token_id": 0, "pad_token_id": 1, "eos_token_id": 2, "sep_token_id": 2}


def _as_xlmr_model(xlmr_model_or_path) -> XLMRobertaModel:
    """The bare `XLMRobertaModel` of an instance (any XLM-R head model is accepted), a local directory or a Hub id."""
    if isinstance(xlmr_model_or_path, (str, os.PathLike)):
        path = check_local_or_hub(xlmr_model_or_path, "XLM-R checkpoint")
        try:
            model_type = AutoConfig.from_pretrained(path).model_type
        except OSError as error:
            if os.path.isdir(path):
                raise
            reraise_hub_error(path, "XLM-R checkpoint", error)
        if model_type != XLMRobertaConfig.model_type:
            raise ValueError(
                f"from_xlmr needs an XLM-R checkpoint (model_type 'xlm-roberta'); {os.fspath(xlmr_model_or_path)!r} "
                f"has model_type {model_type!r}."
            )
        # the pooler is not used; leaving it out avoids "newly initialised" warnings for MLM checkpoints
        return XLMRobertaModel.from_pretrained(path, add_pooling_layer=False)
    if isinstance(xlmr_model_or_path, XLMRobertaPreTrainedModel):
        return xlmr_model_or_path.base_model
    if isinstance(xlmr_model_or_path, PreTrainedModel):
        raise ValueError(
            f"from_xlmr needs an XLM-R model (model_type 'xlm-roberta'), got {type(xlmr_model_or_path).__name__} "
            f"(model_type {xlmr_model_or_path.config.model_type!r})."
        )
    raise TypeError(
        f"from_xlmr expects an XLMRobertaModel or a path / Hub id, got {type(xlmr_model_or_path).__name__}."
    )


def backbone_config_from_xlmr(xlmr_config: XLMRobertaConfig) -> dict:
    """Backbone keys of an XLM-R config (see the module docstring); refuses XLM-R variants the backbone cannot run."""
    position_type = getattr(xlmr_config, "position_embedding_type", "absolute")
    if position_type != "absolute":
        raise ValueError(
            f"XLM-R with position_embedding_type={position_type!r} is not supported: the backbone has absolute "
            "learned positions only."
        )
    if xlmr_config.is_decoder:
        raise ValueError("from_xlmr needs an XLM-R encoder; this config has `is_decoder=True` (causal attention).")
    if xlmr_config.pad_token_id is None or xlmr_config.eos_token_id is None:
        raise ValueError(
            f"from_xlmr needs pad and eos ids in the XLM-R config, got pad_token_id={xlmr_config.pad_token_id}, "
            f"eos_token_id={xlmr_config.eos_token_id}."
        )
    max_positions = xlmr_config.max_position_embeddings - xlmr_config.pad_token_id - 1
    if max_positions < 1:
        raise ValueError(
            f"XLM-R max_position_embeddings={xlmr_config.max_position_embeddings} leaves no position after the "
            f"padding offset (pad_token_id={xlmr_config.pad_token_id})."
        )
    return dict(
        vocab_size=xlmr_config.vocab_size,
        d_model=xlmr_config.hidden_size,
        encoder_layers=xlmr_config.num_hidden_layers,
        encoder_attention_heads=xlmr_config.num_attention_heads,
        encoder_ffn_dim=xlmr_config.intermediate_size,
        decoder_layers=max(1, xlmr_config.num_hidden_layers // 2),
        decoder_attention_heads=xlmr_config.num_attention_heads,
        decoder_ffn_dim=xlmr_config.intermediate_size,
        max_position_embeddings=max_positions,
        position_embedding_type="learned",
        layernorm_embedding=True,
        scale_embedding=False,
        normalize_before=False,
        activation_function=xlmr_config.hidden_act,
        layer_norm_eps=xlmr_config.layer_norm_eps,
        dropout=xlmr_config.hidden_dropout_prob,
        attention_dropout=xlmr_config.attention_probs_dropout_prob,
        activation_dropout=0.0,
        init_std=xlmr_config.initializer_range,
        pad_token_id=xlmr_config.pad_token_id,
        bos_token_id=xlmr_config.bos_token_id,
        eos_token_id=xlmr_config.eos_token_id,
        tie_word_embeddings=True,
    )


def check_xlmr_overrides(backbone: dict, overrides: dict, init_decoder: bool) -> None:
    """Refuse `overrides` of the keys XLM-R's weights fix (`backbone`, from `backbone_config_from_xlmr`; the decoder's
    too with `init_decoder`), naming the key: `from_xlmr` and the multilingual script check before building."""
    fixed = _ENCODER_KEYS_FROM_XLMR + (_DECODER_KEYS_FROM_XLMR if init_decoder else ())
    for key in fixed:
        if key in overrides and overrides[key] != backbone[key]:
            raise ValueError(
                f"`{key}={overrides[key]!r}` does not match the XLM-R checkpoint, which needs `{key}={backbone[key]!r}`"
                + (
                    " for the decoder layers it initialises (init_decoder=True)."
                    if key in _DECODER_KEYS_FROM_XLMR
                    else "."
                )
            )
    if init_decoder:
        decoder_layers = overrides.get("decoder_layers", backbone["decoder_layers"])
        if decoder_layers > backbone["encoder_layers"]:
            raise ValueError(
                f"init_decoder=True initialises decoder layer i from XLM-R layer i, but `decoder_layers={decoder_layers}` "
                f"exceeds XLM-R's {backbone['encoder_layers']} layers."
            )


def _xlmr_state_dict(xlmr: XLMRobertaModel, num_decoder_layers: int) -> dict[str, torch.Tensor]:
    """XLM-R weights under backbone names; decoder layers 0..num_decoder_layers-1 from XLM-R layers 0..n-1."""
    source = xlmr.state_dict()
    words = source["embeddings.word_embeddings.weight"]
    # token type 0 is added to every token by XLM-R: fold it into every position row (exact)
    positions = source["embeddings.position_embeddings.weight"] + source["embeddings.token_type_embeddings.weight"][0]
    # the encoder/decoder token embeddings and the output projection are tied to `model.shared`
    state_dict = {"model.shared.weight": words}
    for stack in ("encoder", "decoder"):
        state_dict[f"model.{stack}.embeddings.embed_positions.weight"] = positions
        for param in ("weight", "bias"):
            state_dict[f"model.{stack}.embeddings.layernorm_embedding.{param}"] = source[
                f"embeddings.LayerNorm.{param}"
            ]
    for key, value in source.items():
        if not key.startswith("encoder.layer."):
            continue  # embeddings are handled above; the pooler is not used
        index, rest = key[len("encoder.layer.") :].split(".", 1)
        new_rest = next(
            (new + rest[len(old) :] for old, new in _XLMR_LAYER_RENAMES.items() if rest.startswith(old)), None
        )
        if new_rest is None:
            raise ValueError(f"XLM-R parameter {key!r} has no counterpart in the backbone's post-norm encoder layer.")
        state_dict[f"model.encoder.layers.{index}.{new_rest}"] = value
        if int(index) < num_decoder_layers:
            state_dict[f"model.decoder.layers.{index}.{new_rest}"] = value
    return state_dict


def from_xlmr(xlmr_model_or_path, model_type: str = "gtrans", init_decoder: bool = False, **config_overrides):
    """Build a `model_type` model whose encoder (and shared vocabulary) is XLM-R's.

    Args:
        xlmr_model_or_path: an `XLMRobertaModel` (or any XLM-R model with a head, e.g. `XLMRobertaForMaskedLM`),
            a local checkpoint directory or a Hub id such as `"FacebookAI/xlm-roberta-base"`.
        model_type: the hf_layerfusion family (`"gtrans"`, `"plain_transformer"`, ...).
        init_decoder: also initialise decoder layer i's self-attention and feed-forward (with their LayerNorms) from
            XLM-R layer i (XLM-T); cross-attention stays fresh.
        config_overrides: any other config key (family knobs, dropouts, `decoder_layers`, `label_smoothing`, ...).
            Keys dictated by XLM-R may only be repeated with XLM-R's value.

    With every fusion switched off, the encoder computes exactly what the XLM-R model computes (every layer's
    hidden state). `model.conversion_report` = `{"loaded": [...], "freshly_initialised": [...]}` (state-dict keys).
    """
    check_model_type(model_type)
    xlmr = _as_xlmr_model(xlmr_model_or_path)
    backbone = backbone_config_from_xlmr(xlmr.config)
    check_xlmr_overrides(backbone, config_overrides, init_decoder)
    config_kwargs = {**backbone, **config_overrides}
    state_dict = _xlmr_state_dict(xlmr, config_kwargs["decoder_layers"] if init_decoder else 0)
    source = f"XLM-R checkpoint {xlmr.config.name_or_path or '(in memory)'}"
    return build_with_weights(model_type, config_kwargs, state_dict, source)


def load_xlmr_tokenizer(name_or_path, config=None, **kwargs):
    """XLM-R's tokenizer (`AutoTokenizer`), checked to use the special ids the model was built with.

    `config` (an hf_layerfusion config, e.g. `model.config`) gives the expected bos/pad/eos ids; without it the
    XLM-R convention is expected (bos = cls = 0, pad = 1, eos = sep = 2). A tokenizer that disagrees is refused with
    a `ValueError` naming the special token, since the model would then read and write the wrong ids.
    """
    tokenizer = AutoTokenizer.from_pretrained(check_local_or_hub(name_or_path, "XLM-R tokenizer"), **kwargs)
    expected = dict(XLMR_SPECIAL_TOKENS)
    if config is not None:
        expected.update(
            bos_token_id=config.bos_token_id,
            cls_token_id=config.bos_token_id,
            pad_token_id=config.pad_token_id,
            eos_token_id=config.eos_token_id,
            sep_token_id=config.eos_token_id,
        )
    wrong = {name: getattr(tokenizer, name) for name, value in expected.items() if getattr(tokenizer, name) != value}
    if wrong:
        raise ValueError(
            f"Tokenizer {os.fspath(name_or_path)!r} has special ids {wrong}; the model expects "
            f"{ {name: expected[name] for name in wrong} }."
        )
    return tokenizer
