"""What several of the study's modules share: the repository's paths, the Multi30k setting every en->de run trains
in, the argument types, the paired bootstrap, and the generated blocks of Markdown files (the text between a start
and an end marker that a report command rewrites).

No torch at import: the queue (`study.queue`) and the depth probes' report import this module without it.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import shlex
import sys
from pathlib import Path

import numpy as np
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

REPO_ROOT = Path(__file__).resolve().parents[1]
STUDY_RESULTS = REPO_ROOT / "study" / "results"
# the corpus is read by path from beside the checkout (README, "Data"), not shipped with the repository
DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "multi30k"
SOURCE_LANG, TARGET_LANG = "en", "de"
BOOTSTRAP_SAMPLES = 1000

# training options of every run (run_translation / Seq2SeqTrainingArguments); an arm may override some
TRAINING_OPTIONS = {
    "per_device_train_batch_size": 64,
    "per_device_eval_batch_size": 64,
    "optim": "adamw_torch",
    "learning_rate": 1e-3,
    "weight_decay": 0.0,
    "lr_scheduler_type": "inverse_sqrt",
    "label_smoothing_factor": 0.1,
    "train_sampling_strategy": "group_by_length",
}
GTRANS = {"encoder_group_size": 3, "decoder_group_size": 2}  # the paper's group sizes for every task


def display_path(path: Path) -> str:
    """`path` as the results record and show it: relative to the repository where it lies inside it (the same on
    every machine), else as given, resolved."""
    path = Path(path).resolve()
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def format_value(value) -> str:
    """A command-line option's value as run_translation.py reads it back (None as the word)."""
    return "None" if value is None else str(value)


def read_lines(path: Path) -> list[str]:
    """The lines of a Multi30k file."""
    if not path.is_file():
        raise FileNotFoundError(f"Multi30k file {path} not found; pass --data DIR holding train.en/train.de/...")
    return path.read_text(encoding="utf-8").splitlines()


def paired_bootstrap(baseline: list[str], system: list[str], references: list[str]) -> dict:
    """sacreBLEU's paired bootstrap resampling (Koehn 2004, as Moses' script): BLEU of both systems, the
    two-sided p-value of their difference, and the system's bootstrap mean and 95% confidence half-width."""
    return dict(tested_pair(tuple(baseline), tuple(system), tuple(references)))


# sacreBLEU seeds its resampling (SACREBLEU_SEED, 12345 by default), so a pair's result is the same every time: the
# report tests a pair once however many of its tables and summaries compare it (`python -m study.report`)
@functools.cache
def tested_pair(baseline: tuple[str, ...], system: tuple[str, ...], references: tuple[str, ...]) -> dict:
    """`paired_bootstrap` of one pair, computed once per process."""
    if not len(baseline) == len(system) == len(references):
        raise ValueError(
            f"Paired test needs aligned outputs: {len(baseline)} baseline, {len(system)} system, "
            f"{len(references)} reference lines."
        )
    signatures, scores = PairedTest(
        [("baseline", baseline), ("system", system)],
        {"BLEU": bleu_of(references)},
        references=None,  # the metric's own, tokenized once
        test_type="bs",
        n_samples=BOOTSTRAP_SAMPLES,
    )()
    (name,) = signatures  # sacreBLEU names the metric itself ("BLEU")
    baseline_result, system_result = scores[name]
    # sacreBLEU's p counts the resamples whose difference strays from the mean difference by more than the real one
    # does, plus one: when the two systems' per-sentence statistics coincide (identical translations, or different
    # words that match the references equally), every resampled difference is 0, none strays, and it reports
    # p = 1 / (resamples + 1), the smallest it can, for two systems with nothing between them. Such a pair is
    # indistinguishable on every resample: p = 1.
    indistinguishable = baseline_result.score == system_result.score and np.array_equal(
        bleu_statistics(baseline, references), bleu_statistics(system, references))
    return {
        "baseline_bleu": baseline_result.score,
        "bleu": system_result.score,
        "p_value": 1.0 if indistinguishable else system_result.p_value,
        "bootstrap_mean": system_result.mean,
        "bootstrap_ci95": system_result.ci,
        "signature": str(signatures[name]),
    }


