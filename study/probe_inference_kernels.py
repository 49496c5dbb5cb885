"""Would a different matrix-product kernel make the fast CPU path meet issue 19's targets? Measured beside the ones
the package uses.

Issue 19 asks the plain backbone's fast float32 loop for >= 2.0x `MarianMTModel` and its int8 loop for >= 2.8x. The
fast loop spends most of a step in matrix products (`study/fast_cpu_translation_log.md`), so the candidates are the
kernels torch ships beside the package's compiled float32 kernel (`Float32Linear`: weights packed in panels of 16
output features, AVX-512 multiply-adds) and its compiled int8 kernel (`Int8Linear`: per-row int8 activations, the
product on AMX tiles where the CPU has them, dequantization, in one C++ call) on x86, each in the package's inference
copy (`kernel_copy`: the same copy with another linear layer; attention is the decoding-attention kernel):

- float32: **`F.linear`** (MKL's sgemm, `addmm`: what the model itself runs);
- float32: **MKL packed GEMM** (`torch.ops.mkl._mkl_linear` with weights packed by `_mkl_reorder_linear_weight`, what
  inductor's freezing uses on CPU). The packing is specific to the number of input rows, so this probe packs each
  linear layer once per row count it meets (a batch of 32 rows in greedy search, 128 in beam-4, the encoder's
  sentences x positions). Its results are bit-identical to `F.linear` here (checked below: same tokens);
- float32: the fast loop on **the model itself** (`F.linear` and SDPA: what runs where the compiled kernels do not).
- int8: **oneDNN `qlinear_pointwise`** (AMX/VNNI int8 products with the weights prepacked), fed with `Int8Linear`'s
  int8 weights and symmetric per-row activation codes computed in Python.
- int8: the compiled kernel with **exact float32 block products** (`at::mm` over blocks of 1,024 inputs) for the
  product, what it runs on CPUs without AMX, VNNI or AVX2 (the same numbers);
- int8: the compiled kernel in the **7-bit format** (`int8_copy(model, 7)`: AVX2's `vpmaddubsw` product), what CPUs
  with AVX2 and neither AMX nor VNNI run by default (other numbers: a coarser format), where the CPU's default is 8
  bits.
- int8: the package's own **AVX-512 VNNI kernel** at every size, where the default product is oneDNN's s8 x s8
  product through `at::_int_mm` (from `ONEDNN_MINIMUM_ROWS` rows): the same numbers;
- int8: **`quantized::linear_dynamic`** (what `Int8Linear` ran before the compiled kernel): each row divided by its
  largest magnitude in Python, then the kernel quantizes the whole input with one scale itself.

The setting is `bench_inference.py`'s (the Multi30k preset, random weights shared with `MarianMTModel`, 32
`test_2016_flickr.en` sentences, exactly 32 new tokens, greedy and beam-4, one thread); the engines alternate and
each ratio is the median of per-repeat ratios with its [min-max] range. The probe also times each kernel alone on one
decoder-step-sized product (32 rows), where the data stays in cache, beside the same product inside a full step, and
the int8 copy's decoding-attention kernel beside SDPA on the attention calls of a decoding step. Every int8 candidate
runs in the int8 copy, whose attention is that kernel.

    python -m study.probe_inference_kernels [--repeats 5]

`--workload MODEL_DIR` (a trained model, e.g. a study run directory) asks the same question on the real workload
(issue 39, item 5: keep a hand kernel only where no library primitive comes within ~10% of it there): the Multi30k
test sentences (`--sentences`, default all 1000) translated as `hf_layerfusion.translate` does, by the package's
float32 and int8 copies and by the same copies with each library product instead (F.linear, MKL packed; float32
blocks, oneDNN `qlinear_pointwise`, `linear_dynamic`, the 7-bit format where the CPU's default is 8 bits, and the
package's VNNI kernel where the default product is oneDNN's), alternated on chunks of sentences (`bench_inference.alternate_on_chunks`), greedy and beam-4:
seconds, the ratio to the package's kernel of the same precision, BLEU and translations identical to the package's.

    python -m study.probe_inference_kernels --workload runs/study/runs/steps_2000_warmup_1000/plain_transformer/seed_1
"""

from __future__ import annotations

