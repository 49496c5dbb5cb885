"""How many multiply-adds per cycle can int8 and float32 products do on this CPU's AVX2? The instruction throughputs
behind `Int8Linear`'s format on AVX2 (kernels/int8_linear.cpp), measured rather than taken from tables.

Times, on one core, long runs of independent 256-bit instructions (10 accumulators, so that latency never binds)
written in inline assembly, and a register-only add chain as the clock (one dependent `add` per cycle):

- `vfmadd231ps`: 8 float32 multiply-adds (what `Float32Linear` runs on AVX2);
- `vpmaddwd`: 16 int16 products summed in pairs (an exact 8-bit product with the codes widened to 16 bits);
- `vpmaddubsw`: 32 unsigned x signed byte products summed in pairs to 16 bits (saturating);
- `vpmaddubsw` and `vpmaddwd` interleaved (do they share an execution port?);
- the 7-bit product's inner step (`avx2_rows_times_panel`): per 8 inputs of a row, two `vpmaddubsw`, their 32-bit
  sum, and the two accumulations (`vpaddd`, `vpsrld` + `vpaddd`): 64 multiply-adds, three rows at a time.

Multiply-adds per cycle = multiply-adds per instruction / cycles per instruction. Run it with the cores otherwise idle
(its numbers are cycles of this core, so a busy sibling core changes them little; frequency scaling can, the clock
is measured next to each loop).

    python -m study.probe_int8_instructions
"""

from __future__ import annotations

import argparse
import platform
import shlex
import statistics
import sys

from torch.utils.cpp_extension import load_inline

from study import bench_backbone as backbone

SOURCE = r"""
#include <chrono>
#include <cstdint>
#include <immintrin.h>
#include <vector>

namespace {
double seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// seconds per iteration of 4 dependent single-cycle adds, / 4: seconds per cycle
double cycle_seconds(int64_t iterations) {
  int64_t x = 0;
  const double start = seconds();
  for (int64_t i = 0; i < iterations; ++i)
    asm volatile("add $1, %0\n\tadd $1, %0\n\tadd $1, %0\n\tadd $1, %0" : "+r"(x));
  return (seconds() - start) / (4.0 * iterations);
}

#define TEN(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9)

__attribute__((target("avx2,fma"))) double fma_seconds(int64_t iterations) {
  __m256 a0 = _mm256_set1_ps(1.f), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0, a9 = a0;
  const __m256 b = _mm256_set1_ps(1.0000001f), c = _mm256_set1_ps(0.f);
  const double start = seconds();
  for (int64_t i = 0; i < iterations; ++i)
#define FMA(n) "vfmadd231ps %10, %11, %" #n "\n\t"
    asm volatile(TEN(FMA) : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7), "+x"(a8),
                 "+x"(a9) : "x"(b), "x"(c));
  const double elapsed = seconds() - start;
  volatile float sink = _mm256_cvtss_f32(_mm256_add_ps(a0, a9));
  (void)sink;
  return elapsed / (10.0 * iterations);
}

// `mnemonic` applied to 10 independent registers, each its own accumulator
#define INTEGER_LOOP(function, mnemonic)                                                                           \
  __attribute__((target("avx2"))) double function(int64_t iterations) {                                            \
    __m256i a0 = _mm256_set1_epi16(1), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0, a8 = a0,    \
            a9 = a0;                                                                                              \
    const __m256i b = _mm256_set1_epi16(3);                                                                       \
    const double start = seconds();                                                                               \
    for (int64_t i = 0; i < iterations; ++i)                                                                      \
      asm volatile(TEN(mnemonic) : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6), "+x"(a7), \
                   "+x"(a8), "+x"(a9) : "x"(b));                                                                   \
    const double elapsed = seconds() - start;                                                                     \
    volatile int sink = _mm256_extract_epi32(_mm256_add_epi32(a0, a9), 0);                                        \
    (void)sink;                                                                                                   \
    return elapsed / (10.0 * iterations);                                                                         \
  }
#define MADDWD(n) "vpmaddwd %10, %" #n ", %" #n "\n\t"
#define MADDUBSW(n) "vpmaddubsw %10, %" #n ", %" #n "\n\t"
#define MIXED(n) MIXED_##n
#define MIXED_0 MADDUBSW(0)
#define MIXED_1 MADDWD(1)
#define MIXED_2 MADDUBSW(2)
#define MIXED_3 MADDWD(3)
#define MIXED_4 MADDUBSW(4)
#define MIXED_5 MADDWD(5)
#define MIXED_6 MADDUBSW(6)
#define MIXED_7 MADDWD(7)
#define MIXED_8 MADDUBSW(8)
#define MIXED_9 MADDWD(9)
INTEGER_LOOP(maddwd_seconds, MADDWD)
INTEGER_LOOP(maddubsw_seconds, MADDUBSW)
INTEGER_LOOP(mixed_seconds, MIXED)

// three rows of the 7-bit product's step: per row two vpmaddubsw, their sum, and the two accumulations
__attribute__((target("avx2"))) double seven_bit_step_seconds(int64_t iterations) {
  __m256i l0 = _mm256_setzero_si256(), l1 = l0, l2 = l0, h0 = l0, h1 = l0, h2 = l0;
  const __m256i w = _mm256_set1_epi8(3), x = _mm256_set1_epi8(5);
  const double start = seconds();
  for (int64_t i = 0; i < iterations; ++i)
#define ROW(lanes, highs, t, u)                                                                         \
  "vpmaddubsw %6, %7, %%" t "\n\tvpmaddubsw %7, %6, %%" u "\n\tvpaddd %%" t ", %%" u ", %%" t "\n\t"     \
  "vpaddd %%" t ", %" lanes ", %" lanes "\n\tvpsrld $16, %%" t ", %%" t "\n\tvpaddd %%" t ", %" highs  \
  ", %" highs "\n\t"
    asm volatile(ROW("0", "3", "ymm10", "ymm11") ROW("1", "4", "ymm12", "ymm13") ROW("2", "5", "ymm14", "ymm15")
                 : "+x"(l0), "+x"(l1), "+x"(l2), "+x"(h0), "+x"(h1), "+x"(h2)
                 : "x"(w), "x"(x)
                 : "ymm10", "ymm11", "ymm12", "ymm13", "ymm14", "ymm15");
  const double elapsed = seconds() - start;
  volatile int sink = _mm256_extract_epi32(_mm256_add_epi32(_mm256_add_epi32(l0, l2), _mm256_add_epi32(h0, h2)), 0);
  (void)sink;
  return elapsed / (3.0 * iterations);
}
}  // namespace

// [cycles per instruction (per row step for the last)] of fma, vpmaddwd, vpmaddubsw, the two interleaved, the 7-bit
// step; each loop timed right after its own clock measurement
std::vector<double> instruction_cycles(int64_t iterations) {
  std::vector<double> cycles;
  for (auto loop : {fma_seconds, maddwd_seconds, maddubsw_seconds, mixed_seconds, seven_bit_step_seconds}) {
    const double cycle = cycle_seconds(iterations);
    cycles.push_back(loop(iterations) / cycle);
  }
  return cycles;
}
"""

