"""Where the fast decoding loop spends its time (issue 19): operator profiles and the per-step overhead.

In `bench_inference.py`'s setting (the Multi30k preset, random weights shared with `MarianMTModel`, 32
`test_2016_flickr.en` sentences, exactly 32 new tokens, one thread) this prints, for the fast loop of the plain
backbone (or `--model`, a model name of `bench_backbone.py`) in greedy search (or `--num-beams`), float32 and int8:

- the wall-clock seconds of one translation beside `MarianMTModel.generate()` (median of `--repeats`);
- `torch.profiler`'s table of the operators with the most self CPU time (one more translation, profiled; the
  compiled kernels are labelled `Float32Linear (compiled kernel)`, `Int8Linear (compiled kernel)` and
  `decode_attention (compiled kernel)` (the copies' attention at decoding steps), their self time includes their call
  from Python);
- the per-step cost of everything but arithmetic: the same loop on a model of the same shape with d_model 16 (FFN 64,
  one attention head of 16 dimensions, the decoding-attention kernel's smallest), whose products and attention take
  next to no time, divided by its 33 decoder steps;
- the copy's linear layers by product shape (one more translation, each call timed): in the encoder (its groups of
  sentences of similar length), for the cross-attention keys/values (once per input) or at decoding steps.

    python -m study.profile_decoder_step [--repeats 5] [--rows 12]
    python -m study.profile_decoder_step --model lc_14 --num-beams 4
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time
import warnings
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import transformers  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from hf_layerfusion import LayerFusionForConditionalGeneration  # noqa: E402
from hf_layerfusion.inference import fast_generate, prepare_for_inference  # noqa: E402
from hf_layerfusion.inference.cpu_kernels import compiled_kernels  # noqa: E402
from hf_layerfusion.inference.decoding import DecoderSteps  # noqa: E402
from hf_layerfusion.inference.inference_copies import Float32Linear, Int8Linear  # noqa: E402
from study import bench_backbone as backbone  # noqa: E402
from study import bench_inference  # noqa: E402

NEW_TOKENS = 32


def seconds(function, repeats: int) -> float:
    function()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def profiled(function, label: str):
    """`torch.profiler` lists aten operators only: the compiled kernels (pybind calls) are labelled for it here."""

    def labelled(*args, **kwargs):
        with record_function(label):
            return function(*args, **kwargs)

    return labelled


def linear_times_by_shape(run, source_rows: int) -> list[str]:
    """Markdown rows: per (kernel layer, in -> out, where) the calls, total ms and µs per call of one `run()` (each
    call timed with `time.perf_counter`); where: the encoder (its groups of similar length), the cross-attention
    keys/values (`source_rows` positions, once per input) or the decoding steps."""
    totals: dict[tuple, list] = {}
    forwards = {layer: layer.forward for layer in (Float32Linear, Int8Linear)}
    logits = DecoderSteps.logits
    in_decoder = [False]

    def decoder_step(self, tokens):
        in_decoder[0] = True
        try:
            return logits(self, tokens)
        finally:
            in_decoder[0] = False

    def timed(forward):
        def call(self, hidden_states, out=None):
            start = time.perf_counter()
            output = forward(self, hidden_states, out)
            rows = hidden_states.numel() // hidden_states.shape[-1]
            where = ("encoder" if not in_decoder[0] else
                     "cross-attention keys/values" if rows == source_rows else "decoding steps")
            entry = totals.setdefault((type(self).__name__, f"{self.in_features} -> {self.out_features}", where), [0, 0.0])
            entry[0] += 1
            entry[1] += time.perf_counter() - start
            return output

        return call

    for layer, forward in forwards.items():
        layer.forward = timed(forward)
    DecoderSteps.logits = decoder_step
    try:
        run()
    finally:
        for layer, forward in forwards.items():
            layer.forward = forward
        DecoderSteps.logits = logits
    return [f"| {layer} | {shape} | {where} | {calls} | {seconds * 1e3:.1f} | {seconds / calls * 1e6:.0f} |"
            for (layer, shape, where), (calls, seconds) in sorted(totals.items())]


def narrow_copy(model):
    """A model of `model`'s shape (layers, vocabulary, family settings) with d_model 16, FFN 64 and one attention head
    (head_dim 16: the copies' attention runs the decoding-attention kernel, as in the full-size model)."""
    config = model.config.__class__(**{**model.config.to_dict(), "d_model": 16, "encoder_ffn_dim": 64,
                                       "decoder_ffn_dim": 64, "encoder_attention_heads": 1,
                                       "decoder_attention_heads": 1})
    return LayerFusionForConditionalGeneration(config).eval()


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rows", type=int, default=12, help="operators shown per profile")
    parser.add_argument("--data", type=Path, default=backbone.DEFAULT_DATA)
    parser.add_argument("--model", default="plain", choices=[name for name in backbone.MODELS if name != "marian"])
    parser.add_argument("--num-beams", type=int, default=1)
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.rows < 1 or args.num_beams < 1:
        parser.error(f"--repeats, --rows and --num-beams must be >= 1, got {args.repeats}, {args.rows} and "
                     f"{args.num_beams}")
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore", message=".*quantized.*")
    print("## Where the fast decoding loop spends its time (issue 19)\n")
    print(f"- command: `python -m study.profile_decoder_step {shlex.join(argv or sys.argv[1:])}`".rstrip())
    print(f"- torch {torch.__version__}, Python {platform.python_version()}, git {backbone.git_revision()}; CPU: "
          f"{backbone.cpu_model()}, 1 thread, load average at start {backbone.loadavg()}")
    tokenizer = backbone.train_tokenizer(args.data, 8000)
    batch = backbone.encode_batch(tokenizer, backbone.read_lines(args.data / "test_2016_flickr.en")[:32])
    marian = backbone.build_marian(len(tokenizer), 0).eval()
    model = backbone.build_model(args.model, marian, 0).eval()
    narrow = narrow_copy(model)
    kwargs = bench_inference.generation_kwargs(args.num_beams, NEW_TOKENS)

    def run_marian():
        with torch.inference_mode():
            return marian.generate(**batch, **kwargs)

    marian_seconds = seconds(run_marian, args.repeats)
    print(f"- model: {args.model}, num_beams={args.num_beams}; MarianMTModel generate(): {marian_seconds:.3f} s (median "
          f"of {args.repeats})")
    for quantization in (None, "int8"):
        name = quantization or "float32"
        for prepared in (model, narrow):
            prepare_for_inference(prepared, quantization)
        run = lambda m=model, q=quantization: fast_generate(m, **batch, quantization=q, fallback=False, **kwargs)  # noqa: E731
        fast_seconds = seconds(run, args.repeats)
        narrow_seconds = seconds(lambda q=quantization: run(narrow, q), args.repeats)
        forwards = {layer: layer.forward for layer in (Float32Linear, Int8Linear)}
        for layer, forward in forwards.items():
            layer.forward = profiled(forward, f"{layer.__name__} (compiled kernel)")
        kernels = compiled_kernels()
        if kernels is not None:  # the copies' decoding attention (`decoding_attention_forward` looks it up per call)
            attention = kernels.decode_attention
            kernels.decode_attention = profiled(attention, "decode_attention (compiled kernel)")
        try:
            with profile(activities=[ProfilerActivity.CPU]) as profiler:
                run()
        finally:
            for layer, forward in forwards.items():
                layer.forward = forward
            if kernels is not None:
                kernels.decode_attention = attention
        print(f"\n### fast loop, {name}: {fast_seconds:.3f} s ({marian_seconds / fast_seconds:.2f}x Marian); the same "
              f"loop at d_model 16: {narrow_seconds:.3f} s = {narrow_seconds / (NEW_TOKENS + 1) * 1000:.2f} ms per "
              f"decoder step\n")
        print("```")
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.rows))
        print("```")
        print(f"\nIts linear layers by product shape ({int(batch['attention_mask'].sum())} source tokens, "
              f"{batch['input_ids'].numel()} positions with padding):\n")
        print("| layer | product | rows | calls | ms | µs per call |")
        print("|---|---|---|---|---|---|")
        print("\n".join(linear_times_by_shape(run, batch["input_ids"].numel())))
    print(f"\n(load average at end {backbone.loadavg()})")


if __name__ == "__main__":
    main()
