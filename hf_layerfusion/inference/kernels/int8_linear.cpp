// The int8 linear layer of `hf_layerfusion.inference.inference_copies.Int8Linear` in one call: each row of the input is
// quantized with its own scale and zero point (asymmetric: the row's range [min(x, 0), max(x, 0)] onto the codes of
// the format), multiplied with the int8 weights in exact int32 arithmetic, and dequantized with the bias in float.
// Two formats (`code_bits`): 8 bits (activation codes [-128, 127], weights [-127, 127]) and 7 bits (activation codes
// [0, 127], weights [-63, 63]). The product runs on the CPU's AMX tiles where it has them (either format; below
// `amx_minimum_rows` rows, where a tile of 16 rows would compute mostly padding, with VNNI on the same weights),
// else with AVX-512 VNNI's `vpdpbusd` (unsigned x signed bytes, four products summed into each int32 lane, exactly) in
// the 8-bit format only (the weights stored as unsigned ones, weight + 128, whose 128 x each row's code sum is taken
// back: `vnni_rows_times_panels`; the AMX tiles read the same layout with `tdpbsud`, signed x unsigned) or, on the
// same CPUs, with oneDNN's s8 x s8 product through `at::_int_mm` (from `kOneDnnMinimumRows` rows; VNNI's kernels on
// their panels below), whichever of the two this process measured faster on one thread (`onednn_vnni_timings`: on an
// AMD Zen 5 oneDNN's, on an AMD Zen 4 VNNI's; study/fast_cpu_translation_log.md), else, on
// AVX2, with the 8-bit multiply-add `vpmaddubsw` (unsigned x signed bytes, pairs summed in 16 bits) in the 7-bit
// format only: with codes <= 127 and the weights offset to [1, 127] every pair sums to at most 2 x 127 x 127 < 2^15,
// so nothing saturates, and two pairs' sums still fit 16 unsigned bits, which lets two multiply-adds share one
// widening (`avx2_row_times_panels`). Where the CPU issues one `vpmaddwd` (16-bit multiply-adds, what an exact 8-bit
// product needs there) per cycle, no more multiply-adds than float32's two FMAs (an AMD Zen 2: measured by
// benchmarks/probe_int8_instructions.py, study/fast_cpu_translation_log.md), this doubles them. Else the product is float32
// products of blocks short enough to be exact. The weights are packed once for AMX, VNNI or AVX2
// (`pack_int8_weights`).
// Every product sums exactly, so all give the same numbers. The arithmetic is that of `int8_linear_reference`
// (inference_copies.py), bit for bit: no fused multiply-add (-ffp-contract=off), the same rounding (half to even),
// the same order of float operations.
#include "cpu_kernels.h"

#include <ATen/TensorOperators.h>
#include <ATen/ThreadLocalState.h>
#include <ATen/ops/_int_mm.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <ATen/ops/full.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/zeros.h>
#include <c10/core/InferenceMode.h>

#include "parallel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <chrono>
#include <limits>
#include <map>
#include <vector>

#include "vector16.h"

#if defined(__x86_64__) && defined(__GNUC__) && defined(__linux__)
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define HLF_AMX 1
#else
#define HLF_AMX 0
#endif

namespace {

constexpr int64_t kTileRows = 16;   // AMX tile: 16 rows of 64 bytes
constexpr int64_t kTileDepth = 64;  // int8 products summed per tile row
constexpr int64_t kTileColumns = 16;
constexpr int64_t kBlockColumns = 4 * kTileColumns;  // 4 accumulator tiles per pass over the input tile
constexpr int64_t kTileBytes = kTileRows * 64;
// A thread's share of an AMX product pays only above about this many multiply-adds (padded rows x depth x columns):
// on the Intel Xeon with AMX at 2 threads, one block of 64 columns per task made products of 8-16 rows slower than
// one thread (256 -> 1024 at 8 rows: 19.7 against 12.0 us); 2^22 was the fastest of 1, 2^22, 2^23, 2^24 and one
// thread, or within 12% of it, at every product of a decoder step and 8-128 rows (study/fast_cpu_translation_log.md)
constexpr int64_t kAmxTaskMultiplyAdds = int64_t{1} << 22;

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

constexpr float kMinimumSpan = 1e-30f;  // an all-zero row: finite scales, every code at the zero point
// int8 x int8 products summed over at most this many inputs stay below 2^24, where float32 is exact
// (inference_copies.py's EXACT_FLOAT32_DEPTH)
constexpr int64_t kExactFloatDepth = 1024;
// the sums of products (|each| <= 128 x 127, or 127 x 127 with the AVX2 product's offset weights) stay within int32
constexpr int64_t kMaximumDepth = int64_t{1} << 17;
constexpr int64_t kAvx2Columns = 8;   // AVX2 layout: output features per panel, one register of 8 int32 sums
constexpr int64_t kAvx2Depth = 8;     // inputs per step of the AVX2 product (two groups of 4)
constexpr int32_t kAvx2WeightOffset = 64;  // 7-bit weights [-63, 63] are packed as [1, 127] for `vpmaddubsw`
constexpr int64_t kVnniColumns = 16;  // VNNI layout: output features per panel, one register of 16 int32 sums
constexpr int64_t kVnniDepth = 4;     // inputs per `vpdpbusd` lane
constexpr int kVnniPanels = 4;        // panels per pass over the rows
constexpr int kVnniRows = 4;          // rows per pass over the panels (4 x 4 accumulators, 4 weight registers)

#if HLF_AMX
bool avx2_usable() { return instruction_set_allowed(kAvx2Instructions) && __builtin_cpu_supports("avx2"); }
bool vnni_usable() {
  return instruction_set_allowed(kAvx512Instructions) && __builtin_cpu_supports("avx512vnni") &&
         __builtin_cpu_supports("avx512bw");
}

// low = min(0, the row's values), high = max(0, ...), with std::min / std::max's rule (a value replaces the running one
// only if strictly smaller / larger: NaN never does), 8 lanes at a time
__attribute__((target("avx2"))) void avx2_row_range(const float* __restrict row, int64_t K, float& low, float& high) {
  __m256 lows = _mm256_setzero_ps(), highs = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    const __m256 values = _mm256_loadu_ps(row + k);
    lows = _mm256_min_ps(values, lows);  // values < lows ? values : lows
    highs = _mm256_max_ps(values, highs);
  }
  alignas(32) float low_lanes[8], high_lanes[8];
  _mm256_store_ps(low_lanes, lows);
  _mm256_store_ps(high_lanes, highs);
  low = high = 0.f;
  for (int j = 0; j < 8; ++j) {
    low = std::min(low, low_lanes[j]);
    high = std::max(high, high_lanes[j]);
  }
  for (; k < K; ++k) {
    low = std::min(low, row[k]);
    high = std::max(high, row[k]);
  }
}
#else
bool avx2_usable() { return false; }
bool vnni_usable() { return false; }
#endif

