#!/usr/bin/env python
"""Many-to-many multilingual NMT in the OPUS-100 setting of GTrans Table V: encoder (and shared vocabulary)
initialised from XLM-R (`hf_layerfusion.from_xlmr`, XLM-T style), a target-language tag `<2xx>` prepended to every
source, English-centric data mixed with temperature sampling (T = 5), per-direction BLEU summarised per resource
group (high / medium / low) with averages and the win ratio against a baseline run
(`hf_layerfusion.training.multilingual`).

Full setting (XLM-R base from the Hub, OPUS-100 from the Hub; the "opus100" preset is checked against XLM-R):

    python examples/run_multilingual.py --dataset opus100 --languages de,fr,cs,... --model_type gtrans \\
        --xlmr FacebookAI/xlm-roberta-base --init_decoder --do_train --output_dir runs/opus100-gtrans \\
        --learning_rate 5e-4 --lr_scheduler_type inverse_sqrt --warmup_steps 4000 --label_smoothing_factor 0.1 \\
        --per_device_train_batch_size 64 --num_train_epochs 15 --num_beams 8

Offline stand-in (runs on a CPU in minutes): the 12 directions between en, de, fr and cs of Multi30k, with pair sizes
halving from pair to pair (`--standin_train_size` for en-de, then /2, /4, ...) so that temperature sampling and the
resource groups have something to act on (groups: >= size/2 high, < size/8 low), and a tiny random XLM-R whose
tokenizer is trained on the stand-in's training text (`--tiny_random_xlmr DIR` builds and saves both in DIR):

    python examples/run_multilingual.py --dataset multi30k --tiny_random_xlmr runs/m30k-multilingual-xlmr \\
        --model_type gtrans --config_overrides "encoder_group_size=2,decoder_group_size=1" --init_decoder \\
        --do_train --output_dir runs/m30k-multilingual --max_steps 300 --per_device_train_batch_size 32 \\
        --learning_rate 1e-3 --warmup_steps 50 --lr_scheduler_type inverse_sqrt --max_eval_samples 100 --num_beams 1

`--english_centric` keeps only the pairs with English (en-de, en-fr, en-cs: six directions, the shape of OPUS-100;
with `--standin_train_size 29000`: 29,000, 14,500 and 7,250 pairs), as `study/bench_multilingual.py` runs it.

The output dir holds the model and tokenizer (with the language tags), and `direction_scores.json` (per-direction
BLEU, training sizes, summary, the test translations of every direction); pass that file of another run as
`--baseline_scores` to get the win ratio (it is read and checked before the run starts: a score for every direction
of this run, each a finite number). With `--save_steps N` the run leaves checkpoints there, and
`--resume_from_checkpoint last` continues an interrupted run from the newest (as in run_translation.py). As there, a
run holds its `--output_dir` (a second run into it is refused at once, naming the first), and no run writes over what
it reads (XLM-R, the corpus, `--baseline_scores`). A run without `--do_train` evaluates the model that a training run
saved in `--output_dir` (with its tokenizer and language tags; `--xlmr` and `--preset` are not used, and the options
that build a model, `--tiny_random_xlmr`, `--config_overrides` and `--init_decoder`, are refused), e.g. again with
more beams or against a baseline; it writes its scores beside that model, replacing a `direction_scores.json` there
only with `--overwrite_output_dir True`.
Training uses `LayerFusionSeq2SeqTrainer`: `--label_smoothing_factor` is applied by the model's own loss (for GTrans,
per decoder group as in Eq. 7), not by the Trainer's label smoother.

Installed, the command is the console script `hf-layerfusion-train-multilingual` (or `python -m hf_layerfusion.cli.run_multilingual`); in a checkout,
`python examples/run_multilingual.py` runs the same module (`examples/run_multilingual.py` links to it).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

# `python examples/run_multilingual.py` from a checkout without installing: the examples/ file links here
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# first, before transformers' Trainer modules (which need it too): without the `train` extra, the error names it
import hf_layerfusion.training  # noqa: E402,F401

# isort: split
import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import (  # noqa: E402
    AutoConfig,
    AutoModelForSeq2SeqLM,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    Seq2SeqTrainingArguments,
    XLMRobertaConfig,
    XLMRobertaModel,
    XLMRobertaTokenizer,
    set_seed,
)

# same folder: the same syntax, help and resume rules
from hf_layerfusion.cli.run_translation import (  # noqa: E402
    DEFAULT_MAX_LENGTH,
    check_training_arguments,
    parse_config_overrides,
    resolve_checkpoint,
    training_parser,
)

import hf_layerfusion  # noqa: E402  (registers the families with the Auto classes)
from hf_layerfusion.file_checks import (  # noqa: E402
    check_distributed_launch,
    check_input_file,
    check_local_or_hub,
    check_output_dir,
    checkpoint_config,
    lock_output_dir,
    read_utf8,
    write_file_atomically,
)
from hf_layerfusion.modeling.input_checks import check_positive_int  # noqa: E402
from hf_layerfusion.modeling.presets import BACKBONE_PRESETS  # noqa: E402
from hf_layerfusion.modeling.registry import check_model_type  # noqa: E402
from hf_layerfusion.modeling.xlmr import (  # noqa: E402
    backbone_config_from_xlmr,
    check_xlmr_overrides,
    from_xlmr,
    load_xlmr_tokenizer,
)
from hf_layerfusion.training.callbacks import TimeBudgetCallback  # noqa: E402
from hf_layerfusion.training.data import load_parallel_text  # noqa: E402
from hf_layerfusion.training.distributed import run_script  # noqa: E402
from hf_layerfusion.training.multilingual import (  # noqa: E402
    OPUS100_RESOURCE_THRESHOLDS,
    PIVOT_LANGUAGE,
    both_directions,
    evaluate_directions,
    format_summary,
    interleave_directions,
    load_opus100,
    opus100_config_name,
    resource_group,
    split_direction,
    summarize_directions,
    tokenize_direction,
    translation_side,
)
from hf_layerfusion.training.tokenization import check_vocab_size_holds_characters, train_joint_tokenizer  # noqa: E402
from hf_layerfusion.training.trainer import LayerFusionSeq2SeqTrainer  # noqa: E402
from hf_layerfusion.translation.bleu import corpus_bleu  # noqa: E402
from hf_layerfusion.translation.language_tags import add_language_tags, check_language_tag  # noqa: E402
from hf_layerfusion.translation.tokenizer import load_tokenizer  # noqa: E402

# imported by the training modules above, after they checked that the `train` extra is installed
if TYPE_CHECKING:
    import datasets

logger = logging.getLogger(__name__)

# the checkout's sibling shared/ folder (hf_layerfusion/cli/ is three levels below it); elsewhere pass --multi30k_dir
MULTI30K_DIR = Path(__file__).resolve().parents[3] / "shared" / "data" / "multi30k"
SCORES_FILE = "direction_scores.json"


# `--help` lists the options of each argument dataclass under its `_argument_group_name` (HfArgumentParser's rule)
@dataclass
class ModelArguments:
    _argument_group_name = "model: the family, its XLM-R initialisation, fusion knobs (--config_overrides)"

    model_type: str = field(default="gtrans", metadata={"help": f"Family: one of {sorted(hf_layerfusion.FAMILIES)}."})
    xlmr: str = field(
        default="FacebookAI/xlm-roberta-base", metadata={"help": "XLM-R checkpoint (Hub id or directory)."}
    )
    tiny_random_xlmr: str | None = field(
        default=None,
        metadata={
            "help": "Build a tiny random XLM-R and an XLM-R tokenizer trained on the training text in this "
            "directory and start from it instead of --xlmr (offline demonstration; --preset is not applied)."
        },
    )
    tiny_xlmr_config: str = field(
        default="hidden_size=64,num_hidden_layers=4,num_attention_heads=4,intermediate_size=128",
        metadata={"help": "XLMRobertaConfig keys of the tiny random XLM-R."},
    )
    tiny_vocab_size: int = field(default=4000, metadata={"help": "Vocabulary of the tiny XLM-R's tokenizer."})
    init_decoder: bool = field(
        default=False, metadata={"help": "Initialise decoder layer i's self-attention + FFN from XLM-R layer i."}
    )
    preset: str | None = field(
        default="opus100",
        metadata={"help": "Backbone preset passed to from_xlmr (checked against XLM-R); 'none' for no preset."},
    )
    config_overrides: str | None = field(
        default=None, metadata={"help": "Comma-separated config keys, e.g. 'encoder_group_size=2,dropout=0.3'."}
    )


@dataclass
class DataArguments:
    _argument_group_name = "data: languages, sampling, lengths, evaluation"

    dataset: str = field(default="opus100", metadata={"help": "'opus100' or 'multi30k' (the offline stand-in)."})
    languages: str | None = field(
        default=None,
        metadata={"help": "opus100: the non-English languages (comma-separated); multi30k: all its languages."},
    )
    opus100_dir: str | None = field(
        default=None, metadata={"help": "Local OPUS-100 files {dir}/{pair}/{split}.jsonl instead of the Hub."}
    )
    multi30k_dir: str = field(default=str(MULTI30K_DIR), metadata={"help": "Multi30k plain-text directory."})
    standin_train_size: int = field(
        default=4000, metadata={"help": "Stand-in: training size of the first pair; each next pair has half."}
    )
    english_centric: bool = field(
        default=False,
        metadata={
            "help": "Stand-in: only the pairs with English (en-de, en-fr, en-cs: 6 directions, OPUS-100's shape) "
            "instead of every pair of --languages; the sizes still halve from pair to pair."
        },
    )
    temperature: float = field(default=5.0, metadata={"help": "Sampling temperature T: p_l ~ n_l^(1/T)."})
    max_source_length: int | None = field(default=None, metadata={
        "help": f"Source truncation (tokens, tag included); default {DEFAULT_MAX_LENGTH}, or the model's position "
                "table where that is shorter."})
    max_target_length: int | None = field(default=None, metadata={
        "help": f"Target truncation (tokens, </s> included); default {DEFAULT_MAX_LENGTH}, or the model's position "
                "table where that is shorter."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Test sentences per direction."})
    num_beams: int = field(default=8, metadata={"help": "Beam size of the evaluation (8 in the paper)."})
    max_new_tokens: int | None = field(default=None, metadata={
        "help": f"Longest generated translation; default {DEFAULT_MAX_LENGTH}, or the model's position table where "
                "that is shorter."})
    eval_batch_size: int = field(default=64, metadata={"help": "Sentences per generate() call."})
    baseline_scores: str | None = field(
        default=None,
        metadata={
            "help": "direction_scores.json of a baseline run: report the win ratio against it (it needs a finite "
            "score for every direction of this run)."
        },
    )


@dataclass
class RunArguments:
    _argument_group_name = "run: output dir"

    overwrite_output_dir: bool = field(
        default=False,
        metadata={
            "help": "Write into a non-empty --output_dir (training) or --tiny_random_xlmr directory; without "
            "--do_train: replace the direction_scores.json in --output_dir."
        },
    )


def multi30k_standin(data_args: DataArguments) -> tuple[dict[str, datasets.DatasetDict], tuple[int, int]]:
    """`{pair: DatasetDict}` for every pair of the Multi30k languages, training sizes halving from pair to pair,
    and the (high, low) resource thresholds scaled to them."""
    languages = (data_args.languages or "en,de,fr,cs").split(",")
    directory = Path(data_args.multi30k_dir)
    missing = [language for language in languages if not (directory / f"train.{language}").is_file()]
    if missing:
        found = sorted(path.suffix[1:] for path in directory.glob("train.*"))
        raise FileNotFoundError(
            f"No Multi30k training file for the language(s) {missing} in {directory} (train.<lang> exists for "
            f"{found}); check --languages and --multi30k_dir."
        )
    pairs = {}
    for index, (first, second) in enumerate(standin_language_pairs(data_args)):
        splits = load_parallel_text(directory, first, second)
        size = max(1, data_args.standin_train_size >> index)
        splits["train"] = splits["train"].select(range(min(size, len(splits["train"]))))
        pairs[f"{first}-{second}"] = splits
    return pairs, (data_args.standin_train_size // 2, data_args.standin_train_size // 8)


def standin_language_pairs(data_args: DataArguments) -> list[tuple[str, str]]:
    """The stand-in's language pairs, in the order their training sizes halve."""
    languages = (data_args.languages or "en,de,fr,cs").split(",")
    language_pairs = list(itertools.combinations(languages, 2))
    if data_args.english_centric:
        language_pairs = [pair for pair in language_pairs if PIVOT_LANGUAGE in pair]
    return language_pairs


