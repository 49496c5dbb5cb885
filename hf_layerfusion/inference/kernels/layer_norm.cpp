// The residual sum and LayerNorm of a sub-layer in one call, for the inference copies' `KernelResidualSublayer`
// (`hf_layerfusion.inference.inference_copies`): `add_layer_norm(x, y, weight, bias, eps)` is LayerNorm(x + y), and
// with y = None LayerNorm(x). At a decoding step (tens of rows of a few hundred features) torch's `add` and
// `layer_norm` cost mostly their fixed per-call work; here each row is three passes over its features in cache.
//
// Numbers: float32, the row's mean and then the mean of its squared deviations, each summed in 16 lanes (8 on AVX2) and then
// pairwise (`lane_sum`), (x - mean) / sqrt(variance + eps) * weight + bias: torch's LayerNorm up to float rounding.
#include "cpu_kernels.h"

#include <ATen/ops/empty_like.h>

#include "parallel.h"

#include "vector16.h"

namespace {

// rows [begin, end) of (rows, features): LayerNorm(x + y) (y may be null) into `output`; features % 16 == 0
struct NormalizeRows {
  template <class V>
  HLF_INLINE static void run(const float* x, const float* y, const float* weight, const float* bias, float eps,
                             float* output, int64_t features, int64_t begin, int64_t end) {
    const float inverse_features = 1.f / static_cast<float>(features);
    for (int64_t row = begin; row < end; ++row) {
      const float* a = x + row * features;
      const float* b = y ? y + row * features : nullptr;
      float* out = output + row * features;
      V total{};
      for (int64_t f = 0; f < features; f += kWidth<V>) {  // the sum x + y, kept in `out` for the next passes
        const V value = b ? load_vector<V>(a + f) + load_vector<V>(b + f) : load_vector<V>(a + f);
        store_vector(out + f, value);
        total += value;
      }
      const float mean = lane_sum(total) * inverse_features;
      V squares{};
      for (int64_t f = 0; f < features; f += kWidth<V>) {
        const V deviation = load_vector<V>(out + f) - mean;
        squares += deviation * deviation;
      }
      const float inverse_std = 1.f / std::sqrt(lane_sum(squares) * inverse_features + eps);
      for (int64_t f = 0; f < features; f += kWidth<V>) {
        store_vector(out + f, (load_vector<V>(out + f) - mean) * inverse_std * load_vector<V>(weight + f) + load_vector<V>(bias + f));
      }
    }
  }
};

}  // namespace

at::Tensor add_layer_norm(const at::Tensor& x, const c10::optional<at::Tensor>& y, const at::Tensor& weight,
                             const at::Tensor& bias, double eps) {
  const int64_t features = x.size(-1);
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.device().is_cpu() && x.dim() >= 1 && features % kLanes == 0,
              "add_layer_norm: x must be a float32 CPU tensor whose last dimension is a multiple of 16, got ",
              x.scalar_type(), " ", x.sizes(), " on ", x.device());
  TORCH_CHECK(!y.has_value() || (y->sizes() == x.sizes() && y->scalar_type() == at::kFloat && y->device().is_cpu()),
              "add_layer_norm: y must be float32 of x's shape ", x.sizes());
  TORCH_CHECK(weight.scalar_type() == at::kFloat && bias.scalar_type() == at::kFloat &&
                  weight.numel() == features && bias.numel() == features,
              "add_layer_norm: weight and bias must be float32 with ", features, " values");
  const auto a = x.contiguous();
  const auto b = y.has_value() ? y->contiguous() : at::Tensor();
  const auto w = weight.contiguous(), c = bias.contiguous();
  auto output = at::empty_like(a);
  hlf::parallel_for(0, a.numel() / features, 64, [&](int64_t begin, int64_t end) {
    run_with_widest_vectors<NormalizeRows>(a.data_ptr<float>(), y.has_value() ? b.data_ptr<float>() : nullptr,
                                           w.data_ptr<float>(), c.data_ptr<float>(), static_cast<float>(eps),
                                           output.data_ptr<float>(), features, begin, end);
  });
  return output;
}