import argparse
import functools
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
from torch import nn  # noqa: E402

from hf_layerfusion.inference import (  # noqa: E402
    fast_decoding_loop,
    fast_generate,
    prepare_for_inference,
)
from hf_layerfusion.inference.cpu_kernels import compiled_kernels  # noqa: E402
from hf_layerfusion.inference.inference_copies import (  # noqa: E402
    Float32Linear,
    Int8Linear,
    int8_copy,
    kernel_copy,
)
from study import bench_backbone as backbone  # noqa: E402
from study import bench_inference  # noqa: E402

FLOAT32 = "plain: fast float32 (Float32Linear, compiled)"
INT8 = "plain: fast int8 (Int8Linear, compiled)"
SEVEN_BIT = "plain: fast int8, 7-bit codes"
VNNI_KERNEL = "plain: fast int8, the package's VNNI kernel"
MODEL_ITSELF = "plain: fast loop on the model itself (F.linear, SDPA)"


class TorchLinear(nn.Module):
    """`F.linear` (MKL's sgemm, what `nn.Linear` runs) with the inference copies' layer signature."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool = False):
        super().__init__()
        self.weight, self.bias, self.relu = weight.detach(), None if bias is None else bias.detach(), relu

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        output = torch.nn.functional.linear(hidden_states, self.weight, self.bias)
        return torch.relu(output) if self.relu else output


class MKLPackedLinear(nn.Module):
    """`nn.Linear` through MKL's packed GEMM, packed once per input row count (the packing depends on it)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool = False):
        super().__init__()
        self.weight, self.bias, self.relu = weight.detach(), None if bias is None else bias.detach(), relu
        self.packed: dict[int, torch.Tensor] = {}

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        rows = hidden_states.numel() // hidden_states.shape[-1]
        packed = self.packed.get(rows)
        if packed is None:
            packed = self.packed[rows] = torch.ops.mkl._mkl_reorder_linear_weight(self.weight, rows)
        output = torch.ops.mkl._mkl_linear(hidden_states, packed, self.weight, self.bias, rows)
        return torch.relu(output) if self.relu else output


class OneDNNInt8Linear(nn.Module):
    """`Int8Linear`'s int8 weights through oneDNN's `qlinear_pointwise`, with symmetric per-row int8 activations
    quantized here."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool = False):
        super().__init__()
        codes = Int8Linear(weight, bias, code_bits=8)
        self.weight_scales, self.bias, self.relu = codes.weight_scale, codes.bias, relu
        self.packed = torch.ops.onednn.qlinear_prepack(codes.weight_t.t(), None)
        self.zero_points = torch.zeros(weight.shape[0], dtype=torch.int64)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        row_scale = hidden_states.abs().amax(dim=-1, keepdim=True).clamp_min_(torch.finfo(hidden_states.dtype).tiny)
        int8_states = torch.round(hidden_states * (127 / row_scale)).to(torch.int8)
        output = torch.ops.onednn.qlinear_pointwise(
            int8_states, 1 / 127, 0, self.packed, self.weight_scales, self.zero_points, None, 1.0, 0, torch.float32,
            "none", [], "",
        )
        output = output.mul_(row_scale) if self.bias is None else torch.addcmul(self.bias, output, row_scale)
        return torch.relu(output) if self.relu else output


class FloatBlocksInt8Linear(Int8Linear):
    """`Int8Linear` without packed weights: the compiled kernel's exact float32 block products."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool = False):
        super().__init__(weight, bias, relu)
        self.packed_weights = self.weight_t.new_empty(0)
        if self.kernel_linear is not None:  # bound again: the call reads the weights it was bound with
            self.kernel_linear = compiled_kernels().KernelLinear.int8(
                self.weight_t, self.packed_weights, self.column_sums, self.weight_scale, self.bias, relu, self.code_bits
            )