def run_directions(data_args: DataArguments) -> list[str]:
    """The directions the run scores, from its arguments alone (the corpus is read later): what a baseline needs."""
    if data_args.dataset == "opus100":
        return both_directions([opus100_config_name(language) for language in data_args.languages.split(",")])
    return both_directions([f"{first}-{second}" for first, second in standin_language_pairs(data_args)])


def read_baseline_scores(path: str, directions: list[str]) -> dict[str, float]:
    """The `scores` of a baseline run's direction_scores.json, checked before the run starts: a file that does not
    parse, or lacks a finite score of a direction, failed only after training and evaluation, losing the scores."""
    try:
        content = json.loads(read_utf8(path, "--baseline_scores"))
    except json.JSONDecodeError as error:
        raise ValueError(
            f"--baseline_scores {path!r} is not valid JSON ({error}): pass the direction_scores.json of a finished run."
        ) from error
    scores = content.get("scores") if isinstance(content, dict) else None
    if not isinstance(scores, dict):
        raise ValueError(
            f"--baseline_scores {path!r} has no \"scores\" object ({{direction: BLEU}}): pass the "
            "direction_scores.json of a finished run."
        )
    missing = [direction for direction in directions if direction not in scores]
    if missing:
        raise ValueError(
            f"--baseline_scores {path!r} has no score for the direction(s) {missing} of this run (it scores "
            f"{sorted(scores)}): the win ratio compares every direction; pass a baseline run of the same languages."
        )
    bad = {
        direction: scores[direction]
        for direction in directions
        if isinstance(scores[direction], bool)
        or not isinstance(scores[direction], (int, float))
        or not math.isfinite(scores[direction])
    }
    if bad:
        raise ValueError(f"--baseline_scores {path!r}: the scores {bad} are not finite numbers.")
    return {direction: float(scores[direction]) for direction in directions}