// The activation codes of a format: [code_low, code_low + levels]
struct ActivationCodes {
  float code_low, levels;
};
ActivationCodes activation_codes(int64_t code_bits) {
  return code_bits == 8 ? ActivationCodes{-128.f, 255.f} : ActivationCodes{0.f, 127.f};
}

// rows [begin, end) of x (M, K) -> q (stride q_stride, zero past K) = clamp(round(x * levels / span) + zero, code_low,
// code_low + levels) with span = max(x_row, 0) - min(x_row, 0) and zero = round(-min(x_row, 0) * levels / span) +
// code_low (rounding half to even), so that x ~ (q - zero) * span / levels; row_scale = span / levels, row_zero = zero;
// code_sums (if not null) = the sum of the row's codes
// (a kernel of `run_with_widest_vectors`, vector16.h: compiled for each instruction set, its row loops the
// compiler's vectorisation of the same scalar code, so the same numbers on each)
struct QuantizeRows {
  template <class V>
  static HLF_INLINE void run(const float* __restrict x, int8_t* __restrict q, float* __restrict row_scale,
                             int32_t* __restrict row_zero, int32_t* __restrict code_sums, int64_t begin, int64_t end,
                             int64_t K, int64_t q_stride, ActivationCodes codes) {
    const bool avx2 = avx2_usable();
    for (int64_t m = begin; m < end; ++m) {
      const float* __restrict row = x + m * K;
      float low = 0.f, high = 0.f;
      int64_t k = 0;
  #if HLF_AMX
      if (avx2) avx2_row_range(row, K, low, high);
  #endif
      if (!avx2) {
        float low_lanes[16] = {0.f}, high_lanes[16] = {0.f};  // running minima / maxima
        for (; k + 16 <= K; k += 16)
          for (int j = 0; j < 16; ++j) {
            low_lanes[j] = std::min(low_lanes[j], row[k + j]);
            high_lanes[j] = std::max(high_lanes[j], row[k + j]);
          }
        for (; k < K; ++k) {
          low = std::min(low, row[k]);
          high = std::max(high, row[k]);
        }
        for (int j = 0; j < 16; ++j) {
          low = std::min(low, low_lanes[j]);
          high = std::max(high, high_lanes[j]);
        }
      }
      const float span = std::max(high - low, kMinimumSpan);
      const float inverse = codes.levels / span;
      const float zero = std::nearbyint(-low * inverse) + codes.code_low;
      const float code_high = codes.code_low + codes.levels;
      int8_t* __restrict qrow = q + m * q_stride;
      for (k = 0; k < K; ++k)
        qrow[k] = static_cast<int8_t>(static_cast<int32_t>(
            std::min(std::max(std::nearbyint(row[k] * inverse) + zero, codes.code_low), code_high)));
      for (; k < q_stride; ++k) qrow[k] = 0;  // AMX / AVX2 depth padding (the padded weights are zero too)
      if (code_sums != nullptr) {
        int32_t sum = 0;
        for (k = 0; k < K; ++k) sum += qrow[k];
        code_sums[m] = sum;
      }
      row_scale[m] = span / codes.levels;
      row_zero[m] = static_cast<int32_t>(zero);
    }
  }
};

// rows [begin, end): out (M, N) = float(sums - zero * column_sums) * (row_scale * weight_scale) + bias, then
// max(out, 0) with `relu`, with sums at stride sums_stride; `out` may be `sums` itself (same stride): each element is
// read before it is overwritten. With `code_sums` (the AMX product's sums, of weights + 128) 128 x the row's code sum
// is taken from its sums first, in wrapping arithmetic (those sums may pass 2^31, the exact ones do not).
struct DequantizeRows {  // as QuantizeRows
  template <class V>
  static HLF_INLINE void run(const int32_t* sums, int64_t sums_stride, float* out, const float* __restrict row_scale,
                             const int32_t* __restrict row_zero, const int32_t* __restrict code_sums,
                             const int32_t* __restrict column_sums, const float* __restrict weight_scale,
                             const float* __restrict bias, bool relu, int64_t begin, int64_t end, int64_t N) {
    for (int64_t m = begin; m < end; ++m) {
      const float r = row_scale[m];
      const int32_t z = row_zero[m];
      const uint32_t offset = code_sums != nullptr ? static_cast<uint32_t>(code_sums[m]) << 7 : 0u;
      const int32_t* srow = sums + m * sums_stride;
      float* orow = out + m * N;
      if (bias != nullptr)
        for (int64_t n = 0; n < N; ++n)
          orow[n] = static_cast<float>(static_cast<int32_t>(static_cast<uint32_t>(srow[n]) - offset) -
                                       z * column_sums[n]) * (r * weight_scale[n]) + bias[n];
      else
        for (int64_t n = 0; n < N; ++n)
          orow[n] = static_cast<float>(static_cast<int32_t>(static_cast<uint32_t>(srow[n]) - offset) -
                                       z * column_sums[n]) * (r * weight_scale[n]);
      if (relu)  // max(x, 0) as torch's clamp_min: NaN and -0 pass through
        for (int64_t n = 0; n < N; ++n) orow[n] = orow[n] < 0.f ? 0.f : orow[n];
    }
  }
};

