#!/usr/bin/env python
"""Train and evaluate any hf_layerfusion family on a translation corpus (in the spirit of transformers'
`examples/pytorch/translation/run_translation.py`).

Model: a family and size (`--model_type gtrans --preset multi30k --config_overrides "encoder_group_size=3"`), or an
existing checkpoint (`--model_name_or_path`), read as another family with `--model_type` (deep representations'
recipe: `--model_name_or_path runs/plain --model_type deep_representations --config_overrides
"diversity_weight=1.0"` fine-tunes a trained plain Transformer with the aggregation and the diversity term). Data: a Hub dataset (`--dataset_name wmt14 --dataset_config_name
de-en`), a local directory of parallel text (`--dataset_name /data/multi30k`, Multi30k layout), JSON lines
(`--train_file train.jsonl ...`), or the package's built-in number corpus (`--builtin_corpus`). Tokenizer: loaded
(`--tokenizer_name`) or a joint source/target subword vocabulary trained on the training data and saved in
`--output_dir`. Training: `LayerFusionSeq2SeqTrainer` (label smoothing applied by the model's own loss, e.g. per
GTrans decoder group) with every `Seq2SeqTrainingArguments` option, a wall-clock budget (`--max_train_minutes`),
early stopping at the best evaluation (`--early_stopping_patience`),
fusion-weight and per-layer gradient-norm logging and plots, and resumption after a crash
(`--resume_from_checkpoint last`). Evaluation: sacreBLEU of beam search on the validation (`--do_eval`) and test
(`--do_predict`) splits, printed with the sacreBLEU signature.

    python examples/run_translation.py --dataset_name ../shared/data/multi30k --source_lang en --target_lang de \\
        --model_type gtrans --preset multi30k --config_overrides "encoder_group_size=3,decoder_group_size=2" \\
        --tokenizer_vocab_size 8000 --do_train --do_eval --do_predict --output_dir runs/multi30k-gtrans \\
        --learning_rate 1e-3 --lr_scheduler_type inverse_sqrt --warmup_steps 1000 --label_smoothing_factor 0.1 \\
        --per_device_train_batch_size 64 --train_sampling_strategy group_by_length --max_train_minutes 35 \\
        --max_steps 1000000 --save_steps 500 --num_beams 4 --resume_from_checkpoint last

Several GPUs (DDP): `accelerate launch --config_file examples/accelerate_multigpu.yaml examples/run_translation.py
...` with the same arguments (the batch size is per process).

The output dir then holds the model, tokenizer and generation config (`AutoModelForSeq2SeqLM.from_pretrained(dir)`
after `import hf_layerfusion`; `examples/translate.py` translates files with it), `bleu_results.json`,
`generated_predictions_<split>.txt`, and the plots `fusion_weights.png` / `layer_gradient_norms.png`.

Notes on transformers 5: `Seq2SeqTrainingArguments` has no `group_by_length` (use
`--train_sampling_strategy group_by_length`), no `warmup_ratio` (`--warmup_steps 0.1` is a ratio), no
`evaluation_strategy` (`--eval_strategy`) and no `no_cuda` (`--use_cpu`). Every argument is checked before any
work or write (`--max_steps 0`, a batch size of 0 and the like included); training into a non-empty `--output_dir`
is refused unless `--overwrite_output_dir True` (this script's own flag: transformers 5 dropped it; it replaces the
run's files and keeps the others, and is refused while the dir holds checkpoints) or `--resume_from_checkpoint`
continues the run there (`last`, or the path of one of its checkpoints; `last` with no checkpoint to continue is a
fresh start, and another dir's checkpoint is continued as a new run, both refused in a non-empty dir like any other),
and never into the checkpoint, tokenizer or corpus it reads. A run that only evaluates (`--do_eval` /
`--do_predict` without `--do_train`) may write into a non-empty dir, the model dir it evaluates included, but
refuses to replace its result files there without `--overwrite_output_dir True`, and never replaces a file of the
model. A run holds its `--output_dir` (`_run.lock`, released when it ends, however it ends): a second run into it is
refused at once, naming the first. Result files are written whole or not at all (a temporary file renamed into
place).

Installed, the command is the console script `hf-layerfusion-train` (or `python -m hf_layerfusion.cli.run_translation`); in a checkout,
`python examples/run_translation.py` runs the same module (`examples/run_translation.py` links to it).
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import json
import math
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

# `python examples/run_translation.py` from a checkout without installing: the examples/ file links here
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# first, before transformers' Trainer modules (which need it too): without the `train` extra, the error names it
import hf_layerfusion.training  # noqa: E402,F401

# isort: split
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    EarlyStoppingCallback,
    HfArgumentParser,
    PreTrainedModel,
    Seq2SeqTrainingArguments,
    set_seed,
)
from transformers.models.auto.configuration_auto import CONFIG_MAPPING  # noqa: E402
from transformers.trainer import TRAINER_STATE_NAME  # noqa: E402
from transformers.trainer_utils import sort_checkpoints  # noqa: E402

import hf_layerfusion  # noqa: E402  (registers the families with the Auto classes)
from hf_layerfusion.file_checks import (  # noqa: E402
    check_distributed_launch,
    check_local_or_hub,
    check_not_in_use,
    check_output_dir,
    check_result_files,
    checkpoint_model_type,
    lock_output_dir,
    reraise_hub_error,
    write_file_atomically,
)
from hf_layerfusion.modeling.configuration import declared_field_types  # noqa: E402
from hf_layerfusion.modeling.input_checks import check_positive_int  # noqa: E402
from hf_layerfusion.modeling.presets import BACKBONE_PRESETS  # noqa: E402
from hf_layerfusion.modeling.registry import check_model_type  # noqa: E402
from hf_layerfusion.training.callbacks import (  # noqa: E402
    FusionWeightsCallback,
    LayerGradientNormCallback,
    TimeBudgetCallback,
    use_compact_logging,
)
from hf_layerfusion.training.data import (  # noqa: E402
    builtin_number_corpus,
    load_translation_dataset,
    preprocess_translation,
)
from hf_layerfusion.training.distributed import run_script  # noqa: E402
from hf_layerfusion.training.evaluation import compute_translation_metrics  # noqa: E402
from hf_layerfusion.training.tokenization import (  # noqa: E402
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    SPECIAL_TOKENS,
    SUBWORD_MODELS,
    check_vocab_size_holds_characters,
    train_joint_tokenizer,
)
from hf_layerfusion.training.trainer import LayerFusionSeq2SeqTrainer  # noqa: E402
from hf_layerfusion.translation.bleu import corpus_bleu  # noqa: E402
from hf_layerfusion.translation.tokenizer import load_tokenizer  # noqa: E402

# imported by the training modules above, after they checked that the `train` extra is installed
if TYPE_CHECKING:
    import datasets

logger = logging.getLogger(__name__)

RESUME_LAST = "last"
RESULTS_FILE = "bleu_results.json"
PREDICTIONS_FILE = "generated_predictions_{}.txt"  # per split


# the truncation lengths' default (tokens), where the model's position table is no shorter
DEFAULT_MAX_LENGTH = 128


# `--help` lists the options of each argument dataclass under its `_argument_group_name` (HfArgumentParser's rule)
@dataclass
class ModelArguments:
    _argument_group_name = "model: a family and size, or a checkpoint; fusion knobs (--config_overrides); tokenizer"

    model_name_or_path: str | None = field(
        default=None, metadata={"help": "Existing checkpoint to fine-tune (instead of --model_type)."}
    )
    model_type: str | None = field(
        default=None,
        metadata={
            "help": f"Family of a model trained from scratch: one of {sorted(hf_layerfusion.FAMILIES)}; with "
            "--model_name_or_path, the family the checkpoint is read as (e.g. a plain Transformer checkpoint as "
            "deep_representations: the backbone loads, the fusion weights start fresh)."
        },
    )
    preset: str | None = field(
        default=None,
        metadata={
            "help": "Backbone size preset (hf_layerfusion.modeling.presets), e.g. 'multi30k', 'iwslt', or a setting "
            "of the family (e.g. 'layerwise_paper_small', 're_transformer_2')."
        },
    )
    config_overrides: str | None = field(
        default=None,
        metadata={
            "help": "Comma-separated config keys, e.g. 'encoder_group_size=3,dropout=0.3,d_model=256'; switches "
            "take true / false."
        },
    )
    tokenizer_name: str | None = field(
        default=None, metadata={"help": "Tokenizer to load; default: the checkpoint's, else one trained here."}
    )
    tokenizer_vocab_size: int = field(default=8000, metadata={"help": "Vocabulary size of a trained tokenizer."})
    tokenizer_model: str = field(default="unigram", metadata={"help": "Trained tokenizer: 'unigram' or 'bpe'."})


@dataclass
class DataArguments:
    _argument_group_name = "data: corpus, lengths, BLEU evaluation"

    source_lang: str = field(default="en", metadata={"help": "Source language code."})
    target_lang: str = field(default="de", metadata={"help": "Target language code."})
    dataset_name: str | None = field(
        default=None,
        metadata={"help": "Hub dataset name, or a local directory of parallel text / JSON lines files."},
    )
    dataset_config_name: str | None = field(default=None, metadata={"help": "Hub dataset config, e.g. 'de-en'."})
    train_file: str | None = field(default=None, metadata={"help": "JSON lines file or parallel-text prefix."})
    validation_file: str | None = field(default=None, metadata={"help": "JSON lines file or parallel-text prefix."})
    test_file: str | None = field(default=None, metadata={"help": "JSON lines file or parallel-text prefix."})
    builtin_corpus: bool = field(
        default=False,
        metadata={"help": "Use the built-in number corpus (hf_layerfusion.training.data.builtin_number_corpus)."},
    )
    builtin_num_train: int = field(default=10000, metadata={"help": "Training pairs of the built-in corpus."})
    builtin_num_valid: int = field(default=500, metadata={"help": "Validation pairs of the built-in corpus."})
    builtin_num_test: int = field(default=500, metadata={"help": "Test pairs of the built-in corpus."})
    max_source_length: int | None = field(default=None, metadata={
        "help": f"Source truncation length (tokens, </s> included); default {DEFAULT_MAX_LENGTH}, or the model's "
                "position table where that is shorter."})
    max_target_length: int | None = field(default=None, metadata={
        "help": f"Target truncation length (tokens, </s> included); default {DEFAULT_MAX_LENGTH}, or the model's "
                "position table where that is shorter."})
    max_train_samples: int | None = field(default=None, metadata={"help": "Keep the first N training pairs."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Keep the first N validation pairs."})
    max_predict_samples: int | None = field(default=None, metadata={"help": "Keep the first N test pairs."})
    num_beams: int = field(default=4, metadata={"help": "Beam size of the BLEU evaluations (saved in the model)."})
    max_new_tokens: int | None = field(
        default=None,
        metadata={"help": "Longest generated translation; default --max_target_length (never the generic 20)."},
    )
    preprocessing_num_workers: int | None = field(default=None, metadata={"help": "Processes for tokenisation."})


@dataclass
class RunArguments:
    _argument_group_name = "run: time budget, early stopping, logging, output dir"

    max_train_minutes: float | None = field(
        default=None, metadata={"help": "Stop training after this many minutes (kept across resumptions)."}
    )
    early_stopping_patience: int | None = field(
        default=None,
        metadata={
            "help": "Stop training once --metric_for_best_model has not improved for this many evaluations "
            "(transformers' EarlyStoppingCallback); needs --load_best_model_at_end True (with an --eval_strategy and "
            "the same --save_strategy), so that the best checkpoint becomes the run's model. Training to convergence: "
            "--eval_strategy epoch --save_strategy epoch --load_best_model_at_end True --metric_for_best_model bleu "
            "--early_stopping_patience 3 --num_train_epochs 30, and --restore_callback_states_from_checkpoint True so "
            "that a resumed run keeps its count of evaluations without improvement."
        },
    )
    log_fusion_weights: bool = field(
        default=True, metadata={"help": "Log and plot fusion weights and per-layer gradient norms."}
    )
    fast_generation: bool = field(
        default=True,
        metadata={
            "help": "Translate the validation / test sets with hf_layerfusion's fast decoding loop (the tokens of "
            "generate(), faster); false: generate()'s own loop."
        },
    )
    compact_logging: bool = field(
        default=False,
        metadata={
            "help": "Print a progress bar with the time left and one short line per log (step, loss, learning rate, "
            "validation BLEU when evaluated, elapsed time) instead of the Trainer's dicts "
            "(hf_layerfusion.training.callbacks.CompactLogCallback); the dicts still go to trainer_state.json and "
            "--report_to."
        },
    )
    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Train into a non-empty --output_dir: the model, tokenizer and result files there are replaced, "
            "other files are kept. Refused when it holds checkpoint-<step> dirs (they would mix with this run's): "
            "resume with --resume_from_checkpoint last, or remove them yourself."
        },
    )


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """`--help`: the module docstring as written (its example commands keep their lines) and every default."""


class TrainerArguments(Seq2SeqTrainingArguments):
    """`Seq2SeqTrainingArguments` itself (its fields, defaults and checks), whose options `--help` lists under one
    heading of their own, after the training command's groups."""

    _argument_group_name = "Trainer: every option of transformers' Seq2SeqTrainingArguments"


