"""The decoder's layers at a step in one compiled call (`CompiledDecoderLayers`) against the blocks' compiled steps
called one by one through `run_layers` (issue 39): milliseconds per decoder step of `fast_generate` on a trained
model, side by side in one process.

For 1 and 32 Multi30k test sentences, float32 and int8, greedy and beam-4, exactly `--steps` new tokens
(`min_new_tokens` = `max_new_tokens`), the two ways alternate call by call (`--repeats` timed calls each after one
untimed); the table gives each median call divided by the steps (encoder and per-call work included) and the
ratio. Both give the same tokens (checked).

    python -m study.bench_layers_in_one_call runs/study/runs/steps_2000_warmup_1000/plain_transformer/seed_1
"""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer  # noqa: E402
from transformers.utils import logging as transformers_logging  # noqa: E402

import hf_layerfusion  # noqa: E402,F401  (registers the families with the Auto classes)
from hf_layerfusion.inference import fast_generation  # noqa: E402
from study.bench_backbone import loadavg  # noqa: E402
from study.common import DEFAULT_DATA, REPO_ROOT  # noqa: E402
from study.multi30k_ledger import cpu_model  # noqa: E402


def median_call_seconds(calls: dict, repeats: int) -> dict:
    """The median seconds of each named call over `repeats` timed rounds (after one untimed), alternating their
    order every round."""
    seconds = {name: [] for name in calls}
    for repeat in range(repeats + 1):
        for name in list(calls) if repeat % 2 == 0 else list(reversed(calls)):
            start = time.perf_counter()
            calls[name]()
            if repeat:
                seconds[name].append(time.perf_counter() - start)
    return {name: statistics.median(times) for name, times in seconds.items()}


def load_trained_model(parser: argparse.ArgumentParser, args: argparse.Namespace, title: str):
    """The tokenizer, model (eval mode) and Multi30k test sentences of a model-timing benchmark (one thread), after
    printing its heading: `title`, the command, versions, CPU and load."""
    source_file = args.data / "test_2016_flickr.en"
    if not source_file.is_file():
        parser.error(f"no Multi30k test sentences at {source_file}; pass --data DIR")
    transformers_logging.set_verbosity_error()
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model_dir).eval()
    sentences = [line.strip() for line in source_file.read_text(encoding="utf-8").splitlines()]
    commit = os.popen(f"git -C {shlex.quote(str(REPO_ROOT))} rev-parse --short HEAD 2>/dev/null").read().strip()
    print(f"## {title}\n")
    print(f"- command (from the repository root): `python {' '.join(shlex.quote(a) for a in sys.argv)}`")
    print(f"- torch {torch.__version__}, hf_layerfusion (git {commit or 'unknown'}), CPU: {cpu_model()}, 1 thread, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, load average at start {loadavg()}\n")
    return tokenizer, model, sentences


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Multi30k directory")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    if args.steps < 1 or args.repeats < 1:
        parser.error(f"--steps and --repeats must be positive, got {args.steps} and {args.repeats}")
    tokenizer, model, sentences = load_trained_model(
        parser, args, "The decoder's layers in one compiled call vs the blocks' steps one by one"
    )
    print("| rows | copy | search | one call, ms per step | one by one, ms per step | one call faster by |")
    print("|---|---|---|---|---|---|")
    one_call = fast_generation.compiled_decoder_layers
    ways = {"one call": one_call, "one by one": lambda decoder, layers: None}
    try:
        for rows in (1, 32):
            batch = tokenizer(sentences[:rows], return_tensors="pt", padding=True)
            for quantization in ("float32", "int8"):
                for num_beams in (1, 4):
                    settings = dict(quantization=None if quantization == "float32" else quantization,
                                    num_beams=num_beams, max_new_tokens=args.steps, min_new_tokens=args.steps)
                    tokens = {}

                    def call(name):
                        fast_generation.compiled_decoder_layers = ways[name]
                        tokens[name] = fast_generation.fast_generate(model, **batch, **settings)

                    seconds = median_call_seconds({name: functools.partial(call, name) for name in ways}, args.repeats)
                    if not torch.equal(tokens["one call"], tokens["one by one"]):
                        raise SystemExit(f"different tokens at {rows} rows, {quantization}, beams {num_beams}")
                    medians = {name: median * 1e3 / args.steps for name, median in seconds.items()}
                    print(f"| {rows} | {quantization} | {'greedy' if num_beams == 1 else f'beam-{num_beams}'} | "
                          f"{medians['one call']:.3f} | {medians['one by one']:.3f} | "
                          f"{medians['one by one'] / medians['one call']:.2f}x |")
    finally:
        fast_generation.compiled_decoder_layers = one_call
    print(f"\n(load average at end {loadavg()})")


if __name__ == "__main__":
    main()
