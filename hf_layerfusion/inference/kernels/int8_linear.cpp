// The int8 linear layer of `hf_layerfusion.inference.quantization.Int8Linear` in one call: each row of the input is
// quantized to int8 with its own symmetric scale, multiplied with the int8 weights in exact int32 arithmetic
// (`at::_int_mm`: oneDNN, VNNI / AMX where the CPU has them), and dequantized with the bias in float. The arithmetic is
// that of `int8_linear_reference` (quantization.py), bit for bit: no fused multiply-add (-ffp-contract=off), the same
// rounding (half to even), the same order of float operations.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

// The row loops are compiled for several x86 vector widths and the best one the CPU has is picked when the module
// loads, so that the build (cached per machine by torch) stays portable.
#if defined(__x86_64__) && defined(__GNUC__)
#define HLF_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define HLF_VECTOR_CLONES
#endif

namespace {

// rows [begin, end) of x (M, K) -> q = round_half_even(x * (127 / max|x_row|)), row_scale = max|x_row| / 127
HLF_VECTOR_CLONES void quantize_rows(const float* __restrict x, int8_t* __restrict q, float* __restrict row_scale,
                                     int64_t begin, int64_t end, int64_t K) {
  for (int64_t m = begin; m < end; ++m) {
    const float* __restrict row = x + m * K;
    float lanes[16] = {0.f};  // 16 running maxima: a reduction the compiler vectorizes
    int64_t k = 0;
    for (; k + 16 <= K; k += 16)
      for (int j = 0; j < 16; ++j) lanes[j] = std::max(lanes[j], std::fabs(row[k + j]));
    float amax = std::numeric_limits<float>::min();  // an all-zero row quantizes to zeros
    for (; k < K; ++k) amax = std::max(amax, std::fabs(row[k]));
    for (int j = 0; j < 16; ++j) amax = std::max(amax, lanes[j]);
    const float inverse = 127.f / amax;
    int8_t* __restrict qrow = q + m * K;
    for (k = 0; k < K; ++k) qrow[k] = static_cast<int8_t>(static_cast<int32_t>(std::nearbyint(row[k] * inverse)));
    row_scale[m] = amax / 127.f;
  }
}

// rows [begin, end) of the int32 sums (M, N), in place: out = float(sum) * (row_scale * weight_scale) + bias
HLF_VECTOR_CLONES void dequantize_rows(int32_t* sums, const float* __restrict row_scale,
                                       const float* __restrict weight_scale, const float* __restrict bias,
                                       int64_t begin, int64_t end, int64_t N) {
  for (int64_t m = begin; m < end; ++m) {
    const float r = row_scale[m];
    int32_t* srow = sums + m * N;
    float* orow = reinterpret_cast<float*>(srow);  // each element is read before it is overwritten
    if (bias != nullptr)
      for (int64_t n = 0; n < N; ++n) orow[n] = static_cast<float>(srow[n]) * (r * weight_scale[n]) + bias[n];
    else
      for (int64_t n = 0; n < N; ++n) orow[n] = static_cast<float>(srow[n]) * (r * weight_scale[n]);
  }
}

}  // namespace

// x (..., K) float32; weight_t (K, N) int8; weight_scale (N,) float32; bias (N,) float32 or None -> (..., N) float32
torch::Tensor int8_linear(const torch::Tensor& x, const torch::Tensor& weight_t, const torch::Tensor& weight_scale,
                          const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32, "int8_linear: the input must be float32, got ", x.scalar_type());
  TORCH_CHECK(weight_t.dim() == 2 && weight_t.scalar_type() == torch::kInt8, "int8_linear: weight_t must be 2-D int8");
  const int64_t K = weight_t.size(0), N = weight_t.size(1);
  TORCH_CHECK(x.size(-1) == K, "int8_linear: the input has ", x.size(-1), " features, the weight expects ", K);
  TORCH_CHECK(weight_scale.is_contiguous() && weight_scale.numel() == N, "int8_linear: weight_scale must have ", N,
              " contiguous entries");
  TORCH_CHECK(!bias.has_value() || (bias->is_contiguous() && bias->numel() == N &&
                                    bias->scalar_type() == torch::kFloat32),
              "int8_linear: bias must have ", N, " contiguous float32 entries");
  const auto rows = x.reshape({-1, K}).contiguous();
  const int64_t M = rows.size(0);
  auto q = torch::empty({M, K}, rows.options().dtype(torch::kInt8));
  auto row_scale = torch::empty({M}, rows.options());
  const float* xp = rows.data_ptr<float>();
  int8_t* qp = q.data_ptr<int8_t>();
  float* rs = row_scale.data_ptr<float>();
  at::parallel_for(0, M, std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1)),
                   [&](int64_t begin, int64_t end) { quantize_rows(xp, qp, rs, begin, end, K); });
  auto sums = at::_int_mm(q, weight_t);  // (M, N) int32, exact
  int32_t* sp = sums.data_ptr<int32_t>();
  const float* ws = weight_scale.data_ptr<float>();
  const float* bp = bias.has_value() ? bias->data_ptr<float>() : nullptr;
  at::parallel_for(0, M, std::max<int64_t>(1, 16384 / std::max<int64_t>(N, 1)),
                   [&](int64_t begin, int64_t end) { dequantize_rows(sp, rs, ws, bp, begin, end, N); });
  auto shape = x.sizes().vec();
  shape.back() = N;
  return sums.view(torch::kFloat32).view(shape);
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("int8_linear", &int8_linear, "Per-row int8 quantization, exact int32 product, float dequantization + bias.");
}