def check_finite_values(values: dict, option: str) -> None:
    """A config key given NaN or inf (a dropout, an epsilon) is refused naming the option: XLMRobertaConfig takes
    them, and a model trains on NaN."""
    bad = {key: value for key, value in values.items() if isinstance(value, float) and not math.isfinite(value)}
    if bad:
        raise ValueError(f"{option}: {bad} are not finite numbers; give finite values.")


def check_tiny_xlmr_config(model_args: ModelArguments) -> XLMRobertaConfig:
    """The tiny XLM-R's config, its values checked by building the model on the meta device (no memory, no weights):
    sizes that XLMRobertaConfig takes (heads that do not divide the hidden size, say) failed only when the model was
    built, after the run had begun writing."""
    xlmr_config = tiny_xlmr_config(model_args, model_args.tiny_vocab_size)
    check_finite_values(xlmr_config.to_dict(), f"--tiny_xlmr_config {model_args.tiny_xlmr_config!r}")
    try:
        with torch.device("meta"):
            XLMRobertaModel(xlmr_config, add_pooling_layer=False)
    except (ValueError, TypeError, RuntimeError) as error:
        raise ValueError(f"--tiny_xlmr_config {model_args.tiny_xlmr_config!r}: {error}") from error
    return xlmr_config


def check_model_config(model_args: ModelArguments, xlmr_config, config_overrides: dict) -> None:
    """The config `from_xlmr` will build (XLM-R's keys, the preset, `--config_overrides`) is valid: it was checked
    only when the model was built, after the tiny XLM-R was written, and the corrected rerun was refused."""
    preset = None if model_args.tiny_random_xlmr or model_args.preset == "none" else model_args.preset
    overrides = {**BACKBONE_PRESETS.get(preset, {}), **config_overrides}
    backbone = backbone_config_from_xlmr(xlmr_config)
    config_class = hf_layerfusion.FAMILIES[model_args.model_type][0]
    try:
        check_xlmr_overrides(backbone, overrides, model_args.init_decoder)
        config_class(**{**backbone, **overrides})
    except (ValueError, TypeError) as error:
        raise ValueError(
            f"--config_overrides {model_args.config_overrides!r} (over the XLM-R config and --preset {preset}): {error}"
        ) from error