def training_parser(own_arguments: tuple[type, ...], description: str) -> HfArgumentParser:
    """The parser of a training command: the groups of its own argument dataclasses, in order, then the Trainer's
    options (`parse_args_into_dataclasses` returns one instance of each, the `TrainerArguments` last)."""
    return HfArgumentParser((*own_arguments, TrainerArguments), description=description, formatter_class=HelpFormatter)


def build_parser() -> HfArgumentParser:
    """The command's parser: it parses the command line and prints `--help` (the console script's too, which
    `hf_layerfusion_cli` caches)."""
    parser = training_parser((ModelArguments, DataArguments, RunArguments), __doc__)
    # BLEU needs generated translations
    parser.set_defaults(predict_with_generate=True)
    return parser


def parse_args(argv: list[str] | None = None):
    return build_parser().parse_args_into_dataclasses(args=argv)


def parse_config_overrides(overrides: str | None, config_class: type) -> dict:
    """`"a=1,b=true,c=gelu"` -> `{"a": 1, "b": True, "c": "gelu"}`; keys must be fields of `config_class`, and a
    switch (a key declared `bool`) takes only `true` / `false` (any case)."""
    if not overrides:
        return {}
    known = {f.name for f in dataclasses.fields(config_class)}
    switches = {name for name, declared in declared_field_types(config_class).items() if declared is bool}
    parsed = {}
    for item in overrides.split(","):
        key, sep, raw = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise ValueError(f"Config override {item!r} is not of the form key=value.")
        if key not in known:
            raise ValueError(f"Unknown config key {key!r} in --config_overrides for {config_class.__name__}.")
        if key in switches:
            if raw.lower() not in ("true", "false"):
                raise ValueError(f"--config_overrides {key}={raw!r}: `{key}` is a switch; give true or false.")
            parsed[key] = raw.lower() == "true"
            continue
        literal = {"true": "True", "false": "False", "null": "None", "none": "None"}.get(raw.lower(), raw)
        try:
            parsed[key] = ast.literal_eval(literal)
        except (ValueError, SyntaxError):
            try:
                parsed[key] = float(raw)  # nan / inf, which the config refuses by name
            except ValueError:
                parsed[key] = raw  # a string such as an activation name
    return parsed


