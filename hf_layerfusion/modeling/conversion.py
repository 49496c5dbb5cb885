"""Converters between Hugging Face Marian checkpoints and the hf_layerfusion families.

`from_marian` turns a `MarianMTModel` (e.g. an opus-mt checkpoint) into a model of any family carrying its
weights; with every fusion switched off the result computes exactly what the Marian model computes. `to_marian`
goes back for the plain family, so that a plain Transformer trained here runs wherever Marian models run
(CTranslate2 among them: `hf_layerfusion.inference.export_ctranslate2`).
"""

from __future__ import annotations

import copy
import logging
import os
import re

import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM, MarianConfig, MarianMTModel, PretrainedConfig

from ..file_checks import check_local_or_hub, reraise_hub_error
from .embeddings import SinusoidalPositionalEmbedding
from .registry import FAMILIES, check_model_type

logger = logging.getLogger(__name__)

# Marian parameter name -> backbone parameter name (per layer, after the `model.{encoder,decoder}.layers.N.` prefix)
_MARIAN_LAYER_RENAMES = {
    "self_attn_layer_norm.": "self_attn_block.layer_norm.",
    "encoder_attn_layer_norm.": "encoder_attn_block.layer_norm.",
    "final_layer_norm.": "ffn_block.layer_norm.",
    "fc1.": "ffn.fc1.",
    "fc2.": "ffn.fc2.",
}
_LAYER_KEY = re.compile(r"^(model\.(?:encoder|decoder)\.layers\.\d+\.)(.*)$")


# what `to_marian` requires of a plain Transformer's configuration: Marian computes exactly this
_MARIAN_SETTINGS = {
    "position_embedding_type": "sinusoidal",
    "layernorm_embedding": False,
    "normalize_before": False,
    "tie_word_embeddings": True,
    "layer_norm_eps": 1e-5,
}


def _rename_layer_key(key: str, renames: dict[str, str]) -> str:
    """`key` with the start of its per-layer part renamed by `renames` (keys outside the layers unchanged)."""
    match = _LAYER_KEY.match(key)
    if match is None:
        return key
    prefix, rest = match.groups()
    for old, new in renames.items():
        if rest.startswith(old):
            return prefix + new + rest[len(old):]
    return key


def _rename_marian_key(key: str) -> str | None:
    """Backbone name of a Marian state-dict key; None for keys the backbone rebuilds itself (positions)."""
    if key.endswith("embed_positions.weight"):
        return None  # sinusoidal tables are computed, identical to Marian's (checked by the tests)
    return _rename_layer_key(key, _MARIAN_LAYER_RENAMES)


def _is_computed_table(model, key: str) -> bool:
    module_name = key.rpartition(".")[0]
    return isinstance(model.get_submodule(module_name), SinusoidalPositionalEmbedding)


def _load_report(model, state_dict: dict, source: str) -> dict:
    """Load `state_dict` into `model`; refuse shape mismatches, log what stayed fresh."""
    own = model.state_dict()
    mismatched = sorted(
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(own[k].shape)}" for k, v in state_dict.items()
        if own[k].shape != v.shape
    )
    if mismatched:
        raise ValueError(f"{source} does not fit this {model.config.model_type} architecture: {mismatched}")
    with torch.no_grad():
        for key, value in state_dict.items():
            own[key].copy_(value)
    tied = set(getattr(model, "all_tied_weights_keys", {}) or {})
    # tied copies are loaded through their source; sinusoidal tables are computed, not learned
    fresh = sorted(k for k in own if k not in state_dict and k not in tied and not _is_computed_table(model, k))
    report = {"loaded": sorted(state_dict), "freshly_initialised": fresh}
    logger.info("Loaded %d tensors from %s; freshly initialised: %s", len(state_dict), source, fresh)
    return report


def _tie_source(model, key: str) -> str:
    """The parameter `key` is tied to (following chains of ties), or `key` itself."""
    tied = getattr(model, "all_tied_weights_keys", {}) or {}
    while key in tied:
        key = tied[key]
    return key


