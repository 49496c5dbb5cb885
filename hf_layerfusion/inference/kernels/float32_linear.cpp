// The float32 linear layer of `hf_layerfusion.inference.inference_copies.Float32Linear`: y = x W^T + b (then
// max(0, y) with `relu`), for the few rows of a decoding step (on the encoder's thousands of rows it is as fast as
// MKL's sgemm). The weights are packed once into panels of 16 output features, position-major (`Float32Linear` packs
// them: (panels, in_features, 16), zero past out_features), so that a product reads them as one contiguous stream.
// With AVX-512 each pass keeps 12 rows x 32 output features in 24 registers and adds, per input feature, the rows'
// broadcast inputs times two panel vectors; with AVX2 and FMA (no AVX-512) a pass takes one panel at a time and keeps
// 6 rows x 16 output features in 12 of its 16 registers.
//
// Numbers: each output is one fused multiply-add chain over the input features in order, then plus the bias. MKL's
// sgemm (`F.linear`) sums in the same order up to its block length (its results are equal for 256 inputs on this
// project's machine, not for 1024, where it sums blocks of 384 separately), so the two agree to float rounding.
// Both instruction sets compute the same fused multiply-add chains, so the same numbers bit for bit.
// `float32_linear_available()` says whether this CPU has either; the package runs `F.linear` elsewhere.
#include "cpu_kernels.h"

#include "parallel.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HLF_FLOAT32_LINEAR 1
#else
#define HLF_FLOAT32_LINEAR 0
#endif