class VnniKernelInt8Linear(Int8Linear):
    """`Int8Linear` on the package's own AVX-512 VNNI kernel at every size, where the default product is oneDNN's
    (`at::_int_mm`, from `ONEDNN_MINIMUM_ROWS` rows): the same numbers, the hand kernel's speed."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool = False):
        super().__init__(weight, bias, relu)
        kernel = compiled_kernels()
        self.packed_weights = kernel.pack_int8_weights(self.weight_t, self.code_bits, "vnni")
        self.kernel_linear = kernel.KernelLinear.int8(
            self.weight_t, self.packed_weights, self.column_sums, self.weight_scale, self.bias, relu, self.code_bits,
            "vnni",
        )


class DynamicInt8Linear(nn.Module):
    """`quantized::linear_dynamic` with per-channel int8 weights packed for oneDNN, each input row first divided by
    its largest magnitude (the kernel then quantizes the whole input with one scale) and multiplied back after."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool = False):
        super().__init__()
        codes = Int8Linear(weight, bias, code_bits=8)
        self.relu = relu
        qweight = torch._make_per_channel_quantized_tensor(
            codes.weight_t.t(), codes.weight_scale.double(), torch.zeros(weight.shape[0], dtype=torch.int64), 0
        )
        previous, torch.backends.quantized.engine = torch.backends.quantized.engine, "onednn"
        try:
            self.packed = torch.ops.quantized.linear_prepack(qweight, None)
        finally:
            torch.backends.quantized.engine = previous
        self.bias = codes.bias

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        row_scale = hidden_states.abs().amax(dim=-1, keepdim=True).clamp_min_(torch.finfo(hidden_states.dtype).tiny)
        output = torch.ops.quantized.linear_dynamic(hidden_states / row_scale, self.packed, False)
        output = output.mul_(row_scale) if self.bias is None else torch.addcmul(self.bias, output, row_scale)
        return torch.relu(output) if self.relu else output


def microseconds(function, calls: int = 200, repeats: int = 5) -> float:
    for _ in range(20):
        function()
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def print_isolated_products(rows: int, unusable: dict[str, str]) -> None:
    """Each kernel on the decoder's products at `rows` rows, alone (inputs and weights stay in cache)."""
    print(f"\n### One product alone ({rows} rows, cache-hot), microseconds per call\n")
    kernel = compiled_kernels()
    default_bits = 8 if kernel is None else kernel.int8_code_bits()
    seven_bit = f"int8 compiled, 7-bit ({kernel.int8_product(7)})" if default_bits == 8 and kernel is not None else None
    print(f"| product | F.linear | MKL packed | float32 compiled (Float32Linear) | int8 compiled (Int8Linear: "
          f"{'not compiled' if kernel is None else kernel.int8_product(default_bits)}) | "
          "int8 compiled, float32 blocks | int8 oneDNN qlinear | int8 linear_dynamic |"
          + (f" {seven_bit} |" if seven_bit else ""))
    print("|---|---|---|---|---|---|---|---|" + ("---|" if seven_bit else ""))
    left_out = {LIBRARY_CANDIDATES[title][0] for title in unusable}
    classes = [MKLPackedLinear, Float32Linear, Int8Linear, FloatBlocksInt8Linear, OneDNNInt8Linear, DynamicInt8Linear]
    if seven_bit:
        classes.append(functools.partial(Int8Linear, code_bits=7))
    generator = torch.Generator().manual_seed(0)
    for inputs, outputs in ((256, 256), (256, 1024), (1024, 256), (256, 8000)):
        states = torch.randn(rows, inputs, generator=generator)
        linear = nn.Linear(inputs, outputs)
        layers = [cls(linear.weight, linear.bias) for cls in classes]
        with torch.inference_mode():
            cells = [
                "left out" if type(f) in left_out else f"{microseconds(lambda f=f, x=states: f(x)):.1f}"
                for f in (linear, *layers)
            ]
        print(f"| {inputs} -> {outputs} | " + " | ".join(cells) + " |")