def check_trained_model(model_args: ModelArguments, output_dir: str) -> dict:
    """Without --do_train the run evaluates the model saved in `output_dir`: its config (returned), of the family
    `--model_type` names, and a tokenizer with the language tags. Before, such a run scored the untrained model
    from_xlmr builds and wrote the scores beside the trained model it ignored."""
    building = [name for name in ("tiny_random_xlmr", "config_overrides") if getattr(model_args, name)]
    building += ["init_decoder"] if model_args.init_decoder else []
    if building:
        raise ValueError(
            f"{['--' + name for name in building]} build a model for training, but without --do_train the run "
            f"evaluates the model saved in --output_dir {output_dir!r}: pass --do_train, or leave them out."
        )
    config = checkpoint_config(output_dir)
    if config is None:
        raise FileNotFoundError(
            f"--output_dir {output_dir!r} holds no trained model (config.json): a run without --do_train evaluates "
            "the model a training run saved there; pass --do_train to train one, or the output dir of a finished run."
        )
    if config.get("model_type") != model_args.model_type:
        raise ValueError(
            f"--output_dir {output_dir!r} holds a {config.get('model_type')!r} model, not --model_type "
            f"{model_args.model_type!r}: pass --model_type {config.get('model_type')} to evaluate it."
        )
    return config