# name, multiply-adds per unit timed
ROWS = [
    ("vfmadd231ps (float32, 8 lanes)", 8),
    ("vpmaddwd (int16 pairs, 16 products)", 16),
    ("vpmaddubsw (byte pairs, 32 products, saturating)", 32),
    ("vpmaddubsw / vpmaddwd interleaved (per instruction)", None),
    ("7-bit product step (2 x vpmaddubsw + 4 adds/shifts per row)", 64),
]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=50_000_000, help="iterations of each loop")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if args.iterations < 1 or args.repeats < 1:
        parser.error(f"--iterations and --repeats must be positive, got {args.iterations} and {args.repeats}")
    if platform.machine() not in ("x86_64", "AMD64"):
        sys.exit(f"This probe times x86 AVX2 instructions; this machine is {platform.machine()}.")
    module = load_inline(
        name="hf_layerfusion_probe_int8_instructions", cpp_sources=[SOURCE], functions=["instruction_cycles"],
        extra_cflags=["-O2"],
    )
    runs = [module.instruction_cycles(args.iterations) for _ in range(args.repeats)]
    print("## Multiply-adds per cycle of AVX2 instructions on this core\n")
    print(f"- command (from the repository root): `python {shlex.join(sys.argv)}`")
    print(f"- CPU: {backbone.cpu_model()}; {args.iterations} iterations per loop, {args.repeats} repeats, "
          "median cycles per instruction over repeats (the clock: a chain of dependent adds, timed before each loop)\n")
    print("| instruction | cycles per instruction (median [min-max] over repeats) | multiply-adds per cycle |")
    print("|---|---|---|")
    for index, (name, products) in enumerate(ROWS):
        samples = [run[index] for run in runs]
        cycles = statistics.median(samples)
        per_cycle = "–" if products is None else f"{products / cycles:.1f}"
        print(f"| {name} | {cycles:.2f} [{min(samples):.2f}-{max(samples):.2f}] | {per_cycle} |")


if __name__ == "__main__":
    main()