def load_raw_datasets(data_args: DataArguments) -> datasets.DatasetDict:
    """The corpus as a `DatasetDict` with a `translation` column (train / validation / test splits)."""
    src, tgt = data_args.source_lang, data_args.target_lang
    sources = [data_args.builtin_corpus, data_args.dataset_name is not None, data_args.train_file is not None]
    if sum(sources) != 1:
        raise ValueError("Give exactly one data source: --builtin_corpus, --dataset_name, or --train_file.")
    if data_args.builtin_corpus:
        return builtin_number_corpus(
            src, tgt, data_args.builtin_num_train, data_args.builtin_num_valid, data_args.builtin_num_test
        )
    if data_args.dataset_name is not None:
        return load_translation_dataset(
            data_args.dataset_name, data_args.dataset_config_name, src_lang=src, tgt_lang=tgt
        )
    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    return load_translation_dataset({split: f for split, f in files.items() if f}, src_lang=src, tgt_lang=tgt)


def is_complete_checkpoint(checkpoint: str) -> bool:
    """Whether `checkpoint` is a checkpoint dir the Trainer completely wrote: it writes `trainer_state.json` last, so
    a process killed while saving leaves a dir without (a readable) one."""
    try:
        json.loads(Path(checkpoint, TRAINER_STATE_NAME).read_text())
        return True
    except (OSError, ValueError):
        return False


def last_complete_checkpoint(output_dir: str) -> str | None:
    """The newest `checkpoint-<step>` of `output_dir` that was completely written."""
    for checkpoint in reversed(sort_checkpoints(output_dir)):
        if is_complete_checkpoint(checkpoint):
            return checkpoint
        logger.warning("Skipping incomplete checkpoint %s", checkpoint)
    return None


def check_output_location(
    training_args: Seq2SeqTrainingArguments, overwrite_output_dir: bool, inputs: list[str], result_files: list[str]
) -> None:
    """The rule of every run that starts writing into `--output_dir`. A training run needs it empty (or
    `overwrite_output_dir`) and apart from its `inputs` (fine-tuning a model into its own directory would replace
    it). A run that only evaluates writes nothing but its `result_files`, so it may write beside other files (into
    the model dir it evaluates, say), but replaces none of them unasked, nor ever a file of its `inputs`."""
    output_dir = Path(training_args.output_dir).expanduser().resolve()
    # a run into a subdirectory of what it reads (`--output_dir data/run1` beside the corpus in `data/`) replaces
    # nothing there: only an input that is the output dir or inside it is in the way
    inputs = [path for path in inputs if Path(path).expanduser().resolve() not in output_dir.parents]
    if training_args.do_train:
        check_output_dir(training_args.output_dir, inputs, overwrite=overwrite_output_dir, what="--output_dir")
    else:
        check_result_files(training_args.output_dir, result_files, inputs, overwrite=overwrite_output_dir)