def training_texts(pairs: dict[str, datasets.DatasetDict]) -> list[str]:
    """Every training sentence of every pair, both sides: the text a tiny XLM-R's tokenizer is trained on."""
    return [text for splits in pairs.values() for row in splits["train"]["translation"] for text in row.values()]


def train_xlmr_tokenizer(train_texts: list[str], vocab_size: int) -> XLMRobertaTokenizer:
    """An XLM-R tokenizer (`<s>` 0, `<pad>` 1, `</s>` 2, `<unk>` 3, ..., `<mask>`) whose unigram vocabulary is
    trained on `train_texts` (`train_joint_tokenizer`: the same texts give the same tokenizer on one machine)."""
    trained = train_joint_tokenizer(train_texts, vocab_size)
    pieces = [tuple(piece) for piece in json.loads(trained.backend_tokenizer.to_str())["model"]["vocab"]]
    return XLMRobertaTokenizer(vocab=pieces + [("<mask>", 0.0)])


def save_random_xlmr(directory: str, tokenizer: XLMRobertaTokenizer, model_args: ModelArguments) -> None:
    """A random `XLMRobertaModel` of `--tiny_xlmr_config`'s sizes for `tokenizer`'s vocabulary (its weights drawn
    from torch's random state: seed it for a reproducible model), saved with the tokenizer in `directory`."""
    config = tiny_xlmr_config(model_args, len(tokenizer))
    XLMRobertaModel(config, add_pooling_layer=False).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    logger.info(
        "Saved a tiny random XLM-R (%s) and its %d-token tokenizer in %s", model_args.tiny_xlmr_config, len(tokenizer),
        directory,
    )


def tiny_xlmr_config(model_args: ModelArguments, vocab_size: int) -> XLMRobertaConfig:
    """The config of the tiny random XLM-R: `--tiny_xlmr_config`'s keys over XLM-R base's position table (514
    rows)."""
    sizes = parse_config_overrides(model_args.tiny_xlmr_config, XLMRobertaConfig)
    return XLMRobertaConfig(**{"vocab_size": vocab_size, "type_vocab_size": 1, "layer_norm_eps": 1e-5,
                               "max_position_embeddings": 514, **sizes})


def build_tiny_random_xlmr(directory: str, train_texts: list[str], model_args: ModelArguments) -> None:
    """`save_random_xlmr` with a tokenizer trained on `train_texts` (`train_xlmr_tokenizer`)."""
    save_random_xlmr(directory, train_xlmr_tokenizer(train_texts, model_args.tiny_vocab_size), model_args)


