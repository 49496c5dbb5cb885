"""The base class of every model of the package: configuration class, supported attention implementations,
weight initialisation, checked saving and loading."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from torch import nn
from transformers import initialization as init
from transformers.modeling_utils import PreTrainedModel
from transformers.utils import cached_file

from ..file_checks import check_save_directory, check_weight_files, checkpoint_config
from .configuration import LayerFusionConfig
from .embeddings import SinusoidalPositionalEmbedding
from .extension_points import Connection, FusionParameters, Readout


# the stacks' final LayerNorms (`model.encoder.layer_norm.weight`): there exactly when `normalize_before=True`
_FINAL_LAYER_NORM = re.compile(r"(^|\.)(encoder|decoder)\.layer_norm\.")


def check_generation_config_file(name_or_path, subfolder: str = "") -> None:
    """A local model's `generation_config.json` parses: transformers reads a damaged one as absent and generates
    with the model config's settings without a word (beam size, lengths lost). Hub ids pass (the Hub client checks
    its downloads)."""
    file = Path(os.fspath(name_or_path)).expanduser() / subfolder / "generation_config.json"
    if not file.is_file():
        return
    try:
        json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(
            f"Generation config {str(file)!r} is not valid JSON ({error}): it is damaged or was cut short. Save the "
            "model again, or pass `generation_config=` to from_pretrained."
        ) from error


def saved_config(name_or_path, kwargs: dict) -> dict | None:
    """The checkpoint's own config.json as saved: a local directory's, or the Hub cache's copy of a Hub model's
    (from_pretrained has downloaded it); None without one."""
    location = {key: kwargs[key] for key in ("cache_dir", "revision", "subfolder") if key in kwargs}
    try:
        config_file = cached_file(name_or_path, "config.json", local_files_only=True, **location)
    except OSError:
        return None
    return checkpoint_config(Path(config_file).parent) if config_file else None


def non_finite_tensors(model) -> list[str]:
    """Names of the model's floating-point weights (parameters and saved buffers) that hold NaN or inf."""
    return sorted(
        name
        for name, tensor in model.state_dict().items()
        if tensor.is_floating_point() and tensor.device.type != "meta" and not torch.isfinite(tensor).all()
    )


def family_part_prefixes(model) -> tuple[str, ...]:
    """`"name."` of every module a family adds to the shared backbone (connections, readouts, modules holding
    fusion parameters): what starts fresh when a checkpoint of another family is loaded into this one."""
    return tuple(
        f"{name}."
        for name, module in model.named_modules()
        if name and isinstance(module, (Connection, Readout, FusionParameters))
    )


def tensors_the_saved_config_lacks(model, saved: dict) -> set[str]:
    """The tensor names of `model` that a model of its class built from the checkpoint's own config.json (`saved`,
    of the same family) does not have: what a family switch turned on at loading adds (a deep-representations
    checkpoint saved with `aggregation="none"` loaded with aggregation on: its connection's tensors). Built on the
    meta device: no memory, no initialisation."""
    with torch.device("meta"):
        saved_model = type(model)(type(model.config).from_dict(saved))
    return set(model.state_dict()) - set(saved_model.state_dict())


def _listed(keys: list[str]) -> str:
    return f"{keys[:8]}{f' and {len(keys) - 8} more' if len(keys) > 8 else ''}"


def check_loaded_tensors(model, info: dict, checkpoint: str, saved: dict | None) -> None:
    """Raise a `ValueError` naming the checkpoint and the tensors when `model`, loaded from it (`info`:
    transformers' loading info; `saved`: its config.json), is not the checkpoint's model: a tensor it needs that the
    checkpoint lacks (it would start random), a tensor of the checkpoint it has no place for (dropped), or NaN / inf
    weights.

    Allowed: the parts this family adds (`family_part_prefixes`) start fresh where the checkpoint's own config has
    none of them: a checkpoint of another family loaded on purpose (its config.json's `model_type` differs: a plain
    Transformer as GTrans or deep representations), or of this family with a fusion switched on at loading
    (`tensors_the_saved_config_lacks`); transformers' load report names them. A base model from a checkpoint with a
    head leaves the head's tensors out."""
    family = model.config.model_type
    loaded_as = f"{type(model).__name__} (model_type {family!r})"
    missing = sorted(info["missing_keys"])
    saved_family = saved.get("model_type") if saved is not None else None
    other_family = saved_family is not None and saved_family != family
    fresh = family_part_prefixes(model)
    if other_family:
        missing = [key for key in missing if not key.startswith(fresh)]
    elif saved_family is not None and any(key.startswith(fresh) for key in missing):
        switched_on = tensors_the_saved_config_lacks(model, saved)
        missing = [key for key in missing if not (key.startswith(fresh) and key in switched_on)]
    unexpected = sorted(info["unexpected_keys"])
    if model.base_model is model:
        # a base model's checkpoint tensors lose the head model's prefix; what stays outside its modules is the head's
        children = {name for name, _ in model.named_children()}
        unexpected = [key for key in unexpected if key.split(".")[0] in children]
    anyway = "; `output_loading_info=True` loads it anyway and returns transformers' loading info to handle"
    if unexpected and other_family:
        raise ValueError(
            f"{checkpoint!r} holds a {saved_family!r} checkpoint; loaded as {loaded_as} its weights "
            f"{_listed(unexpected)} would be dropped. Load it with its own family (AutoModelForSeq2SeqLM without "
            f"`config=`){anyway}."
        )
    problems = []
    if unexpected:
        problems.append(f"its tensors {_listed(unexpected)} have no place in {loaded_as} and would be dropped")
    if missing:
        problems.append(f"{loaded_as} needs tensors it lacks, which would start random: {_listed(missing)}")
    if problems:
        hint = ""
        if any(_FINAL_LAYER_NORM.search(key) for key in missing + unexpected):
            hint = (
                f" The stacks' final LayerNorms exist only with `normalize_before=True`, and this config has "
                f"normalize_before={model.config.normalize_before}: was it changed after the model was saved?"
            )
        raise ValueError(
            f"Checkpoint {checkpoint!r} does not match the model it is loaded into: {'; '.join(problems)}."
            f"{hint} Restore the config.json the weights were saved with (`model_type`, layer counts, switches) or "
            f"save or copy the checkpoint again{anyway}."
        )
    non_finite = non_finite_tensors(model)
    if non_finite:
        raise ValueError(
            f"Checkpoint {checkpoint!r} holds NaN or inf in the weights {_listed(non_finite)} (a training run that "
            "diverged, or damaged files): the model would translate every sentence to '' or noise. Load an earlier "
            "checkpoint; `output_loading_info=True` loads it anyway, listing them in info['non_finite_keys']."
        )


