"""Checks of what a user points the package at: local paths or Hub ids, checkpoints, input files, output files and
directories, and how a training script was launched. Shared by the models' saving and loading, the converters, the
training tools and the command-line scripts (the checks of the models' tensor inputs are in
`hf_layerfusion.modeling.input_checks`).

Every check raises an error that names the bad value, before any expensive work or any write: a wrong argument
must never give a silent wrong answer or overwrite a user's file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

import torch

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