def resolve_checkpoint(
    training_args: Seq2SeqTrainingArguments,
    overwrite_output_dir: bool = False,
    inputs: list[str] = (),
    result_files: list[str] = (),
) -> str | None:
    """The checkpoint to resume from: `--resume_from_checkpoint last` is the newest complete `checkpoint-*` of the
    output dir (none: start fresh); a path must be a checkpoint the Trainer wrote. Refuse an output dir that another
    run is writing into. A run that continues a checkpoint of its own output dir (`last`, or the path of one) replaces
    that run's files there, but never one of its `inputs`. Any other run, a fresh start (also `last` with nothing to
    resume: a finished run saved without checkpoints, say) or one that continues another dir's checkpoint, must not
    start training over in a dir that already has checkpoints and must pass `check_output_location`, the checkpoint
    counted among its inputs."""
    output_dir = training_args.output_dir
    check_not_in_use(output_dir)
    existing = sort_checkpoints(output_dir) if os.path.isdir(output_dir) else []
    requested = training_args.resume_from_checkpoint
    checkpoint = None
    if requested is not None:
        # the Trainer resumes in `train()` only: without it the checkpoint would be silently ignored
        if not training_args.do_train:
            raise ValueError(
                f"--resume_from_checkpoint {requested!r} continues a training run, but --do_train is not given: pass "
                "--do_train, or drop --resume_from_checkpoint (a run that only evaluates scores --model_name_or_path)."
            )
        if requested == RESUME_LAST:
            checkpoint = last_complete_checkpoint(output_dir) if existing else None
        elif not os.path.isdir(requested):
            raise ValueError(f"--resume_from_checkpoint {requested!r} is not a directory.")
        elif not is_complete_checkpoint(requested):
            raise ValueError(
                f"--resume_from_checkpoint {requested!r} is not a checkpoint the Trainer wrote (no readable "
                f"{TRAINER_STATE_NAME}): pass a checkpoint-<step> dir of a run, or {RESUME_LAST} for the newest of "
                "--output_dir."
            )
        else:
            checkpoint = requested
    # the usual resumption, the output dir's own run continuing: its files are this run's to replace
    if checkpoint is not None and Path(checkpoint).resolve().parent == Path(output_dir).expanduser().resolve():
        check_output_location(training_args, True, inputs, result_files)
        return checkpoint
    if existing and training_args.do_train:
        if requested == RESUME_LAST:  # none of them complete
            raise ValueError(
                f"--resume_from_checkpoint {RESUME_LAST}: {output_dir} holds checkpoint dirs, none complete (no "
                f"readable {TRAINER_STATE_NAME}; newest {os.path.basename(existing[-1])}), as a run killed while "
                "saving leaves them; they are never deleted for you. Delete them yourself, or choose another "
                "--output_dir."
            )
        if overwrite_output_dir:
            # never deleted for the user: a run's checkpoints may be all that is left of hours of training
            raise ValueError(
                f"--overwrite_output_dir replaces the model, tokenizer and result files of {output_dir}, but it "
                f"also holds {len(existing)} checkpoint dir(s) of an earlier run (newest "
                f"{os.path.basename(existing[-1])}), which this run's checkpoints would mix with; they are never "
                f"deleted for you. Pass --resume_from_checkpoint {RESUME_LAST} to continue that run, delete the "
                "checkpoint-* dirs yourself, or choose another --output_dir."
            )
        raise ValueError(
            f"{output_dir} already holds checkpoints ({os.path.basename(existing[-1])}); pass "
            f"--resume_from_checkpoint {RESUME_LAST} to continue, or choose another --output_dir."
        )
    check_output_location(training_args, overwrite_output_dir, [*inputs, *filter(None, [checkpoint])], result_files)
    return checkpoint


def check_resumed_family(checkpoint: str | None, family: str) -> None:
    """Refuse to resume a checkpoint of another family than the run's model (`--model_type rtal
    --resume_from_checkpoint last` over a GTrans run): its weights have no place in that model, and the Trainer
    would fail deep in the optimizer state, naming neither family."""
    saved_family = checkpoint_model_type(checkpoint) if checkpoint is not None else None
    if saved_family is not None and saved_family != family:
        raise ValueError(
            f"--resume_from_checkpoint: {checkpoint} is a checkpoint of a {saved_family!r} model, but this run builds "
            f"a {family!r} model (--model_type / --model_name_or_path): a run resumes with its own family. Pass "
            f"--model_type {saved_family} to continue that run, or train the {family!r} model in another --output_dir."
        )


def load_or_train_tokenizer(
    model_args: ModelArguments,
    data_args: DataArguments,
    train_dataset,
    output_dir: str,
    checkpoint: str | None,
    is_main_process: bool = True,
):
    """`--tokenizer_name`, else the tokenizer saved with the checkpoint being fine-tuned or resumed, else a joint
    subword tokenizer trained on both sides of the training data by the main process and saved in `output_dir`
    (where the other processes load it from: call this under `main_process_first`)."""
    name = model_args.tokenizer_name or model_args.model_name_or_path or checkpoint
    if name is None and not is_main_process:
        name = output_dir
    if name is not None:
        return load_tokenizer(name, "--tokenizer_name" if model_args.tokenizer_name else "the tokenizer of the checkpoint")
    texts = tokenizer_training_texts(train_dataset, data_args)
    logger.info(
        "Training a %s tokenizer of %d tokens on %d sentences",
        model_args.tokenizer_model,
        model_args.tokenizer_vocab_size,
        len(texts),
    )
    # check_output_location allowed the run to replace its own files there (--overwrite_output_dir), the tokenizer's
    return train_joint_tokenizer(
        texts, model_args.tokenizer_vocab_size, model=model_args.tokenizer_model, save_dir=output_dir, overwrite=True
    )


def trains_tokenizer(model_args: ModelArguments, checkpoint: str | None) -> bool:
    """Whether the run trains its tokenizer (`load_or_train_tokenizer`): none is given, fine-tuned or resumed."""
    return (model_args.tokenizer_name or model_args.model_name_or_path or checkpoint) is None


def tokenizer_training_texts(train_dataset, data_args: DataArguments) -> list[str]:
    """Both sides of every training pair: the text a trained tokenizer learns from."""
    pairs = train_dataset["translation"]
    return [pair[lang] for pair in pairs for lang in (data_args.source_lang, data_args.target_lang)]