#if HLF_AMX
// The CPU has AMX int8 tiles, Linux lets this process use them (a one-time permission request) and the instruction set
// cap allows them.
bool amx_usable() {
  static const bool permitted = [] {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    if (!((edx >> 24) & 1) || !((edx >> 25) & 1)) return false;  // AMX-TILE, AMX-INT8
    constexpr int kRequestPermission = 0x1023, kTileData = 18;  // ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA
    return syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return permitted && instruction_set_allowed(kAmxInstructions);
}

struct alignas(64) TileConfig {
  uint8_t palette_id = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {0};
  uint16_t bytes_per_row[16] = {0};
  uint8_t rows[16] = {0};
};

// sums (Mp, Np) int32 = q (Mp, Kp) x the packed weights (VNNI panels: weight + 128, `pack_int8_weights`; each 64-deep
// block of a panel is one tile), for column blocks [block_begin, block_end) of 64 columns: `tdpbsud` multiplies the
// signed codes by the unsigned weights, so each row's sums exceed the exact ones by 128 x its code sum (taken back by
// `dequantize_rows`). Tiles 0-3 accumulate 64 columns of 16 rows, tile 4 holds the input rows, tile 5 one weight tile
// at a time.
__attribute__((target("amx-tile,amx-int8"))) void amx_column_blocks(const int8_t* q, const int8_t* panels,
                                                                     int32_t* sums, int64_t Mp, int64_t Kp,
                                                                     int64_t Np, int64_t block_begin,
                                                                     int64_t block_end) {
  TileConfig config;
  for (int t = 0; t < 6; ++t) {
    config.rows[t] = kTileRows;
    config.bytes_per_row[t] = 64;
  }
  _tile_loadconfig(&config);  // per thread
  const int64_t depth_blocks = Kp / kTileDepth;
  for (int64_t block = block_begin; block < block_end; ++block) {
    const int8_t* weights = panels + block * 4 * depth_blocks * kTileBytes;
    for (int64_t m = 0; m < Mp; m += kTileRows) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t d = 0; d < depth_blocks; ++d) {
        _tile_loadd(4, q + m * Kp + d * kTileDepth, Kp);
        _tile_loadd(5, weights + (0 * depth_blocks + d) * kTileBytes, 64);
        _tile_dpbsud(0, 4, 5);
        _tile_loadd(5, weights + (1 * depth_blocks + d) * kTileBytes, 64);
        _tile_dpbsud(1, 4, 5);
        _tile_loadd(5, weights + (2 * depth_blocks + d) * kTileBytes, 64);
        _tile_dpbsud(2, 4, 5);
        _tile_loadd(5, weights + (3 * depth_blocks + d) * kTileBytes, 64);
        _tile_dpbsud(3, 4, 5);
      }
      int32_t* out = sums + m * Np + block * kBlockColumns;
      _tile_stored(0, out + 0 * kTileColumns, Np * 4);
      _tile_stored(1, out + 1 * kTileColumns, Np * 4);
      _tile_stored(2, out + 2 * kTileColumns, Np * 4);
      _tile_stored(3, out + 3 * kTileColumns, Np * 4);
    }
  }
  _tile_release();
}
#else
bool amx_usable() { return false; }
#endif

#if HLF_AMX
// one row of the 7-bit codes q (Kp of them, Kp a multiple of 8, each in [0, 127]) times P consecutive AVX2 panels of
// 8 columns (each Kp / 4 groups of 32 bytes: per group of 4 inputs, 8 columns x the 4 offset weights w + 64, each in
// [1, 127]) minus 64 x the row's code sum (`code_sum`: the offset's share) into 8 P int32 sums at `sums`. Per 8
// inputs, two `vpmaddubsw` per panel give 16-bit sums of pairs, each <= 2 x 127 x 127 < 2^15 (no saturation), added
// as 32-bit lanes: each lane holds (high pairs) x 2^16 + (low pairs), both below 2^16, so no carry crosses; A sums the
// lanes, H their high halves, and the exact sum is A - (2^16 - 1) H (mod 2^32, where it fits). One row and 4 panels
// (8 accumulators, the row's two broadcast code groups shared by the panels) ran 1.05-1.3x faster on an AMD Zen 2
// than 4 rows and one panel (the broadcasts shared by nothing; study/fast_cpu_translation_log.md).
template <int P>
__attribute__((target("avx2"))) void avx2_row_times_panels(const int8_t* __restrict q, int64_t Kp,
                                                           const int8_t* __restrict panels, int32_t code_sum,
                                                           int32_t* __restrict sums) {
  __m256i lanes[P], highs[P];
  for (int p = 0; p < P; ++p) lanes[p] = highs[p] = _mm256_setzero_si256();
  const int64_t panel_bytes = Kp * kAvx2Columns;
  for (int64_t j = 0; j < Kp / 8; ++j) {
    int32_t first, second;  // the row's 4 + 4 codes of these 8 inputs, broadcast to every column
    std::memcpy(&first, q + 8 * j, sizeof(first));
    std::memcpy(&second, q + 8 * j + 4, sizeof(second));
    const __m256i first_codes = _mm256_set1_epi32(first), second_codes = _mm256_set1_epi32(second);
    for (int p = 0; p < P; ++p) {
      const int8_t* weights = panels + p * panel_bytes + 64 * j;
      const __m256i pairs = _mm256_add_epi32(
          _mm256_maddubs_epi16(first_codes, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(weights))),
          _mm256_maddubs_epi16(second_codes, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(weights + 32))));
      lanes[p] = _mm256_add_epi32(lanes[p], pairs);
      highs[p] = _mm256_add_epi32(highs[p], _mm256_srli_epi32(pairs, 16));
    }
  }
  const __m256i offset_share = _mm256_set1_epi32(kAvx2WeightOffset * code_sum);
  for (int p = 0; p < P; ++p) {
    const __m256i exact = _mm256_sub_epi32(lanes[p], _mm256_sub_epi32(_mm256_slli_epi32(highs[p], 16), highs[p]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(sums + p * kAvx2Columns), _mm256_sub_epi32(exact, offset_share));
  }
}

