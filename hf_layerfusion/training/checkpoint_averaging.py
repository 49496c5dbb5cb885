"""Average the weights of the last N Trainer checkpoints (fairseq's `average_checkpoints.py --num-update-checkpoints`).

    python -m hf_layerfusion.checkpoint_averaging --checkpoint_dir runs/m30k-gtrans --num_checkpoints 5 \\
        --output_dir runs/m30k-gtrans/averaged

`checkpoint_dir` is a `Trainer` output dir holding `checkpoint-<step>` sub-directories; the N with the highest step
numbers are averaged parameter by parameter (floating-point tensors, summed in float64 and cast back; other tensors
are taken from the newest checkpoint). The result is saved with `save_pretrained` (safetensors, config, generation
config) together with the newest checkpoint's tokenizer, so `AutoModelForSeq2SeqLM.from_pretrained(output_dir)`
loads it. Tied weights (shared embeddings / output projection) are one tensor per checkpoint, so their average is
again one tied tensor.

Checked before any averaging: the checkpoints are of one model (same family and config, but for where and with
which transformers version they were saved: an average of two families' or two activations' weights is no model)
with one tokenizer (the files holding its vocabulary are the same), their weight files and the newest one's
tokenizer files are whole, every `checkpoint-*` dir has a step number (`checkpoint-5x` is refused, not read as step
5) and is a training checkpoint (not an averaged model, which records what it averages in `averaged_checkpoints.json`,
nor a model saved without the Trainer's state among checkpoints that have it), and `output_dir` is none of the inputs
nor named like a checkpoint of `checkpoint_dir`. The output is saved in a temporary directory beside `output_dir`
(`_averaging.<name>.*`, which `push_to_hub` leaves out) and moved in when complete: a failed save leaves `output_dir`
as it was, and one that a kill left behind is named in a warning by the next averaging into `output_dir`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
import warnings
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, PreTrainedModel
from transformers.trainer import TRAINER_STATE_NAME

from ..file_checks import check_output_dir, check_weight_files, check_write_error, read_utf8
from ..modeling.input_checks import check_switch
from ..translation.tokenizer import load_tokenizer

# a Trainer checkpoint dir: `checkpoint-<step>`; a name that starts like one but is not (`checkpoint-5x`) is refused
CHECKPOINT_NAME = re.compile(r"^checkpoint-(\d+)(.*)$")
# config.json keys that say where and with what a checkpoint was saved, not what it computes
UNCOMPARED_CONFIG_KEYS = {"_name_or_path", "transformers_version"}
# the tokenizer files that hold its vocabulary, compared byte for byte (not tokenizer_config.json, which also records
# how the tokenizer was loaded: a run resumed from a checkpoint saves it with `is_local` added)
VOCABULARY_FILES = (
    "tokenizer.json", "vocab.json", "vocab.txt", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "source.spm",
    "target.spm",
)
# written with an averaged model: the checkpoints it averages (and the mark of a model that is no training checkpoint)
AVERAGE_RECORD = "averaged_checkpoints.json"
# the temporary directory beside output_dir that the average is saved in: named with a leading "_" so that
# `push_to_hub` (transformers' and the package's leave out `_*`) does not upload one that a kill left behind
STAGING_PREFIX = "_averaging."


def last_checkpoints(checkpoint_dir: str | os.PathLike, num_checkpoints: int) -> list[Path]:
    """The `num_checkpoints` `checkpoint-<step>` dirs of `checkpoint_dir` with the highest steps, oldest first."""
    if isinstance(num_checkpoints, bool) or not isinstance(num_checkpoints, int) or num_checkpoints < 1:
        raise ValueError(f"`num_checkpoints` must be an integer at least 1, got {num_checkpoints!r}.")
    if not Path(checkpoint_dir).is_dir():
        raise FileNotFoundError(f"`checkpoint_dir` {os.fspath(checkpoint_dir)!r} is not a directory.")
    steps = {}
    for path in Path(checkpoint_dir).iterdir():
        match = CHECKPOINT_NAME.match(path.name)
        if match is None or not path.is_dir():
            continue
        if match.group(2):
            # read as step 5 by transformers' own sorting: a typo or a copy, never a step of its own
            raise ValueError(
                f"{str(path)!r} is named like a checkpoint but its step {match.group(1) + match.group(2)!r} is not a "
                "number: rename it `checkpoint-<step>` or move it out of `checkpoint_dir`."
            )
        steps[path] = int(match.group(1))
    checkpoints = sorted(steps, key=steps.get)
    if len(checkpoints) < num_checkpoints:
        raise ValueError(
            f"Asked to average {num_checkpoints} checkpoints but {checkpoint_dir} holds {len(checkpoints)} "
            f"(`checkpoint-<step>` dirs: {[path.name for path in checkpoints]})."
        )
    check_training_checkpoints(checkpoints[-num_checkpoints:])
    return checkpoints[-num_checkpoints:]


def check_training_checkpoints(checkpoints: list[Path]) -> None:
    """Refuse a `checkpoint-<step>` dir that is not a checkpoint of the training run: an averaged model saved under
    that name (its `averaged_checkpoints.json`), or a model without the Trainer's state among checkpoints that have
    it (a model saved there by hand). Averaged again, its checkpoints would count twice."""
    with_state = [checkpoint for checkpoint in checkpoints if (checkpoint / TRAINER_STATE_NAME).is_file()]
    for checkpoint in checkpoints:
        if (checkpoint / AVERAGE_RECORD).is_file():
            what = f"an averaged model ({AVERAGE_RECORD}: {read_utf8(checkpoint / AVERAGE_RECORD).strip()})"
        elif with_state and checkpoint not in with_state:
            what = f"a model without the Trainer's {TRAINER_STATE_NAME}, which {with_state[-1].name} has"
        else:
            continue
        raise ValueError(
            f"{str(checkpoint)!r} is named like a checkpoint of the run but is {what}, not a training checkpoint: "
            "averaged again, what it holds would count twice. Move it out of `checkpoint_dir` (an averaged model "
            "belongs in a directory of its own, e.g. `<run>/averaged`)."
        )


def _compared_config(checkpoint: Path) -> dict:
    config_file = checkpoint / "config.json"
    if not config_file.exists() and (checkpoint / "adapter_config.json").exists():
        # a PEFT run's checkpoint: LoRA's factors averaged one by one are not the average of their products
        raise ValueError(
            f"{str(checkpoint)!r} holds a PEFT adapter (adapter_config.json), not a model: averaging adapter factors "
            "is not averaging the weights they add. Merge each checkpoint's adapter into its model and save it as "
            "`checkpoint-<step>` of another directory (`model.merge_and_unload().save_pretrained(...)`), then "
            "average that directory."
        )
    try:
        config = json.loads(read_utf8(config_file, "Checkpoint config"))
    except (FileNotFoundError, json.JSONDecodeError) as error:
        raise ValueError(f"{str(config_file)!r} is not a readable model config ({error}).") from error
    return {key: value for key, value in config.items() if key not in UNCOMPARED_CONFIG_KEYS}


def check_same_model(checkpoints: list[Path]) -> None:
    """Refuse checkpoints that are not of one model: a different family or any other config key (an average of
    two families' weights, or of models computing different functions, is no model of either), naming the two
    checkpoints and the keys; then check their weight files (`check_weight_files`)."""
    reference = _compared_config(checkpoints[-1])
    for checkpoint in checkpoints[:-1]:
        config = _compared_config(checkpoint)
        different = {
            key: (config.get(key, "<missing>"), reference.get(key, "<missing>"))
            for key in sorted(config.keys() | reference.keys())
            if config.get(key, "<missing>") != reference.get(key, "<missing>")
        }
        if different:
            family = different.pop("model_type", None)
            what = f"different families ({family[0]!r} vs {family[1]!r}; " if family else "different configs ("
            raise ValueError(
                f"Cannot average {str(checkpoint)!r} with {str(checkpoints[-1])!r}: {what}"
                f"{', '.join(f'{key}: {a!r} vs {b!r}' for key, (a, b) in different.items())}). Average checkpoints "
                "of one training run only."
            )
    check_same_tokenizer(checkpoints)
    for checkpoint in checkpoints:
        check_weight_files(checkpoint)


def check_same_tokenizer(checkpoints: list[Path]) -> None:
    """Refuse checkpoints whose tokenizers differ (a vocabulary file of one is not the other's): a token id would
    mean one word in one model and another in the other, and their embeddings averaged mean neither. A checkpoint
    saved without a tokenizer is compared with none."""
    for name in VOCABULARY_FILES:
        holding = [checkpoint for checkpoint in checkpoints if (checkpoint / name).is_file()]
        for checkpoint in holding[:-1]:
            if (checkpoint / name).read_bytes() != (holding[-1] / name).read_bytes():
                raise ValueError(
                    f"Cannot average {str(checkpoint)!r} with {str(holding[-1])!r}: their tokenizers differ ({name}), "
                    "so one token id stands for different words in them. Average checkpoints of one training run only."
                )


@torch.no_grad()
def average_checkpoints(checkpoints: list[str | os.PathLike]) -> PreTrainedModel:
    """The model of the last checkpoint with every floating-point tensor replaced by its mean over `checkpoints`,
    which must be of one model (`check_same_model`: one config, hence the same tensors of the same shapes)."""
    if not checkpoints:
        raise ValueError("`checkpoints` is empty.")
    checkpoints = [Path(os.fspath(checkpoint)) for checkpoint in checkpoints]
    check_same_model(checkpoints)
    model = AutoModelForSeq2SeqLM.from_pretrained(checkpoints[-1])
    state_dict = model.state_dict()
    sums = {name: tensor.double() for name, tensor in state_dict.items() if tensor.is_floating_point()}
    for checkpoint in checkpoints[:-1]:
        other = AutoModelForSeq2SeqLM.from_pretrained(checkpoint).state_dict()
        for name in sums:
            sums[name] += other[name].double()
    for name, total in sums.items():
        state_dict[name].copy_((total / len(checkpoints)).to(state_dict[name].dtype))
    return model


def average_last_checkpoints(
    checkpoint_dir: str | os.PathLike, num_checkpoints: int, output_dir: str | os.PathLike, overwrite: bool = False
) -> list[Path]:
    """Average the last `num_checkpoints` checkpoints of `checkpoint_dir` into `output_dir`; returns the averaged
    checkpoint dirs. `output_dir` may be neither one of the averaged checkpoints (nor inside one) nor a directory
    holding them (`checkpoint_dir`), and must be empty or missing unless `overwrite`; all checked, and the newest
    checkpoint's tokenizer read, before any averaging. The result is saved in a temporary directory beside
    `output_dir` and moved into place file by file only when complete, so a failure (a full disk) leaves no partial
    model in `output_dir`."""
    check_switch(overwrite, "overwrite")  # "no" is truthy: it wrote into a non-empty dir
    checkpoints = last_checkpoints(checkpoint_dir, num_checkpoints)
    output_dir = check_output_dir(output_dir, checkpoints, overwrite=overwrite)
    check_not_named_like_a_checkpoint(output_dir, checkpoint_dir)
    has_tokenizer = (checkpoints[-1] / "tokenizer_config.json").is_file()
    tokenizer = load_tokenizer(checkpoints[-1], "newest checkpoint") if has_tokenizer else None
    warn_of_left_staging(output_dir)
    model = average_checkpoints(checkpoints)
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output_dir.parent, prefix=f"{STAGING_PREFIX}{output_dir.name}.") as staging:
        try:
            model.save_pretrained(staging)
            if tokenizer is not None:
                tokenizer.save_pretrained(staging)
            record = {"averaged": [checkpoint.name for checkpoint in checkpoints],
                      "checkpoint_dir": str(Path(checkpoint_dir).resolve())}
            Path(staging, AVERAGE_RECORD).write_text(json.dumps(record) + "\n", encoding="utf-8")
        except Exception as error:  # safetensors' errors are no OSError
            check_write_error(error, output_dir, "the averaged model")
            raise
        output_dir.mkdir(exist_ok=True)
        for file in Path(staging).iterdir():
            os.replace(file, output_dir / file.name)
    return checkpoints


def check_not_named_like_a_checkpoint(output_dir: Path, checkpoint_dir: str | os.PathLike) -> None:
    """Refuse an `output_dir` in `checkpoint_dir` named `checkpoint-<step>`: the next averaging would take the averaged
    model for a training checkpoint, `--resume_from_checkpoint last` would look at it and the Trainer's
    `save_total_limit` could delete it."""
    if CHECKPOINT_NAME.match(output_dir.name) and output_dir.resolve().parent == Path(checkpoint_dir).resolve():
        raise ValueError(
            f"`output_dir` {str(output_dir)!r} is named like a checkpoint of {os.fspath(checkpoint_dir)!r}: the "
            "averaged model would be taken for a training checkpoint there (averaged again, deleted by the Trainer's "
            f"save_total_limit). Save it under another name, e.g. {str(Path(checkpoint_dir, 'averaged'))!r}."
        )


def warn_of_left_staging(output_dir: Path) -> None:
    """Warn of the temporary directories beside `output_dir` that an averaging into it left when it was killed
    (named `_averaging.<name>.*`, hidden `.<name>.*` before): partial models, never used, that only take space."""
    patterns = (f"{STAGING_PREFIX}{output_dir.name}.*", f".{output_dir.name}.*")
    left = sorted(str(path) for pattern in patterns for path in output_dir.parent.glob(pattern) if path.is_dir())
    if left:
        warnings.warn(
            f"{left} beside {str(output_dir)!r}: left by an averaging into it that was killed (or is still running), "
            "a partial model that nothing reads. Delete it once no averaging runs.",
            stacklevel=3,
        )


def build_parser() -> argparse.ArgumentParser:
    """The command's parser: it parses the command line and prints `--help` (the console script's too, which
    `hf_layerfusion_cli` caches)."""
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
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    checkpoints = average_last_checkpoints(
        args.checkpoint_dir, args.num_checkpoints, args.output_dir, overwrite=args.overwrite_output_dir
    )
    print(f"Averaged {', '.join(path.name for path in checkpoints)} into {args.output_dir}")
