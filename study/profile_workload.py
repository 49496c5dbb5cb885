"""Where the fast loop spends its time on the real workload (issue 39, item 3): a trained model translating Multi30k
test as `hf_layerfusion.translate` does (batches of 32 sorted by length, each sentence stopping at its end token),
split into what the fixed 32 x 32 setting of `profile_decoder_step.py` cannot show.

For each `--quantization` (float32: the fast loop's float32 copy; int8: its int8 copy) and search, one timed pass over
the sentences (after an untimed warm-up batch) with every call of these timed:

- `translate` as a whole (tokenizing, batching, detokenizing included), and the page faults and system time of the
  untimed pass (fresh memory the loop touches);
- the encoder (`encode_by_length`: the batch in groups of sentences of similar length);
- each decoder step (`DecoderSteps.logits`: embeddings, layers, output projection, for the rows still in the batch),
  bucketed by how many rows it computes (beam search: sentences x beams), with the mean milliseconds per step and
  per row;
- the search's bookkeeping: the rest of `fast_generate` (argmax or beam candidates, finished rows, compaction);
- the calls into the compiled kernels (every function of the kernel module called from Python, the int8 /
  float32 linear layers' calls: `Int8Linear.forward`, `Float32Linear.forward`, and the compiled decoding steps:
  `DecoderLayerSteps`, every decoder layer of a step in one call, also shown on their own), in all phases: what is
  left is Python and the torch operations around them (embeddings, masks, cache bookkeeping, SDPA in the encoder).

Then `torch.profiler`'s operators with the most self CPU time over a second pass (the compiled kernels' calls from
Python appear as `hf_layerfusion_cpu_kernels` functions; calls made inside the compiled decoding steps do not).
The timers cost a few microseconds per call; totals are compared with an untimed pass.

    python -m study.profile_workload runs/study/runs/steps_2000_warmup_1000/plain_transformer/seed_1
    python -m study.profile_workload MODEL_DIR --num-beams 4 --quantization int8 --sentences 500
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import resource
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import transformers  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer  # noqa: E402

import hf_layerfusion  # noqa: E402
from hf_layerfusion.inference import (  # noqa: E402
    decoding,
    decoding_attention,
    fast_generation,
    inference_copies,
    search,
)
from hf_layerfusion.inference.cpu_kernels import compiled_kernels  # noqa: E402
from hf_layerfusion.translation import translate as translation_module  # noqa: E402
from study import bench_backbone as backbone  # noqa: E402
from study.common import reproduction_command  # noqa: E402

ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)  # a step computing r rows falls in the first bucket >= r


class TimedKernels:
    """The compiled kernel module with every function call timed into `seconds` (a stand-in that the inference
    modules' `compiled_kernels()` returns while profiling)."""

    def __init__(self, kernels, totals: dict):
        self._kernels, self._totals = kernels, totals

    def __getattr__(self, name):
        function = getattr(self._kernels, name)
        if not callable(function) or isinstance(function, type):
            return function
        totals = self._totals

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                totals["kernels"] += time.perf_counter() - start

        return timed


KERNEL_CALLERS = (inference_copies, search, decoding, decoding_attention)  # modules that call compiled_kernels()


class PhaseTimer:
    """Seconds spent in the encoder and in decoder steps (by rows computed), by wrapping the two functions the fast
    loop calls for them, and in the compiled calls; `restore()` puts the originals back."""

    def __init__(self):
        self.encoder = 0.0
        self.encoder_calls = 0
        self.steps = collections.defaultdict(lambda: [0, 0.0, 0])  # bucket -> [steps, seconds, rows]
        self.original_encode = fast_generation.encode_by_length
        self.original_logits = decoding.DecoderSteps.logits
        timer = self

        def timed_encode(*args, **kwargs):
            start = time.perf_counter()
            try:
                return timer.original_encode(*args, **kwargs)
            finally:
                timer.encoder += time.perf_counter() - start
                timer.encoder_calls += 1

        def timed_logits(steps, tokens):
            start = time.perf_counter()
            try:
                return timer.original_logits(steps, tokens)
            finally:
                rows = tokens.shape[0]
                entry = timer.steps[next((b for b in ROW_BUCKETS if rows <= b), ROW_BUCKETS[-1] * 2)]
                entry[0] += 1
                entry[1] += time.perf_counter() - start
                entry[2] += rows

        fast_generation.encode_by_length = timed_encode
        decoding.DecoderSteps.logits = timed_logits
        # the compiled calls: the kernel module's functions, and the linear layers' (a `KernelLinear` called from Python)
        self.kernel_totals = {"kernels": 0.0}
        kernels = TimedKernels(compiled_kernels(), self.kernel_totals)
        self.original_callers = {module: module.compiled_kernels for module in KERNEL_CALLERS}
        for module in KERNEL_CALLERS:
            module.compiled_kernels = lambda: kernels
        # the compiled decoding steps (`DecoderLayerSteps`, every layer of a step in one call): an object made once per
        # decoder and kept by `CompiledDecoderLayers` (often before this timer exists), so its calls are timed where
        # `states` makes them, into `kernels` and into `decoding_steps` of their own (the passes translate one batch at
        # a time: no other thread calls `states` while its `kernel_steps` is the timed one)
        self.kernel_totals["decoding_steps"] = 0.0
        self.original_states = inference_copies.CompiledDecoderLayers.states

        def timed_states(layers, *args, **kwargs):
            kernel_steps = layers.kernel_steps

            def timed_kernel_steps(*step_args):
                start = time.perf_counter()
                try:
                    return kernel_steps(*step_args)
                finally:
                    seconds = time.perf_counter() - start
                    timer.kernel_totals["kernels"] += seconds
                    timer.kernel_totals["decoding_steps"] += seconds

            layers.kernel_steps = timed_kernel_steps
            try:
                return timer.original_states(layers, *args, **kwargs)
            finally:
                layers.kernel_steps = kernel_steps

        inference_copies.CompiledDecoderLayers.states = timed_states
        self.original_forwards = {cls: cls.forward for cls in (inference_copies.Int8Linear, inference_copies.Float32Linear)}
        for cls, forward in self.original_forwards.items():
            def timed_forward(layer, hidden_states, out=None, forward=forward):
                start = time.perf_counter()
                try:
                    return forward(layer, hidden_states, out)
                finally:
                    timer.kernel_totals["kernels"] += time.perf_counter() - start

            cls.forward = timed_forward

    @property
    def kernels(self) -> float:
        return self.kernel_totals["kernels"]

    @property
    def decoding_steps(self) -> float:
        return self.kernel_totals["decoding_steps"]

    def restore(self):
        fast_generation.encode_by_length = self.original_encode
        decoding.DecoderSteps.logits = self.original_logits
        inference_copies.CompiledDecoderLayers.states = self.original_states
        for module, function in self.original_callers.items():
            module.compiled_kernels = function
        for cls, forward in self.original_forwards.items():
            cls.forward = forward


def profile_one(model, tokenizer, sources, num_beams: int, quantization: str | None, top: int) -> dict:
    """Prints one quantization's and search's profile; returns its seconds by phase (`whole`, `encoder`, `steps`,
    `bookkeeping`, `outside`; `kernels`: the compiled calls within them; `decoding_steps`: the compiled decoding
    steps' share of `kernels`)."""
    label = f"{'int8' if quantization else 'float32'}, {'greedy' if num_beams == 1 else f'beam {num_beams}'}"

    def run():
        return hf_layerfusion.translate(model, tokenizer, sources, num_beams=num_beams, quantization=quantization)

    hf_layerfusion.translate(model, tokenizer, sources[:32], num_beams=num_beams, quantization=quantization)  # warm-up
    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    start = time.perf_counter()
    run()
    untimed = time.perf_counter() - start
    usage_after = resource.getrusage(resource.RUSAGE_SELF)

    totals = {"generate": 0.0}
    original_generate = translation_module.fast_generate

    def timed(*args, **kwargs):  # `translate`'s call of fast_generate, timed
        start = time.perf_counter()
        try:
            return original_generate(*args, **kwargs)
        finally:
            totals["generate"] += time.perf_counter() - start

    translation_module.fast_generate = timed
    timer = PhaseTimer()
    try:
        start = time.perf_counter()
        run()
        whole = time.perf_counter() - start
    finally:
        timer.restore()
        translation_module.fast_generate = original_generate
    step_seconds = sum(entry[1] for entry in timer.steps.values())
    step_count = sum(entry[0] for entry in timer.steps.values())
    bookkeeping = totals["generate"] - timer.encoder - step_seconds
    print(f"\n### {label}: {len(sources)} sentences, {whole:.2f} s timed ({untimed:.2f} s untimed)\n")
    # fresh memory the untimed pass touched: a page fault per 4 KiB page (the kernel zeroes it), counted as system time
    print(f"The untimed pass: {usage_after.ru_minflt - usage_before.ru_minflt} page faults, "
          f"{usage_after.ru_stime - usage_before.ru_stime:.2f} s system time, "
          f"{usage_after.ru_utime - usage_before.ru_utime:.2f} s user time (the process's).\n")
    print("| phase | seconds | share |")
    print("|---|---|---|")
    for phase, seconds in (
        (f"encoder ({timer.encoder_calls} batches)", timer.encoder),
        (f"decoder steps ({step_count})", step_seconds),
        ("search bookkeeping (the rest of fast_generate)", bookkeeping),
        ("translate() outside fast_generate (tokenizer, batching)", whole - totals["generate"]),
    ):
        print(f"| {phase} | {seconds:.2f} | {100 * seconds / whole:.0f}% |")
    print(f"| of all these: in calls of the compiled kernels | {timer.kernels:.2f} | {100 * timer.kernels / whole:.0f}% |")
    print(f"| of those: the compiled decoding steps (every decoder layer of a step in one call) | "
          f"{timer.decoding_steps:.2f} | {100 * timer.decoding_steps / whole:.0f}% |")
    print(f"| of all these: Python and torch operations around them | {whole - timer.kernels:.2f} | "
          f"{100 * (whole - timer.kernels) / whole:.0f}% |")
    print("\n| rows per step | steps | seconds | ms per step | µs per row |")
    print("|---|---|---|---|---|")
    previous = 0
    for bucket in sorted(timer.steps):
        steps, seconds, rows = timer.steps[bucket]
        print(f"| {previous + 1}-{bucket} | {steps} | {seconds:.2f} | {1e3 * seconds / steps:.2f} | "
              f"{1e6 * seconds / rows:.0f} |")
        previous = bucket
    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        run()
    print(f"\ntorch operators by self CPU time (a second pass, profiled; top {top}; the compiled kernels are no torch "
          "operators and do not appear):\n")
    print("```")
    print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=top, max_name_column_width=60))
    print("```")
    return dict(whole=whole, encoder=timer.encoder, steps=step_seconds, bookkeeping=bookkeeping,
                outside=whole - totals["generate"], kernels=timer.kernels, decoding_steps=timer.decoding_steps)