def _sublayer(key: str) -> tuple[str, int | None]:
    """(`model.decoder.layers.{}.encoder_attn`, 1) for a key of that sub-layer of layer 1; (key, None) outside the
    layers."""
    match = _LAYER_KEY.match(key)
    if match is None:
        return key, None
    stack, layer = match.group(1).rstrip(".").rsplit(".", 1)
    return f"{stack}.{{}}.{match.group(2).split('.')[0]}", int(layer)


_NO_SUCH_PARAMETER = "this model has no such parameter"


def _unplaced_weights(model, state_dict: dict) -> dict[str, str]:
    """The keys of `state_dict` whose tensors would not be in `model` after loading, each with the reason: the
    model has no such parameter, or the parameter is tied to another one that takes a different tensor of the
    checkpoint (one parameter holds one tensor: the tie's source keeps its own)."""
    own = model.state_dict()
    unplaced = dict.fromkeys((key for key in state_dict if key not in own), _NO_SUCH_PARAMETER)
    for key, value in state_dict.items():
        source = _tie_source(model, key)
        if key in own and source != key and source in state_dict and not torch.equal(value, state_dict[source]):
            unplaced[key] = f"tied to {_sublayer(source)[0].format('<same layer>')}, which keeps its own tensors"
    return unplaced


# the options under which a family has a place for every weight of a Marian checkpoint; said by the refusal
_OPTIONS_THAT_KEEP_WEIGHTS = {
    "layerwise_coordination": (
        "share_layer_parameters=False (decoder layers with parameters of their own) and mixed_attention=False, "
        "unshared_cross_attention=True (a source-target attention with parameters of its own)"
    ),
    "re_transformer": (
        "layouts and layer counts with, in each of the checkpoint's layers, its sub-layers (encoder_layout, "
        "decoder_layout, decoder_layers)"
    ),
}


def _refuse_dropped_weights(model, source: str, unplaced: dict[str, str]) -> None:
    """Raise the error that names the weights of `source` with no place in `model`, grouped by sub-layer (layers
    listed as `{0,1}`), with the reasons and the options that keep them."""
    groups: dict[tuple[str, str], list] = {}
    for key, reason in sorted(unplaced.items()):
        pattern, layer = _sublayer(key)
        groups.setdefault((pattern, reason), []).append(layer)
    lines = "\n".join(
        f"  {pattern.format('{' + ','.join(map(str, sorted(set(layers)))) + '}')} ({len(layers)} tensors): {reason}"
        for (pattern, reason), layers in groups.items()
    )
    model_type = model.config.model_type
    keep = _OPTIONS_THAT_KEEP_WEIGHTS.get(model_type)
    raise ValueError(
        f"{len(unplaced)} weights of {source} have no place in this {model_type} model and would be dropped:\n"
        f"{lines}\n"
        + (f"Options that keep them: {keep}. " if keep else "")
        + "To convert without them anyway, pass allow_dropped_weights=True (they are then listed in "
        "model.conversion_report['not_loaded'])."
    )


def build_with_weights(
    model_type: str,
    config_kwargs: dict,
    state_dict: dict,
    source: str,
    not_loaded: list[str] = (),
    allow_dropped_weights: bool = False,
):
    """A fresh `model_type` model with `config_kwargs`, loaded with `state_dict` (backbone names) via
    `_load_report`; `model.conversion_report` says what was loaded, what stays freshly initialised and which
    checkpoint keys were not loaded (`not_loaded`: keys the caller already left out of `state_dict`, and the keys
    the model has no place for). A checkpoint weight with no place is an error naming it unless
    `allow_dropped_weights`."""
    check_model_type(model_type)
    config = AutoConfig.for_model(model_type, **config_kwargs)
    model = AutoModelForSeq2SeqLM.from_config(config)
    unplaced = dict.fromkeys(not_loaded, _NO_SUCH_PARAMETER) | _unplaced_weights(model, state_dict)
    if unplaced and not allow_dropped_weights:
        _refuse_dropped_weights(model, source, unplaced)
    placed = {key: value for key, value in state_dict.items() if key not in unplaced}
    model.conversion_report = _load_report(model, placed, source)
    model.conversion_report["not_loaded"] = sorted(unplaced)
    model.tie_weights()
    return model


