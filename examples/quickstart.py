#!/usr/bin/env python
"""Quickstart: train a small GTrans and a plain Transformer on the built-in number corpus, compare their BLEU, and
translate with the saved GTrans. About 5 minutes on 2 idle CPU cores, no download.

    python examples/quickstart.py              # 1200 training steps per model, seed 0
    python examples/quickstart.py --seed 1     # another initialisation and data order
    python examples/quickstart.py --steps 300  # faster, lower BLEU

The whole path of a translation model: corpus -> tokenizer -> training -> BLEU -> saved model -> translation -> the
Hub's remote-code pipeline. The corpus (`hf_layerfusion.training.data.builtin_number_corpus`) verbalises numbers in
German and English ("dreihunderteinundzwanzig" -> "three hundred and twenty-one"); German writes most numbers as one
compound word, so we translate German -> English, where BLEU's n-grams have words to match. One tokenizer is trained
on the corpus; then both models train side by side, each in its own process of the training CLI
(`hf_layerfusion.cli.run_translation`, installed as `hf-layerfusion-train`) with one CPU thread (models this small
gain little from a second thread in a training step, and a second process trains the other model on the other
core). Both get the same size (d_model 128, 3 + 3 layers), vocabulary, hyper-parameters, data order and number of
steps, seeded: a rerun on the same machine prints the same numbers. Each model has a progress bar with the time left
and prints one short line per log (step, loss, learning rate, elapsed; the CLI's `--compact_logging True`).
BLEU is sacreBLEU of beam-4 search on the 300 held-out test sentences, translated with the package's fast decoding
loop (its C++ kernels are built once, on first use, with progress lines of their own). A few test sentences are
shown beside their expected translation, marked right or wrong, with the count of exact translations of the whole
test split. The saved GTrans is then loaded like any checkpoint and translates new numbers (all its decoder groups
mixed, and the top group alone), each checked against the English num2words writes. Last, a fresh Python process in
which hf_layerfusion cannot be imported loads the same directory with `trust_remote_code=True` (the self-contained
code the package saved with the weights) and translates through the `"translation"` pipeline; the script prints
whether its translations match the package's (and exits with status 1 if not), and where the time went (wall-clock
and CPU seconds per phase). Everything is written under `--output_dir` (a rerun replaces the files there).
"""

from __future__ import annotations

import time

STARTED = time.monotonic()  # before the imports, which take seconds

import argparse
import json
import os
import resource
import subprocess
import sys
import sysconfig
from contextlib import contextmanager
from pathlib import Path

import datasets
import torch
import transformers
from num2words import num2words
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

from hf_layerfusion.file_checks import check_output_dir
from hf_layerfusion.hub.model_card import write_model_card
from hf_layerfusion.hub.remote_code import check_model_directory
from hf_layerfusion.training.callbacks import PROGRESS_POSITION_VARIABLE
from hf_layerfusion.training.data import builtin_number_corpus
from hf_layerfusion.training.tokenization import train_joint_tokenizer
from hf_layerfusion.translation.translate import translate

SOURCE_LANG, TARGET_LANG = "de", "en"
CORPUS = dict(builtin_num_train=20000, builtin_num_valid=200, builtin_num_test=300)
STEPS = 1200
VOCAB_SIZE = 1000
NUM_BEAMS = 4
# d_model 128, 3 + 3 layers; GTrans: every encoder layer fused (T_e = 1), 3 decoder groups of one layer (T_d = 1)
BACKBONE = (
    "d_model=128,encoder_layers=3,decoder_layers=3,encoder_ffn_dim=512,decoder_ffn_dim=512,"
    "encoder_attention_heads=4,decoder_attention_heads=4,max_position_embeddings=128,dropout=0.1"
)
MODELS = {
    "gtrans": BACKBONE + ",encoder_group_size=1,decoder_group_size=1",
    "plain_transformer": BACKBONE,
}
# new inputs for the saved GTrans: (number, num2words kind)
NEW_NUMBERS = [(42, "cardinal"), (1987, "year"), (250_000, "cardinal"), (3, "ordinal"), (7_654_321, "cardinal")]
RIGHT, WRONG = "✓", "✗"


