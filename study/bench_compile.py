"""Greedy generation on CPU: static cache + `torch.compile(fullgraph=True)` vs the default dynamic cache.

The plain backbone at the Multi30k size (`PlainTransformerConfig.from_preset("multi30k", vocab_size=8000)`, random
weights), 32 source sentences of 8..20 tokens, exactly 32 new tokens each (`min_new_tokens` = `max_new_tokens`, so
both runs do the same work). The compiled run uses transformers' own path: `cache_implementation="static"` with a
`CompileConfig(fullgraph=True)` (flagged for CPU, where transformers does not compile by default). Warm-up calls
(compilation included) are not timed; the two settings then alternate, and the medians are reported. The outputs
must be token-identical (asserted).

    python -m study.bench_compile [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
import time

# as in bench_backbone.py: spin-waiting OpenMP threads are very slow on shared cores
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
from transformers import CompileConfig  # noqa: E402

from hf_layerfusion import (  # noqa: E402
    PlainTransformerConfig,
    PlainTransformerForConditionalGeneration,
)

NUM_SENTENCES = 32
NEW_TOKENS = 32


def source_batch(config, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Right-padded random sentences of 8..20 tokens, each ending in EOS."""
    lengths = torch.randint(8, 21, (NUM_SENTENCES,), generator=generator)
    input_ids = torch.full((NUM_SENTENCES, int(lengths.max())), config.pad_token_id)
    for row, length in enumerate(lengths.tolist()):
        input_ids[row, : length - 1] = torch.randint(4, config.vocab_size, (length - 1,), generator=generator)
        input_ids[row, length - 1] = config.eos_token_id
    return {"input_ids": input_ids, "attention_mask": input_ids.ne(config.pad_token_id).long()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    config = PlainTransformerConfig.from_preset("multi30k", vocab_size=8000)
    model = PlainTransformerForConditionalGeneration(config).eval()
    batch = source_batch(config, torch.Generator().manual_seed(0))
    common = dict(do_sample=False, num_beams=1, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS)
    compile_config = CompileConfig(fullgraph=True)
    compile_config._compile_all_devices = True  # transformers' flag to compile on CPU too
    settings = {
        "dynamic cache (eager)": dict(common),
        "static cache + torch.compile": dict(common, cache_implementation="static", compile_config=compile_config),
    }

    def run(name):
        with torch.inference_mode():
            start = time.perf_counter()
            output = model.generate(**batch, **settings[name])
            return time.perf_counter() - start, output

    outputs, warmup_seconds = {}, {}
    for name in settings:
        warmup_seconds[name] = [run(name)[0] for _ in range(args.warmup)]
    times = {name: [] for name in settings}
    for repeat in range(args.repeats):
        for name in settings if repeat % 2 == 0 else reversed(list(settings)):
            seconds, outputs[name] = run(name)
            times[name].append(seconds)
    dynamic, static = (outputs[name] for name in settings)
    assert dynamic.shape == (NUM_SENTENCES, NEW_TOKENS + 1), dynamic.shape
    assert torch.equal(dynamic, static), "static + compiled generation differs from the dynamic-cache output"

    print(f"# {' '.join(shlex.quote(a) for a in [sys.executable, *sys.argv])}")
    print(
        f"# torch {torch.__version__}, {args.threads} threads, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}; "
        f"plain backbone from_preset('multi30k', vocab_size=8000), {sum(p.numel() for p in model.parameters()):,} "
        f"parameters; greedy, {NUM_SENTENCES} sentences x {NEW_TOKENS} new tokens; outputs token-identical"
    )
    medians = {}
    for name in settings:
        medians[name] = statistics.median(times[name])
        print(
            f"{name:30s} median {medians[name]:7.3f} s over {args.repeats} repeats "
            f"({NUM_SENTENCES * NEW_TOKENS / medians[name]:7.1f} tokens/s; all {[round(t, 3) for t in times[name]]}; "
            f"warm-up incl. compilation {[round(t, 1) for t in warmup_seconds[name]]} s)"
        )
    ratio = medians["dynamic cache (eager)"] / medians["static cache + torch.compile"]
    print(f"speed-up of static + compile over dynamic: {ratio:.2f}x (median time ratio)")


if __name__ == "__main__":
    main()
