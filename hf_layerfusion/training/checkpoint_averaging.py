"""Average the weights of the last N Trainer checkpoints (fairseq's `average_checkpoints.py --num-update-checkpoints`).

    python -m hf_layerfusion.checkpoint_averaging --checkpoint_dir runs/m30k-gtrans --num_checkpoints 5 \\
        --output_dir runs/m30k-gtrans/averaged

`checkpoint_dir` is a `Trainer` output dir holding `checkpoint-<step>` sub-directories; the N with the highest step
numbers are averaged parameter by parameter (floating-point tensors, summed in float64 and cast back; other tensors
are taken from the newest checkpoint). The result is saved with `save_pretrained` (safetensors, config, generation
config) together with the newest checkpoint's tokenizer, so `AutoModelForSeq2SeqLM.from_pretrained(output_dir)`
loads it. Tied weights (shared embeddings / output projection) are one tensor per checkpoint, so their average is
again one tied tensor.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel
from transformers.trainer_utils import sort_checkpoints

from ..file_checks import check_output_dir


def last_checkpoints(checkpoint_dir: str | os.PathLike, num_checkpoints: int) -> list[Path]:
    """The `num_checkpoints` `checkpoint-<step>` dirs of `checkpoint_dir` with the highest steps, oldest first."""
    if isinstance(num_checkpoints, bool) or not isinstance(num_checkpoints, int) or num_checkpoints < 1:
        raise ValueError(f"`num_checkpoints` must be an integer at least 1, got {num_checkpoints!r}.")
    if not Path(checkpoint_dir).is_dir():
        raise FileNotFoundError(f"`checkpoint_dir` {os.fspath(checkpoint_dir)!r} is not a directory.")
    checkpoints = [Path(path) for path in sort_checkpoints(str(checkpoint_dir))]
    if len(checkpoints) < num_checkpoints:
        raise ValueError(
            f"Asked to average {num_checkpoints} checkpoints but {checkpoint_dir} holds {len(checkpoints)} "
            f"(`checkpoint-<step>` dirs: {[path.name for path in checkpoints]})."
        )
    return checkpoints[-num_checkpoints:]


@torch.no_grad()
def average_checkpoints(checkpoints: list[str | os.PathLike]) -> PreTrainedModel:
    """The model of the last checkpoint with every floating-point tensor replaced by its mean over `checkpoints`."""
    if not checkpoints:
        raise ValueError("`checkpoints` is empty.")
    sums: dict[str, torch.Tensor] = {}
    for checkpoint in checkpoints:
        state_dict = AutoModelForSeq2SeqLM.from_pretrained(checkpoint).state_dict()
        for name, tensor in state_dict.items():
            if tensor.is_floating_point():
                sums[name] = sums[name] + tensor.double() if name in sums else tensor.double()
    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoints[-1])
    state_dict = model.state_dict()
    for name, total in sums.items():
        state_dict[name].copy_((total / len(checkpoints)).to(state_dict[name].dtype))
    return model


def average_last_checkpoints(
    checkpoint_dir: str | os.PathLike, num_checkpoints: int, output_dir: str | os.PathLike, overwrite: bool = False
) -> list[Path]:
    """Average the last `num_checkpoints` checkpoints of `checkpoint_dir` into `output_dir`; returns the averaged
    checkpoint dirs. `output_dir` may be neither one of the averaged checkpoints (nor inside one) nor a directory
    holding them (`checkpoint_dir`), and must be empty or missing unless `overwrite`; all checked before any loading."""
    checkpoints = last_checkpoints(checkpoint_dir, num_checkpoints)
    check_output_dir(output_dir, checkpoints, overwrite=overwrite)
    average_checkpoints(checkpoints).save_pretrained(output_dir)
    if (checkpoints[-1] / "tokenizer_config.json").is_file():
        AutoTokenizer.from_pretrained(checkpoints[-1]).save_pretrained(output_dir)
    return checkpoints


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m hf_layerfusion.checkpoint_averaging",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--checkpoint_dir", required=True, help="Trainer output dir with checkpoint-<step> dirs.")
    parser.add_argument("--num_checkpoints", type=int, default=5, help="How many of the newest checkpoints to average.")
    parser.add_argument("--output_dir", required=True, help="Where to save the averaged model and tokenizer.")
    parser.add_argument(
        "--overwrite_output_dir", action="store_true", help="Allow writing into a non-empty --output_dir."
    )
    args = parser.parse_args(argv)
    checkpoints = average_last_checkpoints(
        args.checkpoint_dir, args.num_checkpoints, args.output_dir, overwrite=args.overwrite_output_dir
    )
    print(f"Averaged {', '.join(path.name for path in checkpoints)} into {args.output_dir}")