def train_args(model_type: str, output_dir: Path, steps: int, tokenizer_dir: Path | None, seed: int = 0) -> list[str]:
    args = [
        "--builtin_corpus",
        *(f"--{key}={value}" for key, value in CORPUS.items()),
        f"--source_lang={SOURCE_LANG}",
        f"--target_lang={TARGET_LANG}",
        f"--model_type={model_type}",
        f"--config_overrides={MODELS[model_type]}",
        f"--tokenizer_vocab_size={VOCAB_SIZE}",
        "--max_source_length=64",
        "--max_target_length=64",
        f"--output_dir={output_dir}",
        "--overwrite_output_dir=True",  # a rerun into the same --output_dir replaces the run's files
        "--do_train",
        "--do_predict",
        f"--num_beams={NUM_BEAMS}",
        f"--max_steps={steps}",
        "--per_device_train_batch_size=64",
        "--per_device_eval_batch_size=100",
        "--learning_rate=2e-3",
        "--lr_scheduler_type=inverse_sqrt",
        "--warmup_steps=300",
        "--label_smoothing_factor=0.1",
        "--train_sampling_strategy=group_by_length",
        "--save_strategy=no",
        f"--logging_steps={max(steps // 8, 1)}",
        "--log_level=warning",
        "--disable_tqdm=True",
        "--compact_logging=True",
        "--report_to=none",
        f"--dataloader_pin_memory={torch.cuda.is_available()}",
        f"--seed={seed}",
    ]
    if tokenizer_dir is not None:
        args.append(f"--tokenizer_name={tokenizer_dir}")
    return args


def normalised(text: str) -> str:
    """`text` with its whitespace runs made single spaces and its ends stripped."""
    return " ".join(text.split())


def is_right(output: str, expected: str) -> bool:
    """Whether a translation is the expected one, word for word (case and punctuation count; whitespace does not)."""
    return normalised(output) == normalised(expected)


def mark(output: str, expected: str) -> str:
    return RIGHT if is_right(output, expected) else WRONG


def right_count(outputs: list[str], expected: list[str]) -> str:
    """`"4 of 5 right"`."""
    if len(outputs) != len(expected):
        raise ValueError(f"{len(outputs)} outputs for {len(expected)} expected translations.")
    return f"{sum(map(is_right, outputs, expected))} of {len(expected)} right"


