"""Checks of user input shared by the models, the converters and the command-line scripts.

Every check raises an error that names the bad value, before any expensive work or any write: a wrong argument
must never give a silent wrong answer or overwrite a user's file. The model-level checks (`check_decoder_groups`,
`check_model_inputs`, `CheckedSaveLoadMixin`) are plain functions / a mixin so that every family's backbone calls the
same code.
"""

from __future__ import annotations

import json
import numbers
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

# --------------------------------------------------------------------------------------------------- paths


def looks_like_local_path(name_or_path: str | os.PathLike) -> bool:
    """Whether `name_or_path` can only be a file-system path: a Hub id is `name` or `owner/name`, so an absolute
    path, `./`, `../`, `~`, a backslash, two or more `/`, or a first component that is a local directory mean a
    path."""
    text = os.fspath(name_or_path)
    first = text.split("/", 1)[0]
    return (
        os.path.isabs(text)
        or text.startswith((".", "~"))
        or "\\" in text
        or text.count("/") >= 2
        or ("/" in text and os.path.isdir(first))
    )


def check_local_or_hub(name_or_path, what: str, *, must_be_dir: bool = True) -> str:
    """`name_or_path` as a string after checking that a local one exists (`FileNotFoundError` naming it otherwise,
    instead of a Hub error about a bad repo id). Strings that may be Hub ids and are not local pass unchanged."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path or Hub id, got {type(name_or_path).__name__} {name_or_path!r}.")
    text = os.fspath(name_or_path)
    if not text:
        raise ValueError(f"{what} is empty.")
    path = Path(text).expanduser()
    if path.exists():
        if must_be_dir and not path.is_dir():
            raise NotADirectoryError(f"{what} {text!r} is a file, not a model directory.")
        return str(path)
    if looks_like_local_path(text):
        raise FileNotFoundError(f"{what} {text!r}: no such local directory ({path.absolute()}).")
    return text


def reraise_hub_error(name_or_path: str, what: str, error: OSError):
    """Re-raise an `OSError` of a Hub lookup for something that was not found locally, saying both readings."""
    raise OSError(
        f"{what} {name_or_path!r} is not a local directory (none at {Path(name_or_path).absolute()}) and could not "
        f"be loaded as a Hugging Face Hub repo id: {error}"
    ) from error


def checkpoint_model_type(name_or_path) -> str | None:
    """The `model_type` of a local checkpoint's `config.json` (None when there is no such local file)."""
    config_file = Path(os.fspath(name_or_path)).expanduser() / "config.json"
    if not config_file.is_file():
        return None
    try:
        return json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{config_file} is not a readable JSON config: {error}") from error


def check_input_file(path, what: str) -> Path:
    """An existing regular file (`FileNotFoundError` / `IsADirectoryError` naming it)."""
    path = Path(os.fspath(path)).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist.")
    if not path.is_file():
        raise IsADirectoryError(f"{what} {str(path)!r} is not a file.")
    return path