@functools.cache
def bleu_of(references: tuple[str, ...]) -> BLEU:
    """sacreBLEU's BLEU (the paired test's settings) with `references` tokenized once per process: the report tests
    every pair of a split against the same references, which sacreBLEU would otherwise tokenize again for both systems
    of each pair (a third of the report's time)."""
    return BLEU(references=[list(references)])


def bleu_statistics(texts: list[str], references: list[str]) -> np.ndarray:
    """sacreBLEU's sufficient statistics per sentence, `(sentences, 10)`: matching n-grams and n-grams for n = 1..4,
    hypothesis and reference length (what the paired bootstrap resamples). Summed over any multiset of the sentences
    they give its corpus BLEU with `corpus_bleu`'s settings (13a, exponential smoothing;
    `bench_inference.bleu_from_statistics`)."""
    bleu = BLEU(effective_order=True)  # only the sentence scores it also returns use it; the counts are the same
    rows = []
    for text, reference in zip(texts, references, strict=True):
        score = bleu.sentence_score(text, [reference])
        rows.append([*score.counts, *score.totals, score.sys_len, score.ref_len])
    return np.array(rows, dtype=np.int64)


class GeneratedBlock:
    """A block of a Markdown file that a command writes: the text between the line `start` and the line `end`."""

    def __init__(self, start: str, end: str, what: str):
        self.start, self.end, self.what = start, end, what

    def _bounds(self, text: str, path: Path | str) -> tuple[int, int]:
        start, end = text.find(self.start), text.find(self.end)
        if start < 0 or end < start:
            raise ValueError(f"{path} has no {self.what} (the markers {self.start} and {self.end})")
        return start, end

    def read(self, text: str, path: Path | str = "the text") -> str:
        """The block's text: from the line after the start marker up to the end marker."""
        start, end = self._bounds(text, path)
        return text[start + len(self.start) + 1: end]

    def replace(self, text: str, block: str, path: Path | str = "the text") -> str:
        """`text` with the block's text replaced by `block`."""
        start, end = self._bounds(text, path)
        return text[: start + len(self.start)] + "\n" + block + text[end:]

    def write(self, path: Path, block: str) -> None:
        """Replace the block in the file `path` whole or not at all (a temporary file beside it, renamed into
        place)."""
        write_whole(path, self.replace(Path(path).read_text(encoding="utf-8"), block, path))


def write_whole(path: Path, text: str) -> None:
    """Write `text` to `path` whole or not at all (a temporary file beside it, renamed into place)."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text, encoding="utf-8")
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)


def module_command(module: str) -> list[str]:
    """The command that runs the study's module `module` (`study.<name>`) in a new Python process; run it with
    `study_environment()`."""
    return [sys.executable, "-m", module]


def study_environment(environment: dict | None = None) -> dict:
    """`environment` (default: this process's) with this checkout first on PYTHONPATH: a new process of one of the
    study's modules imports `study` and `hf_layerfusion` from here, whatever its working directory."""
    environment = dict(os.environ if environment is None else environment)
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), environment.get("PYTHONPATH")]))
    return environment


def reproduction_command(module: str, arguments: list[str]) -> str:
    """The shell command that reruns the study's module `module` with `arguments` from the repository root."""
    return f"python -m {module} {shlex.join(arguments)}".rstrip()


# a result recorded before the study was a package names its script by path (`python benchmarks/<name>.py`) and its
# results folder as benchmarks/results: its reproduction command, as it runs today
OLD_SCRIPT = re.compile(r"\bpython benchmarks/(?:study\.py\b|(\w+)\.py\b)")


def current_command(recorded: str) -> str:
    """A recorded reproduction command as it runs today (`OLD_SCRIPT`)."""
    command = OLD_SCRIPT.sub(lambda match: "python -m study" + (f".{match[1]}" if match[1] else ""), recorded)
    return command.replace("benchmarks/results/", "study/results/")
