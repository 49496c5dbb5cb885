"""Where AMX tiles overtake VNNI's kernels on a CPU with both: the int8 products of the Multi30k preset's layers
(d_model 256, FFN 1024, 8k vocabulary) by rows, on the same packed weights, each product forced both ways through
`int8_linear`'s `amx_minimum_rows` (0: tiles at every size; a huge minimum: VNNI's kernels at every size) and the two
alternating in one process, so that drift between processes does not enter the ratio. The kernel's default
(`AMX_MINIMUM_ROWS`) sends products of fewer rows to VNNI's kernels: a tile computes 16 rows whatever the call's, and
the tiles' sums pass through memory before they are dequantized, where VNNI's kernels dequantize in registers.

Both ways give the same numbers (checked on every product). On a CPU without AMX and VNNI there is nothing to compare
and the probe says so.

    python -m study.probe_amx_rows
    python -m study.probe_amx_rows --threads 2 --rows 1 4 8 32
"""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import statistics
import sys
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

from hf_layerfusion.inference.cpu_kernels import compiled_kernels  # noqa: E402
from hf_layerfusion.inference.inference_copies import Int8Linear  # noqa: E402
from study import bench_backbone as backbone  # noqa: E402

# (in, out, ReLU folded in): a decoder layer's products (fused query/key/value, attention output, FFN in and out)
# and the output projection
SHAPES = [(256, 768, False), (256, 256, False), (256, 1024, True), (1024, 256, False), (256, 8000, False)]
VNNI_ALWAYS = 10**9


def microseconds_per_call(kernels, inputs, codes, amx_minimum_rows: int, calls: int) -> float:
    kernels.int8_linear(inputs, *codes, amx_minimum_rows=amx_minimum_rows)
    start = time.perf_counter()
    for _ in range(calls):
        kernels.int8_linear(inputs, *codes, amx_minimum_rows=amx_minimum_rows)
    return (time.perf_counter() - start) / calls * 1e6


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 5, 6, 7, 8, 10, 12, 16, 32, 128])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=5, help="alternating timings per product (median)")
    args = parser.parse_args(argv)
    for name, values in (("--rows", args.rows), ("--threads", [args.threads]), ("--repeats", [args.repeats])):
        if any(value < 1 for value in values):
            parser.error(f"{name} must be positive, got {' '.join(map(str, values))}")
    kernels = compiled_kernels()
    if kernels is None or not kernels.int8_product(8).startswith("AMX ("):
        product = "no compiled kernels" if kernels is None else kernels.int8_product(8)
        print(f"This CPU's int8 product is {product}: the probe compares AMX tiles with VNNI's kernels, which needs both.")
        return 0
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print("#### AMX tiles against VNNI's kernels on the same weights, by rows")
    print(f"- command: `python -m study.probe_amx_rows {shlex.join(argv if argv is not None else sys.argv[1:])}`"
          .rstrip())
    print(f"- torch {torch.__version__}, Python {platform.python_version()}, git {backbone.git_revision()}; CPU: "
          f"{backbone.cpu_model()} (int8 product: {kernels.int8_product(8)}), {args.threads} thread(s), "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, load average at start {backbone.loadavg()}")
    print(f"- microseconds per call, the median of {args.repeats} alternating timings; the kernel's default sends "
          f"fewer than {kernels.AMX_MINIMUM_ROWS} rows to VNNI's kernels\n")
    print("| product | rows | AMX tiles | VNNI kernels | tiles' time / VNNI's |")
    print("|---|---|---|---|---|")
    for in_features, out_features, relu in SHAPES:
        layer = Int8Linear(torch.randn(out_features, in_features) * 0.05, torch.randn(out_features) * 0.1, relu=relu,
                           code_bits=8)
        codes = (layer.weight_t, layer.packed_weights, layer.column_sums, layer.weight_scale, layer.bias, relu, 8)
        name = f"{in_features} -> {out_features}{' + ReLU' if relu else ''}"
        for rows in args.rows:
            inputs = torch.randn(rows, in_features)
            tiles = kernels.int8_linear(inputs, *codes, amx_minimum_rows=0)
            if not torch.equal(tiles, kernels.int8_linear(inputs, *codes, amx_minimum_rows=VNNI_ALWAYS)):
                raise SystemExit(f"{name}, {rows} rows: AMX tiles and VNNI's kernels gave different numbers")
            calls = max(20, int(2e6 / (rows * in_features * out_features / 64 + 2000)))
            timings = {0: [], VNNI_ALWAYS: []}
            for _ in range(args.repeats):
                for minimum in timings:
                    timings[minimum].append(microseconds_per_call(kernels, inputs, codes, minimum, calls))
            amx, vnni = statistics.median(timings[0]), statistics.median(timings[VNNI_ALWAYS])
            print(f"| {name} | {rows} | {amx:.2f} | {vnni:.2f} | {amx / vnni:.2f} |", flush=True)
    print(f"\n(load average at end {backbone.loadavg()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