def check_tokenizer_training(model_args: ModelArguments, data_args: DataArguments, checkpoint: str | None,
                             splits: dict) -> None:
    """Refuse, before the run's first write, a tokenizer it could not train: a unigram vocabulary smaller than the
    training texts' characters (found by SentencePiece only once the run holds its output dir). A run that trains its
    tokenizer trains (`check_arguments`), so it has training data."""
    if not trains_tokenizer(model_args, checkpoint):
        return
    if model_args.tokenizer_model == "unigram":
        check_vocab_size_holds_characters(
            tokenizer_training_texts(splits["train"], data_args),
            model_args.tokenizer_vocab_size,
            what="--tokenizer_vocab_size",
        )


def build_config(model_args: ModelArguments, vocab_size: int, special_ids: dict):
    """The model's config: the checkpoint's (`--model_name_or_path`, read as `--model_type`'s family when given) with
    the config overrides, or a new `--model_type` config (preset, then the tokenizer's vocabulary size and special
    ids, then the overrides). The overrides are keys of the config's construction, so the config checks them like
    any other key. Called once with the tokenizer-to-be's values before any work, so that every model argument is
    checked first."""
    if model_args.model_name_or_path is None and model_args.model_type is None:
        raise ValueError("Give --model_type (a new model) and/or --model_name_or_path (a checkpoint to fine-tune).")
    family = None
    if model_args.model_type is not None:
        family = CONFIG_MAPPING[check_model_type(model_args.model_type, "--model_type")]
    if model_args.model_name_or_path is not None:
        if model_args.preset is not None:
            raise ValueError("--preset only applies to a new model (--model_type), not to --model_name_or_path.")
        path = check_local_or_hub(model_args.model_name_or_path, "--model_name_or_path")
        try:
            config_class = family or type(AutoConfig.from_pretrained(path))
            saved, _ = config_class.get_config_dict(path)
        except OSError as error:
            if os.path.isdir(path):
                raise
            reraise_hub_error(path, "--model_name_or_path", error)
        overrides = parse_config_overrides(model_args.config_overrides, config_class)
        return config_class.from_dict({**saved, **overrides})
    presets = sorted({**BACKBONE_PRESETS, **family.family_presets})
    if model_args.preset is not None and model_args.preset not in presets:
        raise ValueError(
            f"Unknown --preset {model_args.preset!r} for {model_args.model_type}; choose one of {presets}."
        )
    keys = dict(vocab_size=vocab_size, **special_ids)
    keys.update(parse_config_overrides(model_args.config_overrides, family))
    return family.from_preset(model_args.preset, **keys) if model_args.preset else family(**keys)


def tokenizer_special_ids(tokenizer) -> dict:
    """The config keys a new model takes from its tokenizer: its pad / bos / eos ids. The decoder's start token is
    the family's (`decoder_start_token` of its config: `</s>` as fairseq / Marian, `<s>` for layer-wise
    coordination, whose paper appends SOS to the source's EOS), so `decoder_start_token_id` is left to the config."""
    return dict(
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id
    )


def build_model(model_args: ModelArguments, tokenizer) -> PreTrainedModel:
    """A checkpoint (`--model_name_or_path`, config overrides applied, read as `--model_type`'s family when given)
    or a new model of `--model_type` whose vocabulary and special ids are the tokenizer's."""
    config = build_config(model_args, len(tokenizer), tokenizer_special_ids(tokenizer))
    if model_args.model_name_or_path is not None:
        model = AutoModelForSeq2SeqLM.from_pretrained(model_args.model_name_or_path, config=config)
    else:
        model = AutoModelForSeq2SeqLM.from_config(config)
    if len(tokenizer) > model.config.vocab_size:
        raise ValueError(
            f"The tokenizer has {len(tokenizer)} tokens but the model's vocab_size is {model.config.vocab_size}."
        )
    return model


def translation_bleu(trainer, raw_split, tokenized_split, tgt_lang: str, split_name: str, **gen_kwargs) -> dict:
    """Translate a split with `trainer.predict` (generation settings: the model's generation config updated with
    `gen_kwargs`, e.g. `num_beams=1` or GTrans' `decoder_groups=[2, 3]`) and score the detokenised output against
    the raw references with sacreBLEU. Returns `{"bleu", "signature", "loss", "hypotheses"}`."""
    prediction = trainer.predict(tokenized_split, metric_key_prefix=split_name, **gen_kwargs)
    tokenizer = trainer.processing_class
    # distributed: Seq2SeqTrainer gathers predictions with `gather`, not `gather_for_metrics`, so copies of the first
    # examples that fill the last round of batches follow the real predictions
    token_ids = prediction.predictions[: len(raw_split)]
    token_ids[token_ids == -100] = tokenizer.pad_token_id  # cross-batch padding of the gathered predictions
    hypotheses = [text.strip() for text in tokenizer.batch_decode(token_ids, skip_special_tokens=True)]
    references = [pair[tgt_lang] for pair in raw_split["translation"]]
    score, signature = corpus_bleu(hypotheses, references)
    return {
        "bleu": score,
        "signature": signature,
        "loss": prediction.metrics.get(f"{split_name}_loss"),
        "hypotheses": hypotheses,
    }


def select_splits(raw: datasets.DatasetDict, data_args: DataArguments, training_args: Seq2SeqTrainingArguments) -> dict:
    """The raw splits this run uses, cut to `--max_*_samples`."""
    wanted = {
        "train": (training_args.do_train, data_args.max_train_samples),
        "validation": (training_args.do_eval or training_args.eval_strategy != "no", data_args.max_eval_samples),
        "test": (training_args.do_predict, data_args.max_predict_samples),
    }
    splits = {}
    for name, (needed, max_samples) in wanted.items():
        if not needed:
            continue
        if name not in raw:
            raise ValueError(f"This run needs a {name!r} split, but the corpus only has {list(raw)}.")
        splits[name] = raw[name].select(range(min(max_samples, len(raw[name])))) if max_samples else raw[name]
    return splits