def check_arguments(
    model_args: ModelArguments,
    data_args: DataArguments,
    run_args: RunArguments,
    training_args: Seq2SeqTrainingArguments,
) -> tuple[dict, str | None, dict[str, float] | None, XLMRobertaConfig | None]:
    """Check every argument before any work or write; returns the parsed `--config_overrides`, the checkpoint to
    resume from (`--resume_from_checkpoint last`: the output dir's newest, none: start fresh; as run_translation.py),
    the baseline's scores (None without `--baseline_scores`) and the config of the XLM-R a training run starts from
    (for `check_model_config`)."""
    check_distributed_launch(training_args.use_cpu, "examples/run_multilingual.py")
    check_training_arguments(training_args)
    check_model_type(model_args.model_type, "--model_type")
    if data_args.dataset == "opus100":
        if not data_args.languages:
            raise ValueError("--dataset opus100 needs --languages (the languages paired with English).")
        if data_args.opus100_dir is not None and not Path(data_args.opus100_dir).is_dir():
            raise FileNotFoundError(f"--opus100_dir {data_args.opus100_dir!r} is not a directory.")
    elif data_args.dataset == "multi30k":
        if not Path(data_args.multi30k_dir).is_dir():
            raise FileNotFoundError(
                f"--multi30k_dir {data_args.multi30k_dir!r} is not a directory: pass the folder that holds Multi30k's "
                "train.<lang> / val.<lang> / test_2016_flickr.<lang> files (the default is a checkout's sibling "
                "shared/data/multi30k, which an installed package has not)."
            )
        languages = (data_args.languages or "en,de,fr,cs").split(",")
        if data_args.english_centric and (PIVOT_LANGUAGE not in languages or len(languages) < 2):
            raise ValueError(
                f"--english_centric keeps the pairs with {PIVOT_LANGUAGE!r}, but --languages {data_args.languages!r} "
                f"has no {PIVOT_LANGUAGE!r} and another language."
            )
    else:
        raise ValueError(f"--dataset must be 'opus100' or 'multi30k', got {data_args.dataset!r}.")
    if data_args.english_centric and data_args.dataset != "multi30k":
        raise ValueError(
            f"--english_centric selects pairs of the Multi30k stand-in; --dataset {data_args.dataset!r} is "
            "English-centric already."
        )
    for name in ("standin_train_size", "num_beams"):
        check_positive_int(getattr(data_args, name), f"--{name}")
    for name in ("max_source_length", "max_target_length", "max_new_tokens"):
        check_positive_int(getattr(data_args, name), f"--{name}", allow_none=True)
    check_positive_int(data_args.eval_batch_size, "--eval_batch_size")
    check_positive_int(data_args.max_eval_samples, "--max_eval_samples", allow_none=True)
    check_positive_int(model_args.tiny_vocab_size, "--tiny_vocab_size")
    if not (data_args.temperature > 0 and math.isfinite(data_args.temperature)):
        raise ValueError(f"--temperature must be a positive finite number, got {data_args.temperature}.")
    if data_args.baseline_scores is not None:
        check_input_file(data_args.baseline_scores, "--baseline_scores")
    if model_args.preset not in (None, "none") and model_args.preset not in BACKBONE_PRESETS:
        raise ValueError(f"Unknown --preset {model_args.preset!r}; choose one of {sorted(BACKBONE_PRESETS)} or 'none'.")
    config_class = hf_layerfusion.FAMILIES[model_args.model_type][0]
    config_overrides = parse_config_overrides(model_args.config_overrides, config_class)
    check_finite_values(config_overrides, f"--config_overrides {model_args.config_overrides!r}")
    # without --do_train the run builds no model: it evaluates the one in --output_dir (check_trained_model, below)
    xlmr_config = None
    if training_args.do_train:
        if model_args.tiny_random_xlmr:
            xlmr_config = check_tiny_xlmr_config(model_args)
            check_output_dir(
                model_args.tiny_random_xlmr, overwrite=run_args.overwrite_output_dir, what="--tiny_random_xlmr"
            )
        else:
            xlmr_config = AutoConfig.from_pretrained(check_local_or_hub(model_args.xlmr, "--xlmr"))
    # what the run reads (the tiny XLM-R dir too, which it writes first): its output must not overwrite them
    reads = [model_args.tiny_random_xlmr, data_args.baseline_scores, data_args.opus100_dir]
    reads.append(data_args.multi30k_dir if data_args.dataset == "multi30k" else None)
    if training_args.do_train and not model_args.tiny_random_xlmr and Path(model_args.xlmr).expanduser().exists():
        reads.append(model_args.xlmr)
    inputs = [path for path in reads if path]
    checkpoint = resolve_checkpoint(training_args, run_args.overwrite_output_dir, inputs, [SCORES_FILE])
    directions = run_directions(data_args)
    baseline = None
    if data_args.baseline_scores is not None:
        baseline = read_baseline_scores(data_args.baseline_scores, directions)
    if training_args.do_train:
        positions = backbone_config_from_xlmr(xlmr_config)["max_position_embeddings"]
    else:
        positions = check_trained_model(model_args, training_args.output_dir)["max_position_embeddings"]
        tokenizer = load_tokenizer(training_args.output_dir, "the tokenizer of --output_dir")
        for language in sorted({lang for direction in directions for lang in split_direction(direction)}):
            check_language_tag(tokenizer, language)
    # lengths the position table cannot hold fail at the first batch that long, after the run wrote its files:
    # refused when given, and the defaults are at most the table
    for name in ("max_source_length", "max_target_length", "max_new_tokens"):
        value = getattr(data_args, name)
        if value is None:
            setattr(data_args, name, min(DEFAULT_MAX_LENGTH, positions))
        elif value > positions:
            raise ValueError(
                f"--{name} {value} exceeds the position table the model gets from XLM-R (max_position_embeddings="
                f"{positions}): pass --{name} {positions} or less."
            )
    return config_overrides, checkpoint, baseline, xlmr_config