class PhaseClock:
    """Wall-clock and CPU seconds (this process's threads and its finished child processes) per phase."""

    def __init__(self, started: float | None = None):
        """`started`: the `time.monotonic()` of the process's start, to count the imports as a first phase (their CPU
        seconds: all of the process's until now)."""
        self.phases: list[tuple[str, float, float]] = []
        self._start = started if started is not None else time.monotonic(), 0.0 if started is not None else self.cpu_seconds()
        if started is not None:
            self.phases.append(("Python + imports", time.monotonic() - started, self.cpu_seconds()))

    @staticmethod
    def cpu_seconds() -> float:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + children.ru_utime + children.ru_stime

    @contextmanager
    def __call__(self, name: str, what: str | None = None):
        if what:
            print(f"\n>>> {what}", flush=True)
        wall, cpu = time.monotonic(), self.cpu_seconds()
        yield
        self.phases.append((name, time.monotonic() - wall, self.cpu_seconds() - cpu))

    def table(self) -> str:
        lines = [f"{'phase':<40} {'wall s':>7} {'CPU s':>7}"]
        lines += [f"{name:<40} {wall:>7.1f} {cpu:>7.1f}" for name, wall, cpu in self.phases]
        wall, cpu = time.monotonic() - self._start[0], self.cpu_seconds() - self._start[1]
        lines.append(f"{'total':<40} {wall:>7.1f} {cpu:>7.1f}")
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="runs/quickstart", type=Path,
                        help="Where the tokenizer and the two runs are written; a rerun replaces the files there.")
    parser.add_argument("--steps", default=STEPS, type=int,
                        help=f"Training steps of each model (batches of 64; default {STEPS}).")
    parser.add_argument("--seed", default=0, type=int,
                        help="Seed of both models' initialisation and data order (default 0).")
    args = parser.parse_args(argv)
    # checked before the tokenizer is written: the training processes would refuse them only after that
    if args.steps < 1:
        parser.error(f"--steps must be a positive number of training steps, got {args.steps}.")
    if not 0 <= args.seed < 2**32:
        parser.error(f"--seed must lie in [0, 2**32 - 1] (numpy's seed range), got {args.seed}.")
    try:
        check_output_dir(args.output_dir, overwrite=True, what="--output_dir")
    except (OSError, ValueError) as error:
        parser.error(str(error))
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()  # the models' own bars (CompactLogCallback) stay
    clock = PhaseClock(STARTED)

    # the corpus (generated, no download) and one tokenizer for both models, trained as the CLI would train it
    with clock("corpus + tokenizer", f"Generating the corpus and training a {VOCAB_SIZE}-token tokenizer on its "
               f"{CORPUS['builtin_num_train']:,} training pairs"):
        corpus = builtin_number_corpus(
            SOURCE_LANG, TARGET_LANG, CORPUS["builtin_num_train"], CORPUS["builtin_num_valid"], CORPUS["builtin_num_test"]
        )
        tokenizer_dir = args.output_dir / "tokenizer"
        texts = [pair[lang] for pair in corpus["train"]["translation"] for lang in (SOURCE_LANG, TARGET_LANG)]
        train_joint_tokenizer(texts, VOCAB_SIZE, save_dir=tokenizer_dir, overwrite=True)  # a rerun replaces it

    argvs = {
        model_type: train_args(model_type, args.output_dir / model_type, args.steps, tokenizer_dir, args.seed)
        for model_type in MODELS
    }
    with clock("training + test BLEU, both models", f"Training {' and '.join(MODELS)} side by side ({args.steps} steps "
               f"each; one process and one CPU thread per model), then beam-{NUM_BEAMS} translation of the "
               f"{CORPUS['builtin_num_test']} test sentences"):
        model_cpu_seconds = run_side_by_side(argvs)
    results = {
        model_type: json.loads((args.output_dir / model_type / "bleu_results.json").read_text(encoding="utf-8"))
        for model_type in MODELS
    }

    print(f"\n=== Test BLEU ({SOURCE_LANG}->{TARGET_LANG}, {CORPUS['builtin_num_test']} held-out sentences, "
          f"beam {NUM_BEAMS}) ===")
    print(f"{'model':<18} {'parameters':>10} {'steps':>6} {'train s':>8} {'CPU s':>6} {'BLEU':>6}")
    for model_type, result in results.items():
        parameters = sum(
            p.numel() for p in AutoModelForSeq2SeqLM.from_pretrained(args.output_dir / model_type).parameters()
        )
        train = result["train"]
        print(
            f"{model_type:<18} {parameters:>10,} {train['global_step']:>6} {train['train_runtime']:>8.0f} "
            f"{model_cpu_seconds.get(model_type, float('nan')):>6.0f} {result['test']['bleu']:>6.2f}"
        )
    print(f"sacreBLEU signature: {results['gtrans']['test']['signature']}")
    print("(train s: the Trainer's wall-clock training time; CPU s: the model's whole process, evaluation included)")

    test_pairs = corpus["test"]["translation"]
    hypotheses = {
        model_type: (args.output_dir / model_type / "generated_predictions_test.txt")
        .read_text(encoding="utf-8")
        .split("\n")
        for model_type in MODELS
    }
    shown = 4
    print(f"\n=== Sample test translations ({RIGHT} right, {WRONG} wrong: the output is the expected English word "
          "for word) ===")
    for i, pair in enumerate(test_pairs[:shown]):
        print(f"source:              {pair[SOURCE_LANG]}")
        print(f"expected:            {pair[TARGET_LANG]}")
        for model_type in MODELS:
            output = hypotheses[model_type][i]
            print(f"{model_type + ':':<18} {mark(output, pair[TARGET_LANG])} {output}")
        print()
    references = [pair[TARGET_LANG] for pair in test_pairs]
    for model_type in MODELS:
        print(f"{model_type}: {right_count(hypotheses[model_type][:len(references)], references)} of the whole "
              "test split, exactly")

    # the saved GTrans, as a user would load it, with the model card a Hub upload would carry
    gtrans_dir = args.output_dir / "gtrans"
    with clock("saved GTrans: model card + new inputs", f"Loading the saved GTrans ({gtrans_dir}), writing its model "
               "card, translating new numbers"):
        model = AutoModelForSeq2SeqLM.from_pretrained(gtrans_dir)
        card = write_model_card(
            gtrans_dir,
            model,
            SOURCE_LANG,
            TARGET_LANG,
            "hf_layerfusion built-in number corpus (num2words)",
            bleu_scores={"test": results["gtrans"]["test"]["bleu"]},
            bleu_signature=results["gtrans"]["test"]["signature"],
            training_command="python examples/quickstart.py",
            overwrite=True,  # this run's own card, rewritten on every run
        )
        print(f"Model card: {card}")
        tokenizer = AutoTokenizer.from_pretrained(gtrans_dir)
        sources = [num2words(n, lang=SOURCE_LANG, to=kind) for n, kind in NEW_NUMBERS]
        expected = [num2words(n, lang=TARGET_LANG, to=kind) for n, kind in NEW_NUMBERS]
        groups = model.config.num_decoder_groups
        all_groups = translate(model, tokenizer, sources)
        top_group = translate(model, tokenizer, sources, decoder_groups=[groups])
    print(f"\n=== The saved GTrans on new inputs ({RIGHT} right, {WRONG} wrong) ===")
    for (number, kind), source, want, mixed, top in zip(NEW_NUMBERS, sources, expected, all_groups, top_group):
        print(f"{number} ({kind}): {source}")
        print(f"    {'expected:':<30}   {want}")
        print(f"    {f'all {groups} decoder groups mixed:':<30} {mark(mixed, want)} {mixed}")
        print(f"    {'top decoder group only:':<30} {mark(top, want)} {top}")
    print(f"all {groups} groups mixed: {right_count(all_groups, expected)}; top group only: "
          f"{right_count(top_group, expected)}")

    # the directory is a complete Hub repository: a fresh process *without* hf_layerfusion loads it with the Hub
    # code the package wrote next to the weights, through the "translation" pipeline
    with clock("remote-code pipeline check", "Loading the saved GTrans in a fresh Python process without "
               "hf_layerfusion (trust_remote_code=True)"):
        check_model_directory(gtrans_dir)
        translator = pipeline("layerfusion-translation", model=model, tokenizer=tokenizer)
        package_translations = [
            r["translation_text"] for r in translator(sources, batch_size=len(sources), num_beams=NUM_BEAMS)
        ]
        hub_translations = translate_without_package(gtrans_dir, sources)
    print("\n=== The same directory in a fresh process without hf_layerfusion (trust_remote_code=True) ===")
    for source, translation in zip(sources, hub_translations):
        print(f"{source} -> {translation}")
    same = hub_translations == package_translations
    print(f"Translations {'match' if same else 'DO NOT match'} the package's ({len(sources)} sentences, "
          f"beam {NUM_BEAMS}).")
    print(f"\n=== Time (wall-clock, and CPU seconds of all threads and child processes) ===\n{clock.table()}")
    if not same:
        raise SystemExit(1)