// What `dequantize_rows` makes of the sums of rows [0, R) and columns [0, 16 P) (`columns_left` of them real), while
// they are in registers: the sums are not written to memory and read back (at 128 rows x 8000 columns, 4 MB each way).
// The same float operations in the same order, a vector at a time, so the same numbers.
struct VnniDequantize {
  const float* row_scale;       // R
  const int32_t* row_zero;      // R
  const int32_t* column_sums;   // 16 P
  const float* weight_scale;    // 16 P
  const float* bias;            // 16 P, or null
  bool relu;
  int64_t columns_left;
  float* out;                   // rows at out_stride
  int64_t out_stride;
};

// R rows of the 8-bit codes q (stride Kp, Kp a multiple of 4, each in [-128, 127]) times P consecutive VNNI panels of
// 16 columns (each Kp / 4 groups of 64 bytes: per group of 4 inputs, 16 columns x their 4 weights, sign bits flipped),
// dequantized into the output (`VnniDequantize`). `vpdpbusd` multiplies unsigned by signed bytes: the weights are its
// unsigned operand, stored as weight + 128 (`pack_int8_weights`), the codes its signed one, so a row's 4 codes are
// broadcast straight from memory (a load, where flipping their sign bits took a shuffle-port broadcast from a general
// register per row and group, beside the multiply-adds on that port); the sums exceed the products by 128 x the row's
// code sum (`code_sums`, R of them), taken back at the end (wrapping int32 arithmetic: the intermediate sums may pass
// 2^31, the exact results do not). Each weight register serves R rows, each broadcast code group P panels.
template <int R, int P>
__attribute__((target("avx512f,avx512bw,avx512vnni"))) void vnni_rows_times_panels(
    const int8_t* __restrict q, int64_t Kp, const int8_t* __restrict panels, const int32_t* __restrict code_sums,
    const VnniDequantize& d) {
  __m512i lanes[R][P];
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) lanes[r][p] = _mm512_setzero_si512();
  const int64_t panel_bytes = Kp * kVnniColumns;
  for (int64_t g = 0; g < Kp / kVnniDepth; ++g) {
    __m512i weights[P];
    for (int p = 0; p < P; ++p)
      weights[p] = _mm512_loadu_si512(reinterpret_cast<const void*>(panels + p * panel_bytes + 64 * g));
    for (int r = 0; r < R; ++r) {
      int32_t group;  // the row's 4 codes of these inputs, broadcast to every column
      std::memcpy(&group, q + r * Kp + kVnniDepth * g, sizeof(group));
      const __m512i codes = _mm512_set1_epi32(group);
      for (int p = 0; p < P; ++p) lanes[r][p] = _mm512_dpbusd_epi32(lanes[r][p], weights[p], codes);
    }
  }
  // dequantize_rows: float(sums - zero x column sums) x (row scale x weight scale) (+ bias), max(., 0) with relu
  for (int p = 0; p < P; ++p) {
    const int64_t columns = std::min<int64_t>(kVnniColumns, d.columns_left - p * kVnniColumns);
    if (columns <= 0) break;  // panels past N (the last pass's padding)
    const __mmask16 present = columns >= 16 ? __mmask16(0xffff) : __mmask16((1u << columns) - 1);
    const __m512i column_sums = _mm512_maskz_loadu_epi32(present, d.column_sums + p * kVnniColumns);
    const __m512 weight_scale = _mm512_maskz_loadu_ps(present, d.weight_scale + p * kVnniColumns);
    const __m512 bias = d.bias ? _mm512_maskz_loadu_ps(present, d.bias + p * kVnniColumns) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      const __m512i exact = _mm512_sub_epi32(
          lanes[r][p], _mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(code_sums[r]) << 7)));
      const __m512i centred = _mm512_sub_epi32(exact, _mm512_mullo_epi32(_mm512_set1_epi32(d.row_zero[r]), column_sums));
      __m512 value = _mm512_mul_ps(_mm512_cvtepi32_ps(centred), _mm512_mul_ps(_mm512_set1_ps(d.row_scale[r]), weight_scale));
      if (d.bias) value = _mm512_add_ps(value, bias);
      if (d.relu)  // x < 0 ? 0 : x, as dequantize_rows: NaN and -0 pass through
        value = _mm512_mask_mov_ps(value, _mm512_cmp_ps_mask(value, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_setzero_ps());
      _mm512_mask_storeu_ps(d.out + r * d.out_stride + p * kVnniColumns, present, value);
    }
  }
}

// vnni_rows_times_panels<R, P> for R, P in [1, 4], by [R - 1][P - 1]
using VnniKernel = decltype(&vnni_rows_times_panels<1, 1>);
template <int R>
struct VnniRow {
  static constexpr VnniKernel panels[] = {&vnni_rows_times_panels<R, 1>, &vnni_rows_times_panels<R, 2>,
                                          &vnni_rows_times_panels<R, 3>, &vnni_rows_times_panels<R, 4>};
};
constexpr const VnniKernel* kVnniTable[] = {VnniRow<1>::panels, VnniRow<2>::panels, VnniRow<3>::panels,
                                            VnniRow<4>::panels};

constexpr int kAvx2Panels = 4;  // panels per pass over a row
template <int... P>
struct Avx2RowTimesPanels {
  static constexpr decltype(&avx2_row_times_panels<1>) table[] = {&avx2_row_times_panels<P>...};
};
using Avx2PanelTable = Avx2RowTimesPanels<1, 2, 3, 4>;
#endif

void check_code_bits(int64_t code_bits, const char* function) {
  TORCH_CHECK(code_bits == 7 || code_bits == 8, function, ": code_bits must be 7 or 8, got ", code_bits);
}

// The products that run `code_bits` weights on this CPU under the instruction set cap, in the order `int8_products`
// gives them before it measures oneDNN's against VNNI's: "amx", "onednn", "vnni", "avx2", "float32_blocks"
std::vector<std::string> capable_products(int64_t code_bits) {
  std::vector<std::string> products;
  if (amx_usable()) products.push_back("amx");
  if (vnni_usable() && code_bits == 8) {
    products.push_back("onednn");
    products.push_back("vnni");
  }
  if (avx2_usable() && code_bits == 7) products.push_back("avx2");
  products.push_back("float32_blocks");
  return products;
}