namespace {

constexpr int64_t kPanelColumns = kFloat32PanelColumns;  // one AVX-512 register of output features, two AVX2 ones
constexpr int64_t kPassColumns = kFloat32PassColumns;    // output features per pass
constexpr int kPassRows = 12;                         // 12 x 2 accumulators, 2 weight registers, 1 broadcast
constexpr int kAvx2PassRows = 6;                      // AVX2: 6 x 2 accumulators, 2 weight registers, 1 broadcast
// how far ahead (in input features: 4 KB of each panel) the first pass over a panel pair asks for its weights, which
// come from memory: at decoding sizes a product is bound by reading them (the later passes find them in cache)
constexpr int64_t kPrefetchDistance = 64;

#if HLF_FLOAT32_LINEAR
// rows [0, R) of x (row stride K) times the panel pair at `panels` (K x 32 floats: two panels of K x 16) into
// `columns` (<= 32) features of y (row stride y_stride), plus `bias` (32 floats); `prefetch` on the first pass over
// the pair
template <int R>
__attribute__((target("avx512f"))) void rows_times_panels(const float* __restrict x, int64_t K,
                                                          const float* __restrict panels, const float* __restrict bias,
                                                          float* __restrict y, int64_t y_stride, int64_t columns,
                                                          bool relu, bool prefetch) {
  const float* __restrict first = panels;
  const float* __restrict second = panels + K * kPanelColumns;
  __m512 low[R], high[R];
  for (int r = 0; r < R; ++r) low[r] = high[r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    if (prefetch) {
      _mm_prefetch(reinterpret_cast<const char*>(first + (k + kPrefetchDistance) * kPanelColumns), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(second + (k + kPrefetchDistance) * kPanelColumns), _MM_HINT_T0);
    }
    const __m512 w_low = _mm512_load_ps(first + k * kPanelColumns);
    const __m512 w_high = _mm512_load_ps(second + k * kPanelColumns);
    for (int r = 0; r < R; ++r) {
      const __m512 input = _mm512_set1_ps(x[r * K + k]);
      low[r] = _mm512_fmadd_ps(input, w_low, low[r]);
      high[r] = _mm512_fmadd_ps(input, w_high, high[r]);
    }
  }
  const __m512 bias_low = _mm512_loadu_ps(bias), bias_high = _mm512_loadu_ps(bias + kPanelColumns);
  for (int r = 0; r < R; ++r) {
    __m512 out_low = _mm512_add_ps(low[r], bias_low), out_high = _mm512_add_ps(high[r], bias_high);
    if (relu) {
      // max(0, y): the second operand where either is NaN, so that NaN stays NaN (as torch.relu)
      out_low = _mm512_max_ps(_mm512_setzero_ps(), out_low);
      out_high = _mm512_max_ps(_mm512_setzero_ps(), out_high);
    }
    float* row = y + r * y_stride;
    if (columns == kPassColumns) {
      _mm512_storeu_ps(row, out_low);
      _mm512_storeu_ps(row + kPanelColumns, out_high);
    } else {  // the last, partial pass of a layer whose out_features is not a multiple of 32
      alignas(64) float buffer[kPassColumns];
      _mm512_store_ps(buffer, out_low);
      _mm512_store_ps(buffer + kPanelColumns, out_high);
      std::memcpy(row, buffer, columns * sizeof(float));
    }
  }
}

template <int... R>
struct RowsTimesPanels {
  // the pass for 1..kPassRows rows, indexed by rows - 1
  static constexpr decltype(&rows_times_panels<1>) table[] = {&rows_times_panels<R>...};
};
using PassTable = RowsTimesPanels<1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12>;

// AVX2: rows [0, R) of x times the one panel at `panel` (K x 16 floats) into `columns` (<= 16) features of y, plus
// `bias` (16 floats); the same multiply-add chain per output as `rows_times_panels`
template <int R>
__attribute__((target("avx2,fma"))) void rows_times_panel_avx2(const float* __restrict x, int64_t K,
                                                               const float* __restrict panel,
                                                               const float* __restrict bias, float* __restrict y,
                                                               int64_t y_stride, int64_t columns, bool relu,
                                                               bool prefetch) {
  __m256 low[R], high[R];
  for (int r = 0; r < R; ++r) low[r] = high[r] = _mm256_setzero_ps();
  for (int64_t k = 0; k < K; ++k) {
    if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(panel + (k + kPrefetchDistance) * kPanelColumns), _MM_HINT_T0);
    const __m256 w_low = _mm256_load_ps(panel + k * kPanelColumns);
    const __m256 w_high = _mm256_load_ps(panel + k * kPanelColumns + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 input = _mm256_set1_ps(x[r * K + k]);
      low[r] = _mm256_fmadd_ps(input, w_low, low[r]);
      high[r] = _mm256_fmadd_ps(input, w_high, high[r]);
    }
  }
  const __m256 bias_low = _mm256_loadu_ps(bias), bias_high = _mm256_loadu_ps(bias + 8);
  for (int r = 0; r < R; ++r) {
    __m256 out_low = _mm256_add_ps(low[r], bias_low), out_high = _mm256_add_ps(high[r], bias_high);
    if (relu) {  // the second operand where either is NaN, as above
      out_low = _mm256_max_ps(_mm256_setzero_ps(), out_low);
      out_high = _mm256_max_ps(_mm256_setzero_ps(), out_high);
    }
    float* row = y + r * y_stride;
    if (columns == kPanelColumns) {
      _mm256_storeu_ps(row, out_low);
      _mm256_storeu_ps(row + 8, out_high);
    } else {  // the last, partial panel (a store through a stack buffer here made GCC keep the sums on the stack)
      const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
      _mm256_maskstore_ps(row, _mm256_cmpgt_epi32(_mm256_set1_epi32(columns), lane), out_low);
      _mm256_maskstore_ps(row + 8, _mm256_cmpgt_epi32(_mm256_set1_epi32(columns - 8), lane), out_high);
    }
  }
}

template <int... R>
struct RowsTimesPanelAvx2 {
  static constexpr decltype(&rows_times_panel_avx2<1>) table[] = {&rows_times_panel_avx2<R>...};
};
using Avx2PassTable = RowsTimesPanelAvx2<1, 2, 3, 4, 5, 6>;

// `pass(first_row, rows)` over M rows in the fewest blocks of at most `max_rows`, their sizes as equal as possible
// (32 rows with 6 per pass: 6, 6, 5, 5, 5, 5, not 6 x 5 + 2). A pass's time is bound by its multiply-add chains'
// latency when it has few rows (2 rows keep 4 chains in flight where the FMA units need about 10), so a small last
// block costs nearly as much as a full one: 32 rows took as long as 35 at 256 -> 8000 on AVX2. Each output's chain is
// the same however the rows are blocked.
template <typename Pass>
void for_row_blocks(int64_t M, int64_t max_rows, const Pass& pass) {
  const int64_t blocks = (M + max_rows - 1) / max_rows;
  if (blocks == 0) return;
  const int64_t base = M / blocks, larger = M % blocks;  // the first `larger` blocks take one row more
  for (int64_t block = 0, m = 0; block < blocks; ++block) {
    const int64_t rows = base + (block < larger ? 1 : 0);
    pass(m, rows);
    m += rows;
  }
}