def _load_marian(name_or_path) -> MarianMTModel:
    """A `MarianMTModel` from a local directory or Hub id, after checking that its config is a Marian one: loading
    another architecture's weights with `MarianMTModel` would leave a random model behind a normal load report."""
    path = check_local_or_hub(name_or_path, "Marian checkpoint")
    try:
        config = AutoConfig.from_pretrained(path)
    except OSError as error:
        if os.path.isdir(path):
            raise
        reraise_hub_error(path, "Marian checkpoint", error)
    if config.model_type != MarianConfig.model_type:
        raise ValueError(
            f"from_marian needs a Marian checkpoint (model_type 'marian'); {path!r} has model_type "
            f"{config.model_type!r} (architectures {getattr(config, 'architectures', None)})."
        )
    return MarianMTModel.from_pretrained(path, config=config)


def from_marian(
    marian_model_or_path, model_type: str = "gtrans", allow_dropped_weights: bool = False, **config_overrides
):
    """Build a `model_type` model from a `MarianMTModel` (instance, local directory or Hub id).

    The backbone keys (sizes, activation, dropout, special tokens) are taken from the Marian config; every other
    key of the family (group sizes, fusion switches, ...) comes from `config_overrides` or the family default.
    The Marian generation config (beam size, bad words, max length) is carried over. Fusion parameters start from
    their paper initialisation; `model.conversion_report` lists loaded and freshly initialised tensors.

    Every Marian weight must find a place in the new model: a family or layout that has none for some of them
    (layer-wise coordination with shared layers, or without `unshared_cross_attention`; a Re-Transformer layout
    without a checkpoint layer's sub-layer) is an error naming those weights and the options that keep them, unless
    `allow_dropped_weights=True`, which converts without them and lists them in `conversion_report["not_loaded"]`.
    """
    check_model_type(model_type)
    if isinstance(marian_model_or_path, (str, os.PathLike)):
        marian = _load_marian(marian_model_or_path)
    elif isinstance(marian_model_or_path, MarianMTModel):
        marian = marian_model_or_path
    else:
        raise TypeError(
            f"from_marian expects a MarianMTModel or a path / Hub id, got {type(marian_model_or_path).__name__}."
        )
    mc = marian.config
    if not mc.share_encoder_decoder_embeddings or mc.decoder_vocab_size != mc.vocab_size:
        raise ValueError(
            "from_marian needs a Marian model with one shared vocabulary "
            f"(share_encoder_decoder_embeddings={mc.share_encoder_decoder_embeddings}, "
            f"vocab_size={mc.vocab_size}, decoder_vocab_size={mc.decoder_vocab_size})."
        )
    backbone = dict(
        vocab_size=mc.vocab_size,
        d_model=mc.d_model,
        encoder_layers=mc.encoder_layers,
        decoder_layers=mc.decoder_layers,
        encoder_attention_heads=mc.encoder_attention_heads,
        decoder_attention_heads=mc.decoder_attention_heads,
        encoder_ffn_dim=mc.encoder_ffn_dim,
        decoder_ffn_dim=mc.decoder_ffn_dim,
        max_position_embeddings=mc.max_position_embeddings,
        activation_function=mc.activation_function,
        scale_embedding=mc.scale_embedding,
        dropout=mc.dropout,
        attention_dropout=mc.attention_dropout,
        activation_dropout=mc.activation_dropout,
        init_std=mc.init_std,
        pad_token_id=mc.pad_token_id,
        eos_token_id=mc.eos_token_id,
        bos_token_id=mc.bos_token_id,
        decoder_start_token_id=mc.decoder_start_token_id,
        position_embedding_type="sinusoidal",
        layernorm_embedding=False,
        normalize_before=False,
        tie_word_embeddings=True,
        attn_implementation=mc._attn_implementation,
    )
    state_dict = {}
    for key, value in marian.state_dict().items():
        new_key = _rename_marian_key(key)
        if new_key is not None and not new_key.startswith("lm_head"):
            state_dict[new_key] = value
    source = f"Marian checkpoint {mc.name_or_path or '(in memory)'}"
    config_kwargs, state_dict, not_loaded = FAMILIES[model_type].config.adapt_marian_checkpoint(
        backbone, config_overrides, state_dict
    )
    model = build_with_weights(
        model_type, config_kwargs, state_dict, source, not_loaded, allow_dropped_weights=allow_dropped_weights
    )
    model.generation_config = copy.deepcopy(marian.generation_config)
    return model