def print_isolated_attention(kernels) -> None:
    """The int8 copy's decoding attention (`decode_attention`, kernels/decode_attention.cpp) beside SDPA (as
    transformers calls it, output transposed to (rows, queries, heads, head_dim)) on the attention calls of this
    setting's decoding steps (4 heads of 64): alone with its data in cache, and with the keys/values of 6 layers
    cycled and 16 MB of other data written between rounds (the loop's situation; that write's own time subtracted)."""
    print("\n### One decoding attention call, microseconds: SDPA against the kernel\n")
    print("| call | SDPA, cache-hot | kernel, cache-hot | SDPA, 6 layers + other data | kernel, 6 layers + other data |")
    print("|---|---|---|---|---|")
    generator = torch.Generator().manual_seed(0)
    heads, head_dim, scaling = 4, 64, 64**-0.5

    def row_major(rows, keys):  # the decoding cache's self-attention view: (rows, capacity, heads, d) buffers
        return torch.randn(rows, 40, heads, head_dim, generator=generator)[:, :keys].transpose(1, 2)

    def contiguous(rows, keys):  # cross-attention keys/values, computed once per input
        return torch.randn(rows, heads, keys, head_dim, generator=generator)

    padding = torch.ones(32, 1, 1, 32, dtype=torch.bool)
    padding[::3, :, :, 20:] = False
    cases = (  # title, rows, queries, layout, keys, mask
        ("cross-attention, greedy: 32 rows, 1 query, 32 source positions", 32, 1, contiguous, 32, padding),
        ("cross-attention, beam-4: 32 sentences, 4 beams folded as queries", 32, 4, contiguous, 32, padding),
        ("self-attention, greedy, 16th step: 32 rows", 32, 1, row_major, 16, None),
        ("self-attention, beam-4, 16th step: 128 rows", 128, 1, row_major, 16, None),
        ("self-attention, beam-4, 32nd step: 128 rows", 128, 1, row_major, 32, None),
    )
    other_data = torch.zeros(4 * 1024 * 1024)
    for title, rows, queries, layout, keys, mask in cases:
        query = torch.randn(rows, heads, queries, head_dim, generator=generator)
        layers = [(layout(rows, keys), layout(rows, keys)) for _ in range(6)]

        def sdpa(key, value):
            output = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
            return output.transpose(1, 2).contiguous()

        def kernel(key, value):
            return kernels.decode_attention(query, key, value, mask, scaling)

        cells = [microseconds(lambda f=f: f(*layers[0])) for f in (sdpa, kernel)]
        touch = microseconds(lambda: other_data.add_(1), calls=20)
        for f in (sdpa, kernel):
            def round_of_layers(f=f):
                for key, value in layers:
                    f(key, value)
                other_data.add_(1)
            cells.append((microseconds(round_of_layers, calls=20) - touch) / len(layers))
        print(f"| {title} | " + " | ".join(f"{cell:.1f}" for cell in cells) + " |")


# the library products' candidates: title -> (linear layer class, quantization of the copy)
LIBRARY_CANDIDATES = {
    "plain: fast float32, F.linear (addmm)": (TorchLinear, None),
    "plain: fast float32, MKL packed": (MKLPackedLinear, None),
    "plain: fast int8, float32 blocks": (FloatBlocksInt8Linear, "int8"),
    "plain: fast int8, oneDNN qlinear": (OneDNNInt8Linear, "int8"),
    "plain: fast int8, linear_dynamic": (DynamicInt8Linear, "int8"),
}
# a candidate whose one product takes this many times the package's kernel's is left out of the timed runs (a
# library path that falls back to reference code on this CPU would take hours there)
UNUSABLE_SLOWDOWN = 20.0


def unusable_candidates() -> dict[str, str]:
    """`{title: why}` of the candidates of `LIBRARY_CANDIDATES` whose product of 32 rows 256 -> 1024 (the fastest of
    three calls) takes more than `UNUSABLE_SLOWDOWN` times the package's kernel of the same precision on this CPU, or
    that the installed torch refuses (a RuntimeError at its first product)."""
    linear = nn.Linear(256, 1024)
    states = torch.randn(32, 256)
    with torch.inference_mode():
        package = {None: microseconds(lambda f=Float32Linear(linear.weight, linear.bias): f(states), calls=20),
                   "int8": microseconds(lambda f=Int8Linear(linear.weight, linear.bias): f(states), calls=20)}
        unusable = {}
        for title, (layer_class, quantization) in LIBRARY_CANDIDATES.items():
            try:
                layer = layer_class(linear.weight, linear.bias)
                layer(states)
            except RuntimeError as error:
                # a private library op whose arguments this torch release takes otherwise (torch 2.6's oneDNN
                # qlinear_pointwise wants uint8 activations)
                unusable[title] = f"torch {torch.__version__} refused it ({str(error).splitlines()[0]}): left out"
                continue
            once = float("inf")
            for _ in range(3):  # the fastest of three calls: one slow call under other load leaves nothing out
                start = time.perf_counter()
                layer(states)
                once = min(once, (time.perf_counter() - start) * 1e6)
            if once > UNUSABLE_SLOWDOWN * package[quantization]:
                unusable[title] = (f"one product of 32 rows 256 -> 1024 took {once:.0f} µs against the package's "
                                   f"{package[quantization]:.0f} µs: left out")
    return unusable