def build_parser() -> HfArgumentParser:
    """The command's parser: it parses the command line and prints `--help` (the console script's too, which
    `hf_layerfusion_cli` caches)."""
    return training_parser((ModelArguments, DataArguments, RunArguments), __doc__)


def main(argv: list[str] | None = None) -> dict:
    model_args, data_args, run_args, training_args = build_parser().parse_args_into_dataclasses(args=argv)
    config_overrides, checkpoint, baseline, xlmr_config = check_arguments(
        model_args, data_args, run_args, training_args
    )
    logging.basicConfig(
        format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
        datefmt="%H:%M:%S",
        handlers=[logging.StreamHandler(sys.stdout)],
    )
    logger.setLevel(logging.INFO)
    transformers.utils.logging.set_verbosity_warning()
    logging.getLogger("datasets").setLevel(logging.WARNING)  # what `datasets.utils.logging.set_verbosity_warning` sets
    set_seed(training_args.seed)

    # ---------------------------------------------------------------------------------------------- data
    # read before the first write: a corpus that cannot be read (a language code mistyped, say) leaves nothing
    if data_args.dataset == "opus100":
        pairs = load_opus100(data_args.languages.split(","), data_dir=data_args.opus100_dir)
        thresholds = OPUS100_RESOURCE_THRESHOLDS
    else:
        pairs, thresholds = multi30k_standin(data_args)
    if model_args.tiny_random_xlmr:  # its tokenizer is trained under the run's lock: refused before the first write
        check_vocab_size_holds_characters(training_texts(pairs), model_args.tiny_vocab_size, what="--tiny_vocab_size")
    # the config of the model the run builds once it has begun writing (the tiny XLM-R first): refused now
    if xlmr_config is not None:
        check_model_config(model_args, xlmr_config, config_overrides)
    # the first write: the main process holds the output dir for the whole run (the run's other processes write
    # under its lock), so that a second run into it is refused, naming this one
    with lock_output_dir(training_args.output_dir) if training_args.process_index == 0 else contextlib.nullcontext():
        return train_and_evaluate(
            model_args, data_args, training_args, config_overrides, checkpoint, pairs, thresholds, baseline
        )