# the ranges of the Trainer's floats: (option, test, what the error says it must be)
TRAINER_FLOAT_RANGES = (
    # 0 keeps the weights: a run that checks what it loads and logs (the fine-tuning arms' test) trains at 0
    ("learning_rate", lambda value: value >= 0, "be non-negative"),
    ("adam_epsilon", lambda value: value > 0, "be positive"),
    ("weight_decay", lambda value: value >= 0, "be non-negative"),
    ("max_grad_norm", lambda value: value >= 0, "be non-negative (0: no gradient clipping)"),
    ("eval_delay", lambda value: value >= 0, "be non-negative"),
    ("adam_beta1", lambda value: 0 <= value < 1, "lie in [0, 1)"),
    ("adam_beta2", lambda value: 0 <= value < 1, "lie in [0, 1)"),
    ("label_smoothing_factor", lambda value: 0 <= value < 1, "lie in [0, 1)"),
    # transformers 5 has no warmup_ratio: below 1 a fraction of the training's steps, else steps, cut to an integer
    ("warmup_steps", lambda value: value >= 0 and (value < 1 or value == int(value)),
     "be a whole number of steps, or a fraction of the training's steps in [0, 1)"),
    ("neftune_noise_alpha", lambda value: 0 < value < math.inf, "be a positive finite number"),
)


def check_training_arguments(training_args: Seq2SeqTrainingArguments) -> None:
    """The Trainer's numbers that transformers accepts but misuses: `--max_steps 0` trains one step and saves the
    model as finished, a batch size or accumulation of 0 fails deep in the data loader, a negative seed fails in
    NumPy naming no argument."""
    if training_args.max_steps != -1:  # -1, the default: train for --num_train_epochs
        if training_args.max_steps < 1:
            raise ValueError(
                f"--max_steps must be a positive number of steps, or -1 (the default) to train for "
                f"--num_train_epochs, got {training_args.max_steps}."
            )
    elif not 0 < training_args.num_train_epochs < math.inf:
        raise ValueError(
            f"--num_train_epochs must be a positive finite number, got {training_args.num_train_epochs} (or give "
            "--max_steps)."
        )
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        check_positive_int(getattr(training_args, name), f"--{name}")
    for name in ("eval_accumulation_steps", "generation_num_beams", "generation_max_length"):
        check_positive_int(getattr(training_args, name), f"--{name}", allow_none=True)
    # a number of steps, or below 1 a fraction of the training's steps
    for name in ("save_steps", "eval_steps", "logging_steps"):
        value = getattr(training_args, name)
        if value is not None and not 0 < value < math.inf:
            raise ValueError(f"--{name} must be positive (steps, or a fraction of the training below 1), got {value}.")
    for name in ("seed", "data_seed", "dataloader_num_workers"):
        value = getattr(training_args, name)
        if value is not None and value < 0:
            raise ValueError(f"--{name} must be a non-negative integer, got {value}.")
    # floats the Trainer takes as they are: a NaN learning rate trains NaN weights, a negative one or a beta of 1.5
    # trains away from the minimum without a word, and a label smoothing outside [0, 1) or a NaN warmup fails at the
    # first step, after the run has written its tokenizer into --output_dir (whose corrected rerun is then refused)
    for name in ("learning_rate", "weight_decay", "max_grad_norm", "adam_beta1", "adam_beta2", "adam_epsilon",
                 "warmup_steps", "eval_delay"):
        value = getattr(training_args, name)
        if not math.isfinite(value):
            raise ValueError(f"--{name} must be a finite number, got {value}.")
    for name, within, what in TRAINER_FLOAT_RANGES:
        value = getattr(training_args, name)
        if value is not None and not within(value):  # NaN lies in none
            raise ValueError(f"--{name} must {what}, got {value}.")
    # accelerate turns float16 autocast on for GPUs only: on CPUs the run would train in float32 without a word
    # (bfloat16, which CPUs autocast to, is honoured there)
    if training_args.fp16 and training_args.device.type == "cpu":
        raise ValueError(
            "--fp16 True trains in float16 on GPUs only; on CPUs (--use_cpu True, or no GPU) it would train in float32 "
            "without a word. Drop --fp16, or pass --bf16 True for bfloat16 mixed precision on CPUs."
        )


def run_inputs(model_args: ModelArguments, data_args: DataArguments) -> list[str]:
    """The local paths this run reads (Hub ids left out), which its output must not overwrite: the checkpoint, the
    tokenizer and the corpus (a data file may be the prefix of parallel text files, `dir/train` for
    `dir/train.en`)."""
    hub_or_local = (model_args.model_name_or_path, model_args.tokenizer_name, data_args.dataset_name)
    local = [os.path.expanduser(path) for path in hub_or_local if path and os.path.exists(os.path.expanduser(path))]
    return local + [path for path in (data_args.train_file, data_args.validation_file, data_args.test_file) if path]


def scored_splits(training_args: Seq2SeqTrainingArguments) -> list[str]:
    """The splits a run translates and scores: validation (`--do_eval`), test (`--do_predict`)."""
    wanted = {"validation": training_args.do_eval, "test": training_args.do_predict}
    return [split for split, scored in wanted.items() if scored]


def result_files(training_args: Seq2SeqTrainingArguments) -> list[str]:
    """The files besides the model and the Trainer's that a run writes into --output_dir."""
    return [RESULTS_FILE] + [PREDICTIONS_FILE.format(split) for split in scored_splits(training_args)]