// `capable_products(code_bits)`, listed once per thread and instruction set cap: `int8_linear` checks the product it
// is given against them at every call, where building the list again would cost an allocation per call
const std::vector<std::string>& runnable_products(int64_t code_bits) {
  struct Lists {
    int64_t cap = -1;
    std::vector<std::string> seven_bit, eight_bit;
  };
  thread_local Lists lists;
  if (lists.cap != max_instruction_set()) lists = {max_instruction_set(), capable_products(7), capable_products(8)};
  return code_bits == 7 ? lists.seven_bit : lists.eight_bit;
}

// The product a call names (`product`), or this CPU's fastest for `code_bits` weights (an empty name,
// `int8_products(code_bits).front()`), refused by name where this CPU cannot run it with that format
const std::string& chosen_product(int64_t code_bits, const std::string& product, const char* function) {
  const std::vector<std::string>& products = runnable_products(code_bits);
  if (product.empty()) {
    const std::string fastest = int8_products(code_bits).front();
    return *std::find(products.begin(), products.end(), fastest);
  }
  if (std::find(products.begin(), products.end(), product) == products.end()) {
    std::string runnable;
    for (const auto& name : products) runnable += (runnable.empty() ? "" : ", ") + name;
    const std::string cap = max_instruction_set() < kAmxInstructions
                                ? " within the instruction set cap (level " + std::to_string(max_instruction_set()) +
                                      ", HF_LAYERFUSION_MAX_CPU_ISA; weights packed before it was lowered are "
                                      "packed again by making the inference copy again)"
                                : "";
    TORCH_CHECK(false, function, ": product '", product, "' does not run ", code_bits,
                "-bit weights on this CPU", cap, "; it runs: ", runnable);
  }
  return product;
}

// An int8_linear call's quantized input: the codes (rows x depth, padded as the product reads them), each row's scale,
// zero point and code sum. They never leave the call, so they live in a buffer of the calling thread, grown as needed
// and reused: allocated as four tensors per call they cost more than a one-row product's own arithmetic at d_model 256
// (the compiled decoder layers make 36 of these calls per step). Worker threads of the call's `parallel_for` write
// through the pointers; the buffer is the caller's.
struct QuantizedInput {
  int8_t* codes;
  float* scale;
  int32_t* zero;
  int32_t* code_sums;
};

QuantizedInput quantized_input_buffer(int64_t padded_rows, int64_t depth, int64_t rows) {
  constexpr int64_t kAlignment = 64;
  const int64_t codes_bytes = round_up(padded_rows * depth, kAlignment), row_bytes = round_up(rows * 4, kAlignment);
  const int64_t bytes = codes_bytes + 3 * row_bytes + kAlignment;
  thread_local std::vector<char> buffer;
  if (static_cast<int64_t>(buffer.size()) < bytes) buffer.resize(static_cast<size_t>(bytes));
  auto base = reinterpret_cast<uintptr_t>(buffer.data());
  char* start = buffer.data() + (kAlignment - base % kAlignment) % kAlignment;
  return {reinterpret_cast<int8_t*>(start), reinterpret_cast<float*>(start + codes_bytes),
          reinterpret_cast<int32_t*>(start + codes_bytes + row_bytes),
          reinterpret_cast<int32_t*>(start + codes_bytes + 2 * row_bytes)};
}

}  // namespace

bool amx_available() { return amx_usable(); }

namespace {

// Which of oneDNN's product and VNNI's kernels is faster depends on the CPU, not on its instructions: on an AMD Zen 5
// oneDNN's was 1.6-3.2x VNNI's from 32 rows, on an AMD Zen 4 VNNI's was 1.04-1.38x oneDNN's at 24-128 rows and level
// with it at 256-450, at one thread, and further ahead at two, where oneDNN's product is split by rows
// (study/fast_cpu_translation_log.md). So the first time a process needs the choice it times both, on
// the calling thread alone: rows x 512 -> 2048 (a decoder's first feed-forward product at d_model 512) at 32 rows
// (greedy search's batches) and 128 (beam-4's), calls alternated between the two, the best of kTrials trials of each,
// in microseconds per row summed over the two sizes (so each size counts alike; about 0.06 s). Either product gives
// the same numbers, so a wrong choice on a busy machine costs speed only.
std::map<std::string, double> measure_onednn_and_vnni() {
  constexpr int64_t kDepth = 512, kColumns = 2048;
  constexpr int kTrials = 5, kCallsPerTrial = 4;
  const c10::InferenceMode inference_mode;
  const hlf::OneKernelThread one_thread;
  // weights and inputs of every sign, made without torch's random generator (whose state is the user's)
  const auto weight_t = (at::arange(kDepth * kColumns, at::kInt).remainder(255) - 127).to(at::kChar)
                            .view({kDepth, kColumns});
  const auto column_sums = weight_t.sum({0}, false, at::kInt);
  const auto weight_scale = at::full({kColumns}, 0.01f);
  const auto panels = pack_int8_weights(weight_t, 8, "vnni");  // oneDNN's layout keeps the same panels
  std::map<std::string, double> microseconds{{"onednn", 0.0}, {"vnni", 0.0}};
  for (const int64_t rows : {32, 128}) {
    const auto x = at::arange(rows * kDepth, at::kFloat).sin().view({rows, kDepth});
    std::map<std::string, double> best{{"onednn", 1e300}, {"vnni", 1e300}};
    for (int trial = -1; trial < kTrials; ++trial) {  // trial -1: warm-up, not timed
      for (const auto& [product, fastest] : best) {
        const auto start = std::chrono::steady_clock::now();
        for (int call = 0; call < kCallsPerTrial; ++call)
          int8_linear(x, weight_t, panels, column_sums, weight_scale, c10::nullopt, false, 8, kAmxMinimumRows,
                      product, product == "onednn" ? 0 : kOneDnnMinimumRows);
        const std::chrono::duration<double, std::micro> elapsed = std::chrono::steady_clock::now() - start;
        if (trial >= 0) best[product] = std::min(fastest, elapsed.count() / kCallsPerTrial);
      }
    }
    for (const auto& [product, time] : best) microseconds[product] += time / static_cast<double>(rows);
  }
  return microseconds;
}

}  // namespace

// `measure_onednn_and_vnni`'s microseconds per row, measured once per process; empty where the CPU (under the
// instruction set cap) has no VNNI
std::map<std::string, double> onednn_vnni_timings() {
  if (!vnni_usable()) return {};
  static const std::map<std::string, double> timings = measure_onednn_and_vnni();
  return timings;
}