def train_and_evaluate(
    model_args: ModelArguments,
    data_args: DataArguments,
    training_args: Seq2SeqTrainingArguments,
    config_overrides: dict,
    checkpoint: str | None,
    pairs: dict[str, datasets.DatasetDict],
    thresholds: tuple[int, int],
    baseline: dict[str, float] | None = None,
) -> dict:
    """The run after its arguments are checked and its corpus read (`pairs`, with the resource `thresholds`): build
    the model (or, without --do_train, load the one in the output dir), train (resuming from `checkpoint`), translate
    and score every direction (against the `baseline` scores, if any), write `direction_scores.json`."""
    directions = both_directions(list(pairs))
    pair_of = {direction: pair for pair in pairs for direction in both_directions([pair])}
    train_sizes = {direction: len(pairs[pair_of[direction]]["train"]) for direction in directions}
    languages = sorted({lang for direction in directions for lang in split_direction(direction)})
    logger.info("%d directions over %s; training sizes %s", len(directions), languages, train_sizes)

    # ---------------------------------------------------------------------------------------------- model
    if training_args.do_train:
        xlmr_path = model_args.xlmr
        overrides = {}
        if model_args.tiny_random_xlmr:
            xlmr_path = model_args.tiny_random_xlmr
            build_tiny_random_xlmr(xlmr_path, training_texts(pairs), model_args)
        elif model_args.preset and model_args.preset != "none":
            overrides.update(BACKBONE_PRESETS[model_args.preset])
        overrides.update(config_overrides)
        model = from_xlmr(
            xlmr_path, model_type=model_args.model_type, init_decoder=model_args.init_decoder, **overrides
        )
        report = model.conversion_report
        logger.info("from_xlmr: %d tensors loaded, %d fresh", len(report["loaded"]), len(report["freshly_initialised"]))
        tokenizer = load_xlmr_tokenizer(xlmr_path, config=model.config)
        tag_ids = add_language_tags(tokenizer, languages, model=model)
        logger.info("Language tags %s; vocabulary now %d", tag_ids, model.config.vocab_size)
    else:
        model = AutoModelForSeq2SeqLM.from_pretrained(training_args.output_dir)
        tokenizer = load_tokenizer(training_args.output_dir, "the tokenizer of --output_dir")
        logger.info("Evaluating the trained model in %s", training_args.output_dir)

    # ---------------------------------------------------------------------------------------------- training
    if training_args.do_train:
        tokenized = {
            direction: tokenize_direction(
                pairs[pair_of[direction]]["train"],
                tokenizer,
                *split_direction(direction),
                max_source_length=data_args.max_source_length,
                max_target_length=data_args.max_target_length,
            )
            for direction in directions
        }
        train_stream = interleave_directions(tokenized, temperature=data_args.temperature, seed=training_args.seed)
        logger.info("Temperature-sampled training stream: %d examples (T=%s)", len(train_stream), data_args.temperature)
        trainer = LayerFusionSeq2SeqTrainer(
            model=model,
            args=training_args,
            train_dataset=train_stream,
            data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
            processing_class=tokenizer,
            # measures only: the training time across an interrupted and resumed run (trainer_state.json)
            callbacks=[TimeBudgetCallback(None)],
        )
        train_result = trainer.train(resume_from_checkpoint=checkpoint)
        logger.info("Training: %s", train_result.metrics)
        trainer.save_model()
        trainer.save_metrics("train", train_result.metrics)
        trainer.save_state()  # trainer_state.json: steps and loss curve, for study/bench_multilingual.py
        tokenizer.save_pretrained(training_args.output_dir)

    # ---------------------------------------------------------------------------------------------- evaluation
    test_sets = {}
    for direction in directions:
        test = pairs[pair_of[direction]]["test"]
        if data_args.max_eval_samples:
            test = test.select(range(min(data_args.max_eval_samples, len(test))))
        source_lang, target_lang = split_direction(direction)
        test_sets[direction] = (
            [row[source_lang] for row in test["translation"]],
            [row[target_lang] for row in test["translation"]],
        )
    signatures = set()
    translations = []  # per direction, in the order of test_sets (evaluate_directions scores them in that order)

    def bleu(hypotheses, references):
        score, signature = corpus_bleu(hypotheses, references)
        signatures.add(signature)
        translations.append(hypotheses)
        return score

    model.to(training_args.device)
    with torch.inference_mode():
        scores = evaluate_directions(
            model,
            tokenizer,
            test_sets,
            bleu,
            batch_size=data_args.eval_batch_size,
            max_source_length=data_args.max_source_length,
            num_beams=data_args.num_beams,
            max_new_tokens=data_args.max_new_tokens,
        )
    summary = summarize_directions(scores, train_sizes, baseline_scores=baseline, thresholds=thresholds)
    (signature,) = signatures

    print(f"\nPer-direction BLEU ({signature}; resource thresholds high >= {thresholds[0]}, low < {thresholds[1]})")
    print("direction\tside\ttrain\tgroup\tBLEU" + ("\tbaseline" if baseline else ""))
    for direction in directions:
        row = [
            direction,
            translation_side(direction),
            str(train_sizes[direction]),
            resource_group(train_sizes[direction], thresholds),
            f"{scores[direction]:.2f}",
        ]
        if baseline:
            row.append(f"{baseline[direction]:.2f}")
        print("\t".join(row))
    print("\nSummary (averages over directions; WR = % of directions beating the baseline)")
    print(format_summary(summary))

    results = {
        "scores": scores,
        "train_sizes": train_sizes,
        "thresholds": list(thresholds),
        "summary": summary,
        "signature": signature,
        "hypotheses": dict(zip(test_sets, translations)),  # the test translations, for paired bootstrap later
    }
    if training_args.process_index == 0:  # into the dir that lock_output_dir made
        write_file_atomically(
            Path(training_args.output_dir, SCORES_FILE), json.dumps(results, indent=2), what="Scores file"
        )
    return results


def run() -> None:
    """The console script (`hf_layerfusion.training.distributed.run_script`)."""
    run_script(main)


if __name__ == "__main__":
    run()