def read_utf8(path, what: str = "File") -> str:
    """The text of `path`; a file that is not UTF-8 is refused with its name and the byte offset."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{what} {str(path)!r} is not UTF-8 text (byte {error.start}: {error.object[error.start:error.start + 4]!r})."
        ) from error


def _same_path(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def check_output_file(path, inputs: Iterable = (), what: str = "Output file") -> Path:
    """A file we may write: not one of `inputs`, not a directory, in a directory that exists (checked before any
    work, so a typo does not cost a whole run)."""
    path = Path(os.fspath(path)).expanduser()
    for source in inputs:
        if source is not None and _same_path(path, Path(os.fspath(source)).expanduser()):
            raise ValueError(f"{what} {str(path)!r} is the input {os.fspath(source)!r}: writing it would destroy it.")
    if path.is_dir():
        raise IsADirectoryError(f"{what} {str(path)!r} is a directory.")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{what} {str(path)!r}: directory {str(path.parent)!r} does not exist.")
    return path


def check_output_dir(output_dir, inputs: Iterable = (), *, overwrite: bool = False, what: str = "output_dir") -> Path:
    """A directory we may write into: not a file, neither one of `inputs` nor inside / around one, and empty (or
    missing) unless `overwrite`."""
    if not isinstance(output_dir, (str, os.PathLike)) or not os.fspath(output_dir):
        raise ValueError(f"{what} must be a non-empty path, got {output_dir!r}.")
    path = Path(os.fspath(output_dir)).expanduser()
    resolved = path.resolve()
    for source in inputs:
        source_path = Path(os.fspath(source)).expanduser().resolve()
        if resolved == source_path or source_path in resolved.parents or resolved in source_path.parents:
            raise ValueError(
                f"{what} {str(path)!r} overlaps the input {os.fspath(source)!r}: writing there would overwrite it."
            )
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{what} {str(path)!r} is a file, not a directory.")
    if not overwrite and path.is_dir() and any(path.iterdir()):
        raise FileExistsError(
            f"{what} {str(path)!r} already exists and is not empty ({sorted(p.name for p in path.iterdir())[:5]}); "
            "choose another directory or pass --overwrite_output_dir."
        )
    return path


def check_save_directory(save_directory) -> None:
    """`save_pretrained` target: refuse an existing file (transformers only logs an error and saves nothing)."""
    if not isinstance(save_directory, (str, os.PathLike)) or not os.fspath(save_directory):
        raise ValueError(f"save_directory must be a non-empty path, got {save_directory!r}.")
    if os.path.isfile(save_directory):
        raise FileExistsError(
            f"save_directory {os.fspath(save_directory)!r} is an existing file; save_pretrained needs a directory."
        )


def check_distributed_launch(use_cpu: bool, script: str) -> None:
    """Refuse a multi-process launch (`accelerate launch`, `torchrun`: `LOCAL_WORLD_SIZE` > 1) on a machine with
    fewer GPUs than processes, unless the run is on CPUs (`--use_cpu True`, `accelerate launch --cpu`). Without a GPU
    each process sets itself up as a single-process run (accelerate only logs a warning), so N processes would
    train N separate models into the same output dir and exit successfully."""
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    on_cpu = use_cpu or os.environ.get("ACCELERATE_USE_CPU", "false").lower() in ("1", "true", "yes")
    if processes <= 1 or on_cpu:
        return
    gpus = torch.accelerator.device_count()
    if gpus < processes:
        raise ValueError(
            f"Launched as {processes} processes on this machine (LOCAL_WORLD_SIZE={processes}, e.g. by `accelerate "
            f"launch --config_file examples/accelerate_multigpu.yaml`) but {gpus} GPU(s) are visible: the processes "
            f"would not form one distributed run but train {processes} separate models into the same --output_dir. "
            f"Launch one process per GPU (`accelerate launch --num_processes N`), or train data-parallel on CPUs: "
            f"`CUDA_VISIBLE_DEVICES= accelerate launch --multi_gpu --num_processes {processes} {script} ... "
            "--use_cpu True`."
        )


# --------------------------------------------------------------------------------------------------- numbers


def check_positive_int(value, name: str, *, allow_none: bool = False):
    """`value` if it is a positive integer (bools and floats refused), else a `ValueError` naming it."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
    return int(value)