bool has_avx512() { return instruction_set_allowed(kAvx512Instructions) && __builtin_cpu_supports("avx512f"); }
bool has_avx2_fma() {
  return instruction_set_allowed(kAvx2Instructions) && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
#endif

}  // namespace

bool float32_linear_available() {
#if HLF_FLOAT32_LINEAR
  return has_avx512() || has_avx2_fma();
#else
  return false;
#endif
}

at::Tensor float32_linear(const at::Tensor& x, const at::Tensor& panels, int64_t out_features,
                             const c10::optional<at::Tensor>& bias, bool relu,
                             const c10::optional<at::Tensor>& out) {
  TORCH_CHECK(float32_linear_available(),
              "float32_linear: this CPU has neither AVX-512 nor AVX2 with FMA, or the instruction set cap (",
              max_instruction_set(), ", HF_LAYERFUSION_MAX_CPU_ISA) excludes them (float32_linear_available())");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu(),
              "float32_linear: the input must be a float32 CPU tensor, got ", x.scalar_type(), " on ", x.device());
  TORCH_CHECK(panels.dim() == 3 && panels.scalar_type() == at::kFloat && panels.is_contiguous() &&
                  panels.size(2) == kPanelColumns && panels.size(0) % 2 == 0,
              "float32_linear: panels must be contiguous float32 (an even number of panels, in_features, 16), got ",
              panels.sizes());
  TORCH_CHECK(reinterpret_cast<uintptr_t>(panels.data_ptr<float>()) % 64 == 0,
              "float32_linear: panels must be 64-byte aligned");
  const int64_t K = panels.size(1), padded = panels.size(0) * kPanelColumns, N = out_features;
  TORCH_CHECK(x.dim() >= 1 && x.size(-1) == K, "float32_linear: the input has ", x.size(-1),
              " features, the weights expect ", K);
  TORCH_CHECK(N > padded - kPassColumns && N <= padded, "float32_linear: out_features ", N,
              " does not match panels for ", padded, " features");
  TORCH_CHECK(!bias.has_value() || (bias->is_contiguous() && bias->numel() == N &&
                                    bias->scalar_type() == at::kFloat),
              "float32_linear: bias must be contiguous float32 with ", N, " values");
  const auto rows = x.reshape({-1, K}).contiguous();
  const int64_t M = rows.size(0);
  auto output_sizes = x.sizes().vec();
  output_sizes.back() = N;
  auto y = linear_output(out, M, N, rows, "float32_linear");
#if HLF_FLOAT32_LINEAR
  const float* x_data = rows.data_ptr<float>();
  const float* panel_data = panels.data_ptr<float>();
  const float* bias_data = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  float* y_data = y.data_ptr<float>();
  const int64_t passes = padded / kPassColumns;
  const bool avx512 = has_avx512();
  // about 64k multiply-adds or more per task, so that small products stay on one thread
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(M * K * kPassColumns, 1));
  hlf::parallel_for(0, passes, grain, [&](int64_t begin, int64_t end) {
    alignas(64) float pass_bias[kPassColumns];
    for (int64_t pass = begin; pass < end; ++pass) {
      const int64_t first_column = pass * kPassColumns;
      const int64_t columns = std::min(kPassColumns, N - first_column);
      std::fill(pass_bias, pass_bias + kPassColumns, 0.f);
      if (bias_data != nullptr) std::memcpy(pass_bias, bias_data + first_column, columns * sizeof(float));
      const float* pass_panels = panel_data + first_column * K;
      if (avx512) {
        for_row_blocks(M, kPassRows, [&](int64_t m, int64_t pass_rows) {
          PassTable::table[pass_rows - 1](x_data + m * K, K, pass_panels, pass_bias, y_data + m * N + first_column,
                                          N, columns, relu, /*prefetch=*/m == 0);
        });
        continue;
      }
      for (int64_t panel = 0; panel * kPanelColumns < columns; ++panel) {
        const int64_t offset = panel * kPanelColumns;
        for_row_blocks(M, kAvx2PassRows, [&](int64_t m, int64_t pass_rows) {
          Avx2PassTable::table[pass_rows - 1](x_data + m * K, K, pass_panels + offset * K, pass_bias + offset,
                                              y_data + m * N + first_column + offset, N,
                                              std::min(kPanelColumns, columns - offset), relu, /*prefetch=*/m == 0);
        });
      }
    }
  });
#endif
  return y.view(output_sizes);
}