// The products that run `code_bits` weights on this CPU, its fastest first (the one `int8_linear` runs unless told):
// "amx" (either format: the VNNI panels padded to whole tiles, read by the AMX product and, below `amx_minimum_rows`
// rows, by VNNI's), "onednn" (the 8-bit format on a CPU with VNNI: oneDNN's product of weight_t, and below
// `onednn_minimum_rows` rows VNNI's kernels on their panels), "vnni" (the 8-bit format), "avx2" (the 7-bit format),
// "float32_blocks" (any CPU: weight_t itself, nothing packed). Every one gives the same numbers; naming one lets the
// tests run each product the CPU has.
std::vector<std::string> int8_products(int64_t code_bits) {
  check_code_bits(code_bits, "int8_products");
  std::vector<std::string> products = capable_products(code_bits);
  // "onednn" before "vnni" as capable_products lists them; their order where VNNI's is first in line (no AMX)
  const auto onednn = std::find(products.begin(), products.end(), "onednn");
  if (onednn == products.begin()) {
    const auto timings = onednn_vnni_timings();
    if (timings.at("vnni") < timings.at("onednn")) std::iter_swap(onednn, onednn + 1);
  }
  return products;
}

std::string int8_product(int64_t code_bits) {
  check_code_bits(code_bits, "int8_product");
  const std::string product = int8_products(code_bits).front();
  if (product == "amx")
    return vnni_usable() ? "AMX (AVX-512 VNNI below " + std::to_string(kAmxMinimumRows) + " rows)" : "AMX";
  if (product == "onednn")
    return "oneDNN s8s8 through at::_int_mm (AVX-512 VNNI below " + std::to_string(kOneDnnMinimumRows) +
           " rows; measured faster than AVX-512 VNNI here)";
  // VNNI's kernels come first only where they were timed against oneDNN's product (`int8_products`)
  if (product == "vnni") return "AVX-512 VNNI (measured faster than oneDNN s8s8 here)";
  return product == "avx2" ? "AVX2" : "float32 blocks";
}

int64_t int8_code_bits() { return amx_usable() || vnni_usable() || !avx2_usable() ? 8 : 7; }

// weight_t (K, N) int8, codes of the `code_bits` format -> the weights in the layout of `product` (one of
// `int8_products(code_bits)`; empty: this CPU's fastest, `int8_product(code_bits)`), empty for the float32 blocks:
// - AVX2 panels (7-bit weights only): for each panel of 8 columns p and each group of 4 inputs g, 32 bytes with byte
//   [4 * c + i] = weight_t[4 * g + i][8 * p + c] + 64, zero past K and N (`avx2_row_times_panels`);
// - VNNI panels (8-bit weights only): for each panel of 16 columns p and each group of 4 inputs g, 64 bytes with byte
//   [4 * c + i] = weight_t[4 * g + i][16 * p + c] + 128 (its sign bit flipped: `vpdpbusd`'s unsigned operand), zero
//   past K and N (`vnni_rows_times_panels`);
// - AMX (either format): the VNNI panels, their depth padded to whole 64-deep blocks and their columns to whole blocks
//   of 64: the 16 groups of a panel's 64-deep block d are the 16 rows x 64 bytes of one tile, byte [r][4 * j + i] =
//   weight_t[64 * d + 4 * r + i][16 * p + j] + 128, which `amx_column_blocks`' `tdpbsud` reads as unsigned, and
//   which VNNI's product reads as it reads its own panels (with Kp the padded depth).
at::Tensor pack_int8_weights(const at::Tensor& weight_t, int64_t code_bits, const std::string& product) {
  TORCH_CHECK(weight_t.dim() == 2 && weight_t.scalar_type() == at::kChar,
              "pack_int8_weights: weight_t must be 2-D int8");
  check_code_bits(code_bits, "pack_int8_weights");
  const std::string& layout = chosen_product(code_bits, product, "pack_int8_weights");
  if (layout == "float32_blocks") return at::empty({0}, weight_t.options());
  const int64_t K = weight_t.size(0), N = weight_t.size(1);
  const auto weights = weight_t.contiguous();
  const int8_t* src = weights.data_ptr<int8_t>();
  if (layout == "avx2") {
    // in int64: the int8 abs() of -128 would be -128 itself
    const int64_t largest =
        K * N > 0 ? std::max(-weights.min().item<int64_t>(), weights.max().item<int64_t>()) : 0;
    TORCH_CHECK(largest <= 63, "pack_int8_weights: 7-bit weights lie in [-63, 63], got one of magnitude ", largest);
    const int64_t Kp = round_up(K, kAvx2Depth), Np = round_up(N, kAvx2Columns);
    auto panels = at::zeros({Np * Kp}, weight_t.options());
    int8_t* dst = panels.data_ptr<int8_t>();
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n)
        dst[n / kAvx2Columns * Kp * kAvx2Columns + k / 4 * 32 + 4 * (n % kAvx2Columns) + k % 4] =
            static_cast<int8_t>(src[k * N + n] + kAvx2WeightOffset);
    return panels;
  }
  const bool amx = layout == "amx";  // else VNNI's panels, which "onednn" keeps for its products of few rows
  const int64_t Kp = round_up(K, amx ? kTileDepth : kVnniDepth), Np = round_up(N, amx ? kBlockColumns : kVnniColumns);
  auto panels = at::zeros({Np * Kp}, weight_t.options());
  int8_t* dst = panels.data_ptr<int8_t>();
  for (int64_t k = 0; k < K; ++k)
    for (int64_t n = 0; n < N; ++n)
      dst[n / kVnniColumns * Kp * kVnniColumns + k / kVnniDepth * 64 + kVnniDepth * (n % kVnniColumns) +
          k % kVnniDepth] = static_cast<int8_t>(static_cast<uint8_t>(src[k * N + n]) ^ 0x80u);
  return panels;
}