def run_side_by_side(argvs: dict[str, list[str]]) -> dict[str, float]:
    """Run the training CLI once per model (`argvs`: model type -> arguments), all at once, each in its own process
    with one CPU thread and its progress bar on its own terminal line; wait for all of them. Returns each process's
    CPU seconds. A failed run stops the others and the script. Why processes: these models are so small that a
    second thread barely speeds up a training step, while a second process trains the other model on the other
    core."""
    processes = {}
    for position, (model_type, argv) in enumerate(argvs.items()):
        env = {**os.environ, "OMP_NUM_THREADS": "1", PROGRESS_POSITION_VARIABLE: str(position), "PYTHONUNBUFFERED": "1",
               "HF_DATASETS_DISABLE_PROGRESS_BARS": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        processes[model_type] = subprocess.Popen([sys.executable, "-m", "hf_layerfusion.cli.run_translation", *argv],
                                                 env=env)
    cpu_seconds = {}
    try:
        while len(cpu_seconds) < len(processes):
            for model_type, process in processes.items():
                if model_type in cpu_seconds:
                    continue
                pid, status, usage = os.wait4(process.pid, os.WNOHANG)
                if pid == 0:
                    continue
                process.returncode = os.waitstatus_to_exitcode(status)
                cpu_seconds[model_type] = usage.ru_utime + usage.ru_stime
                if process.returncode != 0:
                    raise SystemExit(f"Training {model_type} failed (exit status {process.returncode}; its error is "
                                     "printed above).")
            time.sleep(0.2)
    finally:
        for process in processes.values():
            if process.returncode is None:
                process.terminate()
                process.wait()
    return cpu_seconds


# Run with `python -S` and only the site-packages folders on sys.path (a virtual environment's own, then the system's
# when it sees them; their .pth files, which hold the editable install's import hook, are not processed), so
# `import hf_layerfusion` fails there, as for a Hub user without the package.
WITHOUT_PACKAGE = """
import json, sys
sys.path.extend({site_packages!r})
try:
    import hf_layerfusion
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("hf_layerfusion is importable: this check needs a process without it")
from transformers import pipeline
translator = pipeline("translation", model={model_dir!r}, trust_remote_code=True)
print(json.dumps([r["translation_text"] for r in translator({sources!r}, batch_size={batch_size}, num_beams=4)]))
"""


def translate_without_package(model_dir: Path, sources: list[str]) -> list[str]:
    script = WITHOUT_PACKAGE.format(
        site_packages=[path for path in sys.path if Path(path).name == "site-packages"] or [sysconfig.get_paths()["purelib"]],
        model_dir=str(model_dir.resolve()), sources=sources,
        batch_size=len(sources),
    )
    # PYTHONPATH would still reach a checkout of the package (a developer's `PYTHONPATH=$PWD`)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-S", "-c", script], capture_output=True, text=True, cwd=model_dir.resolve().parent, env=env
    )
    if result.returncode != 0:
        raise RuntimeError(f"Loading {model_dir} without hf_layerfusion failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