def _as_int(value, name: str) -> int:
    """An integer element (Python, NumPy or 0-d integer tensor); bools, floats and strings are refused."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.is_floating_point() or value.dtype == torch.bool:
            raise ValueError(f"`{name}` must hold integers, got the tensor {value!r}.")
        return int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"`{name}` must hold integers, got {value!r} ({type(value).__name__}).")
    return int(value)


def check_decoder_groups(groups, num_groups: int, name: str = "decoder_groups") -> list[int]:
    """Sorted 1-based decoder group numbers; `None` means every group. A string (`"12"` is not `[1, 2]`), a float
    (`[1.7]` is not `[1]`), a bool, a repeated, out-of-range or empty selection is refused naming the value."""
    if groups is None:
        return list(range(1, num_groups + 1))
    if isinstance(groups, torch.Tensor):
        groups = groups.reshape(-1).tolist() if not groups.is_floating_point() else [groups]
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
        raise ValueError(f"`{name}` must be a list of 1-based group numbers, got {groups!r} ({type(groups).__name__}).")
    values = [_as_int(group, name) for group in groups]
    if not values:
        raise ValueError(f"`{name}` is empty; give at least one group in [1, {num_groups}] or None for all.")
    repeated = sorted({value for value in values if values.count(value) > 1})
    if repeated:
        raise ValueError(f"`{name}` repeats group(s) {repeated}: {list(groups)!r}.")
    outside = [value for value in values if not 1 <= value <= num_groups]
    if outside:
        raise ValueError(f"`{name}` must be 1-based group numbers in [1, {num_groups}], got {outside} in {values}.")
    return sorted(values)


# --------------------------------------------------------------------------------------------------- model inputs


def check_model_inputs(
    config,
    input_ids=None,
    attention_mask=None,
    inputs_embeds=None,
    name: str = "input_ids",
    past_length: int = 0,
):
    """Shapes and values of one stack's inputs (`name` = "input_ids" or "decoder_input_ids"): a 2-D integer batch
    with at least one row and one position, token ids in [0, vocab_size), `inputs_embeds` of width d_model, and an
    attention mask (2-D of length `past_length` + the new positions, or 4-D) of the same batch size. Value checks
    are skipped while compiling (they need the data)."""
    embeds_name = "inputs_embeds" if name == "input_ids" else name.replace("input_ids", "inputs_embeds")
    mask_name = "attention_mask" if name == "input_ids" else name.replace("input_ids", "attention_mask")
    if input_ids is not None and inputs_embeds is not None:
        raise ValueError(f"Give `{name}` or `{embeds_name}`, not both.")
    if input_ids is not None:
        if not isinstance(input_ids, torch.Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor, got {type(input_ids).__name__}.")
        if input_ids.is_floating_point() or input_ids.dtype == torch.bool or input_ids.is_complex():
            raise TypeError(f"`{name}` must hold integer token ids, got dtype {input_ids.dtype}.")
        if input_ids.dim() != 2:
            raise ValueError(
                f"`{name}` must be 2-D (batch, length), got shape {tuple(input_ids.shape)}"
                + ("; add a batch dimension with `.unsqueeze(0)`." if input_ids.dim() == 1 else ".")
            )
        batch_shape = tuple(input_ids.shape)
        if not torch.compiler.is_compiling() and input_ids.numel():
            low, high = int(input_ids.min()), int(input_ids.max())
            if low < 0 or high >= config.vocab_size:
                bad = low if low < 0 else high
                raise ValueError(
                    f"`{name}` holds token id {bad}, outside the vocabulary [0, {config.vocab_size}) "
                    "(a tokenizer that does not match the model?)."
                )
    elif inputs_embeds is not None:
        if not isinstance(inputs_embeds, torch.Tensor) or inputs_embeds.dim() != 3:
            shape = tuple(inputs_embeds.shape) if isinstance(inputs_embeds, torch.Tensor) else type(inputs_embeds)
            raise ValueError(f"`{embeds_name}` must be a 3-D tensor (batch, length, d_model), got {shape}.")
        if inputs_embeds.shape[-1] != config.d_model:
            raise ValueError(
                f"`{embeds_name}` has width {inputs_embeds.shape[-1]}, the model's d_model is {config.d_model}."
            )
        batch_shape = tuple(inputs_embeds.shape[:2])
    else:
        return
    if batch_shape[0] == 0 or batch_shape[1] == 0:
        raise ValueError(f"`{name}` is an empty batch (shape {batch_shape}); give at least one token of one sentence.")
    if attention_mask is None:
        return
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"`{mask_name}` must be a torch.Tensor, got {type(attention_mask).__name__}.")
    if attention_mask.dim() == 2:
        expected = (batch_shape[0], past_length + batch_shape[1])
        if tuple(attention_mask.shape) != expected:
            raise ValueError(
                f"`{mask_name}` has shape {tuple(attention_mask.shape)} but `{name}` has (batch, length) {batch_shape}"
                + (f" after {past_length} cached positions; expected {expected}." if past_length else ".")
            )
    elif attention_mask.dim() == 4:
        if attention_mask.shape[0] != batch_shape[0]:
            raise ValueError(
                f"`{mask_name}` has batch size {attention_mask.shape[0]} but `{name}` has {batch_shape[0]}."
            )
    else:
        raise ValueError(f"`{mask_name}` must be 2-D or 4-D, got shape {tuple(attention_mask.shape)}.")


# --------------------------------------------------------------------------------------------------- save / load


class CheckedSaveLoadMixin:
    """Put before `PreTrainedModel` in the bases of the package's models:

    - `save_pretrained` onto an existing file raises (transformers logs one line and saves nothing);
    - `from_pretrained` of a local checkpoint of another family (its config.json's `model_type`) whose weights do not
      all fit the model raises, naming the weights that would be dropped (e.g. GTrans fusion weights loaded under a
      plain Transformer's `config=`), instead of printing a load report. Missing weights stay allowed (a plain
      Transformer checkpoint loads as GTrans with fresh fusion weights), and so do the head weights a base model
      leaves out of a checkpoint of its own family.
    """

    def save_pretrained(self, save_directory, *args, **kwargs):
        check_save_directory(save_directory)
        return super().save_pretrained(save_directory, *args, **kwargs)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        want_info = kwargs.pop("output_loading_info", False)
        model, info = super().from_pretrained(
            pretrained_model_name_or_path, *model_args, output_loading_info=True, **kwargs
        )
        saved = (
            checkpoint_model_type(pretrained_model_name_or_path)
            if isinstance(pretrained_model_name_or_path, (str, os.PathLike))
            else None
        )
        unexpected = sorted(info.get("unexpected_keys", ()))
        if saved is not None and saved != model.config.model_type and unexpected:
            raise ValueError(
                f"{os.fspath(pretrained_model_name_or_path)!r} holds a {saved!r} checkpoint; loaded as "
                f"{model.config.model_type!r} ({type(model).__name__}) its weights {unexpected[:8]}"
                f"{' ...' if len(unexpected) > 8 else ''} would be dropped. Load it with its own family "
                "(AutoModelForSeq2SeqLM without `config=`)."
            )
        return (model, info) if want_info else model