def candidate_copies(model, unusable: dict[str, str]) -> dict:
    """`{title: (inference copy, quantization)}`: the package's float32 and int8 copies of `model` and the same copies
    with each usable library product (or the other int8 format) instead of the package's kernel."""
    kernel = compiled_kernels()
    copies = {FLOAT32: (prepare_for_inference(model), None), INT8: (prepare_for_inference(model, "int8"), "int8")}
    for title, (layer_class, quantization) in LIBRARY_CANDIDATES.items():
        if title not in unusable:
            copies[title] = (kernel_copy(model, layer_class, quantization or "float32"), quantization)
    if kernel is not None and kernel.int8_code_bits() == 8:
        copies[SEVEN_BIT] = (int8_copy(model, 7), "int8")
    if kernel is not None and kernel.int8_products(8)[0] == "onednn":  # the hand kernel the library replaced
        copies[VNNI_KERNEL] = (kernel_copy(model, VnniKernelInt8Linear, "int8"), "int8")
    return copies


def print_workload_probe(args) -> None:
    """The candidates of `candidate_copies` on the real workload of a trained model (`--workload`)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import hf_layerfusion
    from hf_layerfusion.translation.bleu import corpus_bleu

    model = AutoModelForSeq2SeqLM.from_pretrained(args.workload).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.workload)
    sources = backbone.read_lines(args.data / "test_2016_flickr.en")[: args.sentences]
    references = backbone.read_lines(args.data / "test_2016_flickr.de")[: args.sentences]
    copies = candidate_copies(model, args.unusable)
    for search, num_beams in bench_inference.SEARCHES.items():
        engines = {
            title: (lambda s, c=copy, q=quantization: hf_layerfusion.translate(
                c, tokenizer, s, num_beams=num_beams, quantization=q))
            for title, (copy, quantization) in copies.items()
        }
        seconds, translations = bench_inference.alternate_on_chunks(engines, sources)
        print(f"\n### The real workload: {args.workload} ({model.config.model_type}), {len(sources)} Multi30k test "
              f"sentences, {search} (num_beams={num_beams}), 1 thread\n")
        print(f"Batches of 32 sorted by length, each sentence stopping at its end token; candidates alternated on chunks "
              f"of {bench_inference.WORKLOAD_CHUNK} sentences; ratio: median of per-chunk ratios [min-max], the "
              "package's kernel of the same precision over the candidate (below 1: the candidate is slower).\n")
        print("| engine | seconds | vs the package's kernel | BLEU | translations identical to the package's |")
        print("|---|---|---|---|---|")
        for title, samples in seconds.items():
            own = INT8 if "int8" in title else FLOAT32
            versus = "–" if title == own else bench_inference.ratio_cell(seconds, title, own)[1]
            same = sum(a == b for a, b in zip(translations[title], translations[own]))
            print(f"| {title.removeprefix('plain: ')} | {sum(samples):.1f} | {versus} | "
                  f"{corpus_bleu(translations[title], references)[0]:.2f} "
                  f"| {same}/{len(sources)} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", type=Path, default=backbone.DEFAULT_DATA)
    parser.add_argument("--workload", type=Path, default=None,
                        help="a trained model's directory: the candidates on the real workload instead")
    parser.add_argument("--sentences", type=int, default=None, help="with --workload: test sentences (default: all)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    if args.sentences is not None and (args.workload is None or args.sentences < 1):
        parser.error(f"--sentences takes a positive count, with --workload only; got {args.sentences}")
    if args.workload is not None and not (args.workload / "config.json").is_file():
        parser.error(f"--workload {args.workload} holds no config.json: give a saved model's directory")
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", message=".*quantized.*")

    kernel = compiled_kernels()
    int8_product = "not compiled" if kernel is None else kernel.int8_product(kernel.int8_code_bits())
    print("## Candidate kernels for the fast CPU path (issues 19 and 39)\n")
    print(f"- command: `python -m study.probe_inference_kernels {shlex.join(argv or sys.argv[1:])}`".rstrip())
    print(f"- torch {torch.__version__}, Python {platform.python_version()}, git {backbone.git_revision()}; CPU: "
          f"{backbone.cpu_model()} (int8 kernel: {int8_product}), 1 thread, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, load average at start "
          f"{backbone.loadavg()}")
    args.unusable = unusable_candidates()
    for title, why in args.unusable.items():
        print(f"- {title}: {why}")
    if args.workload is not None:
        print_workload_probe(args)
        print(f"\n(load average at end {backbone.loadavg()})")
        return
    tokenizer = backbone.train_tokenizer(args.data, 8000)
    batch = backbone.encode_batch(tokenizer, backbone.read_lines(args.data / "test_2016_flickr.en")[:32])
    marian = backbone.build_marian(len(tokenizer), 0).eval()
    plain = backbone.build_model("plain", marian, 0).eval()
    models = {title: copy for title, (copy, _) in candidate_copies(plain, args.unusable).items()}
    engines = {title: (lambda kwargs, m=model: fast_generate(m, **batch, **kwargs)) for title, model in models.items()}

    def model_itself(kwargs):
        with torch.inference_mode():
            return plain.generate(**batch, custom_generate=fast_decoding_loop(fallback=False), **kwargs)

    engines[MODEL_ITSELF] = model_itself

    for search, num_beams in bench_inference.SEARCHES.items():
        kwargs = bench_inference.generation_kwargs(num_beams, 32)
        with torch.inference_mode():
            reference = marian.generate(**batch, **kwargs)
        tokens = {title: run(kwargs) for title, run in engines.items()}
        float_tokens = tokens[FLOAT32]

        def same(title, other_tokens=reference):
            if title not in tokens:
                return "left out"
            return "yes" if torch.equal(tokens[title], other_tokens) else "NO"

        def rows_equal(title):
            return "left out" if title not in tokens else f"{int((tokens[title] == float_tokens).all(1).sum())}/32"

        print(f"\n### {search} (num_beams={num_beams}), wall-clock seconds, 1 thread\n")
        print(f"- tokens == MarianMTModel's: fast float32 compiled {same(FLOAT32)}, F.linear "
              f"{same('plain: fast float32, F.linear (addmm)')}, MKL packed {same('plain: fast float32, MKL packed')}, "
              f"the model itself {same(MODEL_ITSELF)}; compiled int8 with float32 blocks == with {int8_product}: "
              f"{same('plain: fast int8, float32 blocks', tokens[INT8])}; "
              f"rows equal to float32: compiled int8 {rows_equal(INT8)}, "
              f"linear_dynamic {rows_equal('plain: fast int8, linear_dynamic')}\n")

        def run_marian(kwargs=kwargs):
            with torch.inference_mode():
                return marian.generate(**batch, **kwargs)

        runs = {"MarianMTModel generate()": run_marian, **{title: (lambda r=run, k=kwargs: r(k)) for title, run in engines.items()}}
        wall, _ = bench_inference.interleaved_seconds(runs, args.repeats)
        print("| engine | seconds | vs MarianMTModel | vs the package's kernel |")
        print("|---|---|---|---|")
        # the package's kernel of the same precision (the ratio: its seconds / the candidate's)
        replaced = {title: (INT8 if "int8" in title else FLOAT32) for title in engines if title not in (FLOAT32, INT8)}
        for title, samples in wall.items():
            versus = bench_inference.ratio_cell(wall, title, "MarianMTModel generate()")[1] if title != "MarianMTModel generate()" else "1"
            own = bench_inference.ratio_cell(wall, title, replaced[title])[1] if title in replaced else "–"
            print(f"| {title} | {statistics.median(samples):.3f} | {versus} | {own} |")
    print_isolated_products(32, args.unusable)
    if kernel is not None:
        print_isolated_attention(kernel)
    print(f"\n(load average at end {backbone.loadavg()})")


if __name__ == "__main__":
    main()