def check_arguments(
    model_args: ModelArguments,
    data_args: DataArguments,
    run_args: RunArguments,
    training_args: Seq2SeqTrainingArguments,
) -> str | None:
    """Check every argument before any work or write (a mistyped `--model_type` must not first train and save a
    tokenizer over the one in `--output_dir`). Returns the checkpoint to resume from."""
    if not (training_args.do_train or training_args.do_eval or training_args.do_predict):
        raise ValueError("Nothing to do: pass --do_train, --do_eval and/or --do_predict.")
    if data_args.source_lang == data_args.target_lang:
        raise ValueError(f"--source_lang and --target_lang must differ, got {data_args.source_lang!r} for both.")
    sources = [data_args.builtin_corpus, data_args.dataset_name is not None, data_args.train_file is not None]
    if sum(sources) != 1:
        raise ValueError("Give exactly one data source: --builtin_corpus, --dataset_name, or --train_file.")
    # options of another data source would be ignored without a word
    source = "--builtin_corpus" if data_args.builtin_corpus else f"--dataset_name {data_args.dataset_name!r}"
    for name in ("validation_file", "test_file"):
        value = getattr(data_args, name)
        if value is not None and data_args.train_file is None:
            raise ValueError(
                f"--{name} {value!r} is read with --train_file only; {source} brings its own splits. Drop one of the "
                "two (for your own files: --train_file, --validation_file, --test_file)."
            )
    if data_args.dataset_config_name is not None and data_args.dataset_name is None:
        source = "--builtin_corpus" if data_args.builtin_corpus else f"--train_file {data_args.train_file!r}"
        raise ValueError(
            f"--dataset_config_name {data_args.dataset_config_name!r} is a config of a --dataset_name, which {source} "
            "is not: drop one of the two."
        )
    evaluates = training_args.do_eval or training_args.eval_strategy != "no"
    if data_args.builtin_corpus:
        phases = {
            "builtin_num_train": (training_args.do_train, "--do_train"),
            "builtin_num_valid": (evaluates, "--do_eval / --eval_strategy"),
            "builtin_num_test": (training_args.do_predict, "--do_predict"),
        }
        for name, (needed, phase) in phases.items():
            value = getattr(data_args, name)
            if value < 0:
                raise ValueError(f"--{name} must be a non-negative number of pairs, got {value}.")
            # an empty split fails only once the run reaches it, after training and saving perhaps
            if needed and value == 0:
                raise ValueError(
                    f"--{name} 0 leaves the split that {phase} uses empty: pass a positive number of pairs."
                )
    # BLEU scores generated translations; without generation Seq2SeqTrainer predicts logits, which it cannot score
    if not training_args.predict_with_generate and (evaluates or training_args.do_predict):
        raise ValueError(
            "--predict_with_generate False: the BLEU of --do_eval, --do_predict and --eval_strategy scores "
            "translations generated by beam search; drop --predict_with_generate False (True is this script's "
            "default)."
        )
    check_training_arguments(training_args)
    check_positive_int(data_args.num_beams, "--num_beams")
    for name in ("max_source_length", "max_target_length", "max_new_tokens", "max_train_samples", "max_eval_samples",
                 "max_predict_samples"):
        check_positive_int(getattr(data_args, name), f"--{name}", allow_none=True)
    if run_args.max_train_minutes is not None and not 0 < run_args.max_train_minutes < math.inf:
        raise ValueError(f"--max_train_minutes must be a positive finite number, got {run_args.max_train_minutes}.")
    check_positive_int(run_args.early_stopping_patience, "--early_stopping_patience", allow_none=True)
    # EarlyStoppingCallback only warns without the best model loaded at the end, and asserts its other needs when
    # training begins, after the run wrote its tokenizer
    if run_args.early_stopping_patience is not None and not (
        training_args.do_train and training_args.load_best_model_at_end and training_args.eval_strategy != "no"
    ):
        raise ValueError(
            "--early_stopping_patience stops a training run after its best evaluation: pass --do_train and "
            "--load_best_model_at_end True with an --eval_strategy (and the same --save_strategy)."
        )
    if model_args.tokenizer_name is not None:
        check_local_or_hub(model_args.tokenizer_name, "--tokenizer_name")
    if model_args.tokenizer_model not in SUBWORD_MODELS:
        raise ValueError(f"--tokenizer_model must be one of {SUBWORD_MODELS}, got {model_args.tokenizer_model!r}.")
    if model_args.tokenizer_vocab_size <= len(SPECIAL_TOKENS):
        raise ValueError(
            f"--tokenizer_vocab_size must exceed the {len(SPECIAL_TOKENS)} special tokens, got "
            f"{model_args.tokenizer_vocab_size}."
        )
    # the config of a new model with the special ids of the tokenizers this script trains
    special_ids = dict(
        pad_token_id=SPECIAL_TOKENS.index(PAD_TOKEN),
        bos_token_id=SPECIAL_TOKENS.index(BOS_TOKEN),
        eos_token_id=SPECIAL_TOKENS.index(EOS_TOKEN),
    )
    config = build_config(model_args, model_args.tokenizer_vocab_size, special_ids)
    # a run that does not train scores the model it loads: a new --model_type model is randomly initialised
    if not training_args.do_train and model_args.model_name_or_path is None:
        raise ValueError(
            "--do_eval / --do_predict without --do_train score a trained model, but --model_name_or_path is not "
            f"given: they would score a randomly initialised --model_type {model_args.model_type} model. Pass "
            "--model_name_or_path <the trained model's dir>, or --do_train."
        )
    checkpoint = resolve_checkpoint(
        training_args, run_args.overwrite_output_dir, run_inputs(model_args, data_args), result_files(training_args)
    )
    check_resumed_family(checkpoint, config.model_type)
    # lengths the position table cannot hold fail at the first batch that long, after the run wrote its tokenizer:
    # refused when given, and the truncation lengths' default is at most the table
    positions = config.max_position_embeddings
    for name in ("max_source_length", "max_target_length"):
        if getattr(data_args, name) is None:
            setattr(data_args, name, min(DEFAULT_MAX_LENGTH, positions))
    for name in ("max_source_length", "max_target_length", "max_new_tokens"):
        value = getattr(data_args, name)
        if value is not None and value > positions:
            raise ValueError(
                f"--{name} {value} exceeds the model's position table (max_position_embeddings={positions}): pass "
                f"--{name} {positions} or less, or a larger max_position_embeddings (--config_overrides, new models)."
            )
    check_generation_settings(data_args, training_args)
    return checkpoint