def main(argv=None) -> dict:
    """Prints the profiles; returns `{(quantization, num_beams): profile_one's seconds}`."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path, help="a trained model (e.g. a study run directory)")
    parser.add_argument("--data", type=Path, default=backbone.DEFAULT_DATA, help="Multi30k directory")
    parser.add_argument("--sentences", type=int, default=1000, help="Multi30k test sentences (default: all 1000)")
    parser.add_argument("--num-beams", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--quantization", nargs="+", choices=["float32", "int8"], default=["float32", "int8"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--top", type=int, default=15, help="operators listed")
    args = parser.parse_args(argv)
    if args.sentences < 1 or args.threads < 1 or args.top < 1 or min(args.num_beams) < 1:
        parser.error("--sentences, --threads, --top and --num-beams take positive integers")
    if not (args.model_dir / "config.json").is_file():
        parser.error(f"{args.model_dir} holds no config.json: give a saved model's directory")
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    command = reproduction_command(__spec__.name, sys.argv[1:])
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    sources = backbone.read_lines(args.data / "test_2016_flickr.en")[: args.sentences]
    kernels = compiled_kernels()
    print("## Where the fast loop spends its time on the real workload (issue 39)\n")
    print(f"- command (from the repository root): `{command}`")
    print(f"- torch {torch.__version__}, transformers {transformers.__version__}, hf_layerfusion "
          f"{hf_layerfusion.__version__} (git {backbone.git_revision()}), Python {platform.python_version()}")
    print(f"- CPU: {backbone.cpu_model()}, {args.threads} thread(s), OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, "
          f"load average at start {backbone.loadavg()}")
    if kernels is not None:
        bits = kernels.int8_code_bits()
        print(f"- int8 product: {kernels.int8_product(bits)} ({bits}-bit codes)")
    print(f"- model: {args.model_dir} ({model.config.model_type}, {model.config.encoder_layers} + "
          f"{model.config.decoder_layers} layers, d_model {model.config.d_model}, vocabulary {model.config.vocab_size})")
    profiles = {}
    for quantization in args.quantization:
        for num_beams in args.num_beams:
            profiles[quantization, num_beams] = profile_one(
                model, tokenizer, sources, num_beams, None if quantization == "float32" else "int8", args.top
            )
    print(f"\n(load average at end {backbone.loadavg()})")
    return profiles


if __name__ == "__main__":
    main()