// x (..., K) float32; weight_t (K, N) int8 codes of the `code_bits` format; packed_weights:
// pack_int8_weights(weight_t, code_bits, product), or empty for the float32 block products; column_sums (N,) int32:
// weight_t's column sums; weight_scale (N,) float32; bias (N,) float32 or None; relu: the output's max(., 0) (a ReLU
// that follows the layer, folded in); amx_minimum_rows: on a CPU with AMX and VNNI, products of fewer rows run VNNI's
// kernels (the same numbers); product: the product the weights were packed for (empty: this CPU's fastest, or the
// float32 blocks where nothing is packed) -> (..., N)
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weight_t, const at::Tensor& packed_weights,
                          const at::Tensor& column_sums, const at::Tensor& weight_scale,
                          const c10::optional<at::Tensor>& bias, bool relu, int64_t code_bits,
                          int64_t amx_minimum_rows, const std::string& product, int64_t onednn_minimum_rows,
                          const c10::optional<at::Tensor>& out) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "int8_linear: the input must be float32, got ", x.scalar_type());
  TORCH_CHECK(weight_t.dim() == 2 && weight_t.scalar_type() == at::kChar, "int8_linear: weight_t must be 2-D int8");
  check_code_bits(code_bits, "int8_linear");
  TORCH_CHECK(amx_minimum_rows >= 0, "int8_linear: amx_minimum_rows must be >= 0, got ", amx_minimum_rows);
  TORCH_CHECK(onednn_minimum_rows >= 0, "int8_linear: onednn_minimum_rows must be >= 0, got ", onednn_minimum_rows);
  const int64_t K = weight_t.size(0), N = weight_t.size(1);
  TORCH_CHECK(x.size(-1) == K, "int8_linear: the input has ", x.size(-1), " features, the weight expects ", K);
  TORCH_CHECK(weight_scale.is_contiguous() && weight_scale.numel() == N &&
                  weight_scale.scalar_type() == at::kFloat,
              "int8_linear: weight_scale must have ", N, " contiguous float32 entries");
  TORCH_CHECK(column_sums.is_contiguous() && column_sums.numel() == N && column_sums.scalar_type() == at::kInt,
              "int8_linear: column_sums must have ", N, " contiguous int32 entries");
  TORCH_CHECK(!bias.has_value() || (bias->is_contiguous() && bias->numel() == N &&
                                    bias->scalar_type() == at::kFloat),
              "int8_linear: bias must have ", N, " contiguous float32 entries");
  const std::string& layout = packed_weights.numel() > 0 || !product.empty()
                                  ? chosen_product(code_bits, product, "int8_linear")
                                  : runnable_products(code_bits).back();  // the float32 blocks
  TORCH_CHECK(packed_weights.numel() == 0 || layout != "float32_blocks",
              "int8_linear: packed weights given, but this CPU has no product that reads ", code_bits,
              "-bit weights packed (AMX: either format; AVX-512 VNNI: 8 bits; AVX2: 7 bits)");
  TORCH_CHECK(K <= kMaximumDepth, "int8_linear: ", K, " input features; at most ", kMaximumDepth,
              " keep every sum within int32");
  // a contiguous input is read in place (a reshaped view would cost a tensor per call)
  const auto rows = x.is_contiguous() ? x : x.contiguous();
  const int64_t M = c10::multiply_integers(x.sizes().begin(), x.sizes().end() - 1);
  // the AMX layout's few-row products run VNNI's kernels on the same weights
  const bool amx_layout = layout == "amx", avx2 = layout == "avx2", onednn_layout = layout == "onednn";
  const bool amx = amx_layout && !(M < amx_minimum_rows && vnni_usable());
  // oneDNN's product reads weight_t itself; its layout's VNNI panels serve the products of few rows
  const bool onednn = onednn_layout && M >= onednn_minimum_rows;
  const bool vnni = layout == "vnni" || (amx_layout && !amx) || (onednn_layout && !onednn);
  const bool vnni_layout = layout == "vnni" || onednn_layout;
  // AMX reads whole tiles: rows padded to 16, depth to 64, columns to 64 (zeros); VNNI reads groups of 4 inputs and
  // panels of 16 columns, AVX2 groups of 8 inputs and panels of 8 columns; results cut back
  const int64_t Mp = amx ? round_up(M, kTileRows) : M;
  const int64_t Kp = amx_layout    ? round_up(K, kTileDepth)
                     : vnni_layout ? round_up(K, kVnniDepth)
                     : avx2        ? round_up(K, kAvx2Depth)
                                   : K;
  const int64_t Np = amx_layout    ? round_up(N, kBlockColumns)
                     : vnni_layout ? round_up(N, kVnniColumns)
                     : avx2        ? round_up(N, kAvx2Columns)
                                   : N;
  TORCH_CHECK(packed_weights.numel() == (layout == "float32_blocks" ? 0 : Np * Kp),
              "int8_linear: packed_weights do not match weight_t (", packed_weights.numel(), " bytes for ", K, " x ",
              N, " weights)");
  auto output_shape = x.sizes().vec();
  output_shape.back() = N;
  // `out` checked before any work; without it, the products that leave sums of the output's shape are dequantized in
  // place (below), the others write a new tensor
  at::Tensor output;
  if (out.has_value() || onednn || vnni) output = linear_output(out, M, N, rows, "int8_linear");
  const QuantizedInput input = quantized_input_buffer(Mp, Kp, M);
  const float* xp = rows.data_ptr<float>();
  int8_t* qp = input.codes;
  float* rs = input.scale;
  int32_t* rz = input.zero;
  const ActivationCodes codes = activation_codes(code_bits);
  // the AVX2 product's offset weights add 64 x each row's code sum, the VNNI and AMX products' 128 x, taken back with
  // these (oneDNN's and the float32 blocks' sums need none)
  int32_t* csp = layout == "float32_blocks" || onednn ? nullptr : input.code_sums;
  hlf::parallel_for(0, M, std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1)),
                   [&](int64_t begin, int64_t end) {
                     run_with_widest_vectors<QuantizeRows>(xp, qp, rs, rz, csp, begin, end, K, Kp, codes);
                   });
  at::Tensor sums;
  int64_t sums_stride = Np;  // the sums' row stride: the padded columns of a packed product
  if (onednn) {
    // (M, N) int32, exact: oneDNN's s8 x s8 product sums in int32 (on VNNI with its own compensation for the signed
    // operand), the same sums as VNNI's kernels; written into the output's memory and dequantized there
    const auto codes_rows = at::from_blob(qp, {M, K}, {Kp, 1}, rows.options().dtype(at::kChar));
    sums = output.view(at::kInt);
    // split by rows across the threads, each chunk's oneDNN product on its thread alone (the same sums); ATen's calls
    // on a pool thread run in the caller's thread-local state (inference mode: `sums` may be an inference tensor)
    const at::ThreadLocalState state;
    hlf::parallel_for(0, M, kOneDnnMinimumRows / 2, [&](int64_t begin, int64_t end) {
      const at::ThreadLocalStateGuard state_guard(state);
      const hlf::OneOpenMpThread one_thread;
      auto rows_sums = sums.narrow(0, begin, end - begin);
      at::_int_mm_out(rows_sums, codes_rows.narrow(0, begin, end - begin), weight_t);
    });
    sums_stride = N;
  }