def check_generation_settings(data_args: DataArguments, training_args: Seq2SeqTrainingArguments) -> None:
    """Refuse a Trainer generation option that contradicts this script's: Seq2SeqTrainer generates with
    `--generation_num_beams` / `--generation_max_length` over the model's generation config, which the script sets
    from `--num_beams` / `--max_new_tokens`, prints with the BLEU and saves with the model, so these would say what
    did not run."""
    beams = training_args.generation_num_beams
    if beams is not None and beams != data_args.num_beams:
        raise ValueError(
            f"--generation_num_beams {beams} contradicts --num_beams {data_args.num_beams} (printed with the BLEU and "
            f"saved in the model's generation config): give the beam size once, with --num_beams {beams}."
        )
    max_length = training_args.generation_max_length
    new_tokens = data_args.max_new_tokens or data_args.max_target_length
    if max_length is not None and max_length != new_tokens + 1:
        given = (
            f"--max_new_tokens {data_args.max_new_tokens}" if data_args.max_new_tokens is not None
            else f"--max_target_length {new_tokens} (the default of --max_new_tokens)"
        )
        raise ValueError(
            f"--generation_max_length {max_length} contradicts {given}, saved in the model's generation config as "
            f"max_length {new_tokens + 1} (the decoder start token and {new_tokens} new tokens): give the length once, "
            "with --max_new_tokens."
        )


def main(argv: list[str] | None = None) -> dict:
    """Run the script with `argv` (default: the command line). Returns `{"train": metrics, "<split>": BLEU
    results}` and writes them to `<output_dir>/bleu_results.json`."""
    model_args, data_args, run_args, training_args = parse_args(argv)
    check_distributed_launch(training_args.use_cpu, "examples/run_translation.py")
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    log_level = training_args.get_process_log_level()
    logger.setLevel(log_level)
    logging.getLogger("datasets").setLevel(log_level)  # what `datasets.utils.logging.set_verbosity` sets
    transformers.utils.logging.set_verbosity(log_level)

    checkpoint = check_arguments(model_args, data_args, run_args, training_args)
    set_seed(training_args.seed)
    # every process has checked the output dir before any of them writes into it
    if training_args.distributed_state is not None:
        training_args.distributed_state.wait_for_everyone()
    # read before the first write: a corpus that cannot be read (a language code mistyped, say) leaves nothing
    splits = select_splits(load_raw_datasets(data_args), data_args, training_args)
    check_tokenizer_training(model_args, data_args, checkpoint, splits)
    # the first write: the main process holds the output dir for the whole run (the run's other processes write
    # under its lock), so that a second run into it is refused, naming this one
    with lock_output_dir(training_args.output_dir) if training_args.process_index == 0 else contextlib.nullcontext():
        return train_and_evaluate(model_args, data_args, run_args, training_args, checkpoint, splits)


def train_and_evaluate(
    model_args: ModelArguments,
    data_args: DataArguments,
    run_args: RunArguments,
    training_args: Seq2SeqTrainingArguments,
    checkpoint: str | None,
    splits: dict,
) -> dict:
    """The run after its arguments are checked and its corpus read (`splits`, raw): train (resuming from
    `checkpoint`), save, score the splits, write the results."""
    src, tgt = data_args.source_lang, data_args.target_lang
    with training_args.main_process_first(desc="tokenizer", local=False):
        tokenizer = load_or_train_tokenizer(
            model_args,
            data_args,
            splits.get("train"),
            training_args.output_dir,
            checkpoint,
            is_main_process=training_args.process_index == 0,
        )
    model = build_model(model_args, tokenizer)
    # saved with the model, so that `generate()` after `from_pretrained` translates the same way. The length
    # limit is set as `max_length` (decoder start token + new tokens) rather than `max_new_tokens`: Seq2SeqTrainer
    # fills an unset `max_length` with the generic default 20, which would then coexist with it
    model.generation_config.num_beams = data_args.num_beams
    model.generation_config.max_length = (data_args.max_new_tokens or data_args.max_target_length) + 1
    model.generation_config.max_new_tokens = None
    with training_args.main_process_first(desc="tokenisation"):
        tokenized = {
            name: preprocess_translation(
                split,
                tokenizer,
                src,
                tgt,
                max_source_length=data_args.max_source_length,
                max_target_length=data_args.max_target_length,
                num_proc=data_args.preprocessing_num_workers,
            )
            for name, split in splits.items()
        }

    time_budget = TimeBudgetCallback(run_args.max_train_minutes)
    callbacks = [time_budget]
    if run_args.log_fusion_weights:
        callbacks += [FusionWeightsCallback(), LayerGradientNormCallback()]
    if run_args.early_stopping_patience is not None:
        callbacks.append(EarlyStoppingCallback(run_args.early_stopping_patience))
    trainer = LayerFusionSeq2SeqTrainer(
        model=model,
        args=training_args,
        train_dataset=tokenized.get("train"),
        eval_dataset=tokenized.get("validation") if training_args.eval_strategy != "no" else None,
        processing_class=tokenizer,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        compute_metrics=compute_translation_metrics(tokenizer) if training_args.eval_strategy != "no" else None,
        callbacks=callbacks,
        fast_generation=run_args.fast_generation,
    )
    if run_args.compact_logging:
        use_compact_logging(trainer, prefix=model.config.model_type)

    results = {}
    if training_args.do_train:
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model()  # model, tokenizer and generation config
        metrics = {
            **train_result.metrics,
            "global_step": trainer.state.global_step,
            # printed with the metrics and saved in bleu_results.json: a run the clock cut short says so
            "time_budget_ended_training": time_budget.ended_training,
        }
        if not run_args.compact_logging:  # which prints its own last line
            trainer.log_metrics("train", metrics)
        trainer.save_metrics("train", metrics)
        trainer.save_state()
        results["train"] = metrics

    for split_name in scored_splits(training_args):
        bleu = translation_bleu(trainer, splits[split_name], tokenized[split_name], tgt, split_name)
        results[split_name] = {key: value for key, value in bleu.items() if key != "hypotheses"}
        if trainer.is_world_process_zero():
            write_file_atomically(
                Path(training_args.output_dir, PREDICTIONS_FILE.format(split_name)),
                "".join(f"{line}\n" for line in bleu["hypotheses"]),
                what="Predictions file",
            )
            print(
                f"{split_name} BLEU = {bleu['bleu']:.2f} (beam {model.generation_config.num_beams}; {bleu['signature']})"
            )
    if trainer.is_world_process_zero():  # into the dir that lock_output_dir made
        write_file_atomically(
            Path(training_args.output_dir, RESULTS_FILE), json.dumps(results, indent=2) + "\n", what="Results file"
        )
    return results


def run() -> None:
    """The console script (`hf_layerfusion.training.distributed.run_script`)."""
    run_script(main)


if __name__ == "__main__":
    run()