def cast_to_floating(model, not_floating: dict[str, str]) -> dict[str, str]:
    """The checkpoint tensors of `not_floating` ({name: dtype}: `check_weight_files`) that `model` loads into one of
    its floating-point weights, under the checkpoint's name or that name with the base model's prefix added or
    removed (a base model from a checkpoint with a head, and back). Tensors the model has no place for are the load
    report's unexpected keys, not cast."""
    state = model.state_dict()
    prefix = f"{model.base_model_prefix}."
    cast = {}
    for name, dtype in sorted(not_floating.items()):
        for key in (name, name.removeprefix(prefix), prefix + name):
            if key in state and state[key].is_floating_point():
                cast[name] = dtype
                break
    return cast


class CheckedSaveLoadMixin:
    """Put before `PreTrainedModel` in the bases of the package's models:

    - `save_pretrained` onto an existing file raises (transformers logs one line and saves nothing);
    - `from_pretrained` of a checkpoint raises a `ValueError` naming the checkpoint and the tensors where the model
      loaded is not the checkpoint's (`check_loaded_tensors`) instead of printing a load report: missing tensors (a
      damaged file, or a config.json that no longer describes its weights: `normalize_before` flipped), tensors that
      would be dropped (a `model_type` edited from gtrans to plain_transformer, GTrans weights under a plain
      Transformer's `config=`), NaN / inf weights, non-floating tensors cast into floating weights
      (`cast_to_floating`); and a local `generation_config.json` that does not parse.
      Loading a checkpoint of another family into a family with more parts stays allowed (a plain Transformer
      checkpoint as GTrans or deep representations: the family's own weights start fresh), as does a checkpoint of
      the family with a fusion switched on at loading (deep representations saved with `aggregation="none"`), both
      named in transformers' load report, and a base model from a checkpoint with a head. `output_loading_info=True`,
      transformers' argument for a caller who handles the load report, returns `(model, info)` without these errors,
      `info["non_finite_keys"]` naming NaN / inf weights and `info["cast_keys"]` the cast ones. Weights given as
      `state_dict=` without a checkpoint (`pretrained_model_name_or_path=None`) are the caller's and not checked.
    """

    def save_pretrained(self, save_directory, *args, **kwargs):
        check_save_directory(save_directory)
        return super().save_pretrained(save_directory, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        # a damaged weight file is named before transformers reads it
        not_floating = check_weight_files(pretrained_model_name_or_path)
        if isinstance(pretrained_model_name_or_path, (str, os.PathLike)) and "generation_config" not in kwargs:
            check_generation_config_file(pretrained_model_name_or_path, kwargs.get("subfolder", ""))
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(
            pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
        )
        cast = cast_to_floating(model, not_floating)
        if want_info:
            info["non_finite_keys"] = non_finite_tensors(model)
            info["cast_keys"] = cast
            return model, info
        if cast:
            raise ValueError(
                f"Checkpoint {os.fspath(pretrained_model_name_or_path)!r} holds weights that are not floating-point: "
                f"{_listed([f'{name} ({dtype})' for name, dtype in cast.items()])}. They would be cast into the "
                "model's floating weights without a word (an integer tensor is no trained weight): the file was "
                "written by other code or edited; save the model again with `save_pretrained`. "
                "`output_loading_info=True` loads it anyway, listing them in info['cast_keys']."
            )
        if pretrained_model_name_or_path is not None:
            saved = saved_config(pretrained_model_name_or_path, kwargs)
            check_loaded_tensors(model, info, os.fspath(pretrained_model_name_or_path), saved)
        return model


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
        if isinstance(module, FusionParameters):
            # family modules own their fusion parameters and say how the paper initialises them
            module.init_fusion_weights()

    def fusion_parameter_names(self) -> list[str]:
        """Names (as `named_parameters()` gives them) of the fusion weights: the parameters held directly by the
        `FusionParameters` modules (gates, mixing weights, scales; their LayerNorms and feed-forward layers are
        sub-modules, not counted). `LayerFusionSeq2SeqTrainer` keeps them out of weight decay unless
        `config.decay_fusion_weights`."""
        return [
            f"{module_name}.{name}" if module_name else name
            for module_name, module in self.named_modules()
            if isinstance(module, FusionParameters)
            for name, _ in module.named_parameters(recurse=False)
        ]