def _marian_key(key: str) -> str | None:
    """Marian name of a backbone state-dict key (the inverse of `_rename_marian_key`); None for the computed
    position tables, which `MarianMTModel` builds itself."""
    if key.endswith("embed_positions.weight"):
        return None
    return _rename_layer_key(key, {new: old for old, new in _MARIAN_LAYER_RENAMES.items()})


def to_marian(model) -> MarianMTModel:
    """The `MarianMTModel` that computes what the plain Transformer `model` computes, weight for weight (a copy:
    later changes to `model` do not reach it), with `model`'s generation config.

    Only the plain family maps onto Marian, and only in Marian's own setting (`_MARIAN_SETTINGS`: post-norm,
    sinusoidal positions, no embedding LayerNorm, tied embeddings, LayerNorm epsilon 1e-5); anything else raises a
    `ValueError` naming the setting. The result can be saved with `save_pretrained` and loaded by any Marian
    tooling."""
    if not isinstance(getattr(model, "config", None), PretrainedConfig):
        raise TypeError(f"to_marian expects a plain Transformer model, got {type(model).__name__}.")
    if callable(getattr(model, "get_base_model", None)):  # PEFT's model around a model (its public accessor)
        raise ValueError(
            f"to_marian converts a plain Transformer; got a PEFT model around one ({type(model).__name__}): merge "
            "its adapters first (`model = model.merge_and_unload()`)."
        )
    model_type = model.config.model_type
    if model_type != "plain_transformer" or not hasattr(model, "final_logits_bias"):
        raise ValueError(
            "to_marian converts a plain Transformer (PlainTransformerForConditionalGeneration); got "
            f"{type(model).__name__} (model_type {model_type!r}). Fusion families have no Marian equivalent."
        )
    config = model.config
    different = {key: getattr(config, key) for key, value in _MARIAN_SETTINGS.items() if getattr(config, key) != value}
    if different:
        raise ValueError(
            f"Marian cannot express this plain Transformer: {different} (Marian computes {_MARIAN_SETTINGS})."
        )
    marian_config = MarianConfig(
        vocab_size=config.vocab_size,
        decoder_vocab_size=config.vocab_size,
        share_encoder_decoder_embeddings=True,
        **{
            key: getattr(config, key)
            for key in (
                "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
                "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings", "activation_function",
                "scale_embedding", "dropout", "attention_dropout", "activation_dropout", "init_std", "pad_token_id",
                "bos_token_id", "eos_token_id", "decoder_start_token_id",
            )
        },
        forced_eos_token_id=None,
        tie_word_embeddings=True,
    )
    marian = MarianMTModel(marian_config).to(dtype=model.dtype)
    state_dict = {}
    for key, value in model.state_dict().items():
        marian_key = _marian_key(key)
        if marian_key is not None and not marian_key.startswith("lm_head"):
            state_dict[marian_key] = value.detach().clone()
    missing, unexpected = marian.load_state_dict(state_dict, strict=False)
    # left out on purpose: the computed position tables and the output projection tied to the embeddings
    expected_missing = {"lm_head.weight", "model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"}
    if unexpected or set(missing) - expected_missing:
        raise RuntimeError(
            f"to_marian: the state dict does not map onto MarianMTModel (unexpected {unexpected}, missing "
            f"{sorted(set(missing) - expected_missing)})."
        )
    marian.tie_weights()
    marian.config._attn_implementation = config._attn_implementation
    marian.generation_config = copy.deepcopy(model.generation_config)
    return marian.train(model.training)