#if HLF_AMX
  if (amx) {
    std::fill(qp + M * Kp, qp + Mp * Kp, int8_t{0});  // padding rows: their sums are not read
    sums = at::empty({Mp, Np}, rows.options().dtype(at::kInt));
    const int8_t* panels = packed_weights.data_ptr<int8_t>();
    int32_t* sp = sums.data_ptr<int32_t>();
    // whole 64-column blocks, about kAmxTaskMultiplyAdds of the tiles' work or more per task
    const int64_t grain = std::max<int64_t>(1, kAmxTaskMultiplyAdds / std::max<int64_t>(Mp * Kp * kBlockColumns, 1));
    hlf::parallel_for(0, Np / kBlockColumns, grain, [&](int64_t begin, int64_t end) {
      amx_column_blocks(qp, panels, sp, Mp, Kp, Np, begin, end);
    });
  }
  if (vnni) {  // dequantized inside the product (`VnniDequantize`)
    const int8_t* panels = packed_weights.data_ptr<int8_t>();
    float* op = output.data_ptr<float>();
    const float* ws = weight_scale.data_ptr<float>();
    const int32_t* cs = column_sums.data_ptr<int32_t>();
    const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
    // tasks of whole passes of kVnniPanels panels, about 64k multiply-adds or more each (small products: one thread);
    // the panels that hold columns of the output (the AMX layout pads further)
    const int64_t output_panels = round_up(N, kVnniColumns) / kVnniColumns;
    const int64_t passes = (output_panels + kVnniPanels - 1) / kVnniPanels;
    const int64_t grain =
        std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(M * Kp * kVnniColumns * kVnniPanels, 1));
    hlf::parallel_for(0, passes, grain, [&](int64_t begin, int64_t end) {
      for (int64_t pass = begin; pass < end; ++pass) {
        const int64_t panel = pass * kVnniPanels;
        const int P = static_cast<int>(std::min<int64_t>(kVnniPanels, output_panels - panel));
        const int64_t column = panel * kVnniColumns;
        for (int64_t m = 0; m < M; m += kVnniRows) {
          const int R = static_cast<int>(std::min<int64_t>(kVnniRows, M - m));
          const VnniDequantize dequantize{rs + m, rz + m, cs + column, ws + column, bp ? bp + column : nullptr, relu,
                                          N - column, op + m * N + column, N};
          kVnniTable[R - 1][P - 1](qp + m * Kp, Kp, panels + panel * Kp * kVnniColumns, csp + m, dequantize);
        }
      }
    });
    return output.view(output_shape);
  }
  if (avx2) {
    sums = at::empty({M, Np}, rows.options().dtype(at::kInt));
    const int8_t* panels = packed_weights.data_ptr<int8_t>();
    int32_t* sp = sums.data_ptr<int32_t>();
    // about 64k multiply-adds or more per task, so that small products stay on one thread
    const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(M * Kp * kAvx2Columns, 1));
    hlf::parallel_for(0, Np / kAvx2Columns, grain, [&](int64_t begin, int64_t end) {
      for (int64_t panel = begin; panel < end; panel += kAvx2Panels) {
        const auto times_panels = Avx2PanelTable::table[std::min<int64_t>(kAvx2Panels, end - panel) - 1];
        for (int64_t m = 0; m < M; ++m)
          times_panels(qp + m * Kp, Kp, panels + panel * Kp * kAvx2Columns, csp[m], sp + m * Np + panel * kAvx2Columns);
      }
    });
  }
#endif
  if (!amx && !vnni && !avx2 && !onednn) {
    // (M, N) int32, exact: float32 products over blocks of kExactFloatDepth inputs, each below 2^24 in magnitude
    // (so exact), summed in int32, as `exact_int8_product` (inference_copies.py); `at::_int_mm` is far slower than a
    // float product on CPUs without VNNI
    const auto weights = weight_t.to(at::kFloat);
    const auto codes = at::from_blob(qp, {M, K}, at::kChar).to(at::kFloat);
    for (int64_t start = 0; start < K || start == 0; start += kExactFloatDepth) {
      const int64_t depth = std::min(kExactFloatDepth, K - start);
      const auto block = at::mm(codes.narrow(1, start, depth), weights.narrow(0, start, depth)).to(at::kInt);
      sums = start == 0 ? block : sums + block;
    }
  }
  // dequantized into the output: in place where oneDNN wrote the sums there, or where the sums have its shape
  if (!output.defined()) {
    output = sums_stride == N ? sums.view(at::kFloat).narrow(0, 0, M) : linear_output(out, M, N, rows, "int8_linear");
  }
  const int32_t* sp = sums.data_ptr<int32_t>();
  float* op = output.data_ptr<float>();
  const float* ws = weight_scale.data_ptr<float>();
  const int32_t* cs = column_sums.data_ptr<int32_t>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  hlf::parallel_for(0, M, std::max<int64_t>(1, 16384 / std::max<int64_t>(N, 1)), [&](int64_t begin, int64_t end) {
    run_with_widest_vectors<DequantizeRows>(sp, sums_stride, op, rs, rz, amx ? csp : nullptr, cs, ws, bp, relu,
                                            begin, end, N);
  });
  return output.view(output_shape);
}
