// GTrans' output mixture at inference (paper Eq. 5): log sum_g psi_g softmax(z_g) for each row of the group logits
// z `(groups, rows, vocab)`, clamped below at the smallest normal float before the log, what
// `probability_mixture` (hf_layerfusion/modeling/extension_points.py) computes with torch operations (a softmax per
// group, a weighted sum, a clamp, a log: five passes over `(groups, rows, vocab)`). Here each row is done in three passes over its
// groups' logits (maximum; exponentials and their sum; the weighted sum and its log), 16 floats at a time (8 on AVX2).
//
// Numbers: float32; exp and log by Cephes' polynomials (about 1 ulp, exp flushes below e^-87 to 0: such terms are
// below the clamp anyway), sums in another order than torch's: the same function up to float rounding.
#include "cpu_kernels.h"

#include <ATen/ops/empty.h>

#include "parallel.h"

#include <cfloat>
#include <vector>

#include "vector16.h"

namespace {

// rows [begin, end): logits (groups, rows, vocab) contiguous, psi (groups), output (rows, vocab); `scratch` holds
// groups * vocab rounded up to 16 floats
struct MixRows {
  template <class V>
  HLF_INLINE static void run(const float* logits, const float* psi, float* output, int64_t groups, int64_t rows,
                             int64_t vocab, int64_t begin, int64_t end, float* scratch) {
    const int64_t stride = (vocab + kWidth<V> - 1) / kWidth<V> * kWidth<V>;  // of `scratch`, per group
    const int64_t padded = (vocab + kWidth<V> - 1) / kWidth<V> * kWidth<V>;  // <= stride
    std::vector<float> weight(groups);
    for (int64_t row = begin; row < end; ++row) {
      for (int64_t g = 0; g < groups; ++g) {
        const float* z = logits + (g * rows + row) * vocab;
        float* e = scratch + g * stride;
        // the group's maximum, then exp(z - max) (the padding past vocab weighs 0) and their sum
        const int64_t whole = vocab / kWidth<V> * kWidth<V>;
        V maxima = splat_vector<V>(-INFINITY);
        for (int64_t v = 0; v < whole; v += kWidth<V>) {
          const V x = load_vector<V>(z + v);
          maxima = x > maxima ? x : maxima;
        }
        float maximum = lane_max(maxima);
        for (int64_t v = whole; v < vocab; ++v) maximum = z[v] > maximum ? z[v] : maximum;
        V sums{};
        for (int64_t v = 0; v < whole; v += kWidth<V>) {
          const V x = exp_nonpositive(load_vector<V>(z + v) - maximum);
          store_vector(e + v, x);
          sums += x;
        }
        if (whole < padded) {
          float tail[kWidth<V>];
          for (int64_t v = 0; v < kWidth<V>; ++v) tail[v] = whole + v < vocab ? z[whole + v] : -INFINITY;
          const V x = exp_nonpositive(load_vector<V>(tail) - maximum);
          store_vector(e + whole, x);
          sums += x;
        }
        weight[g] = psi[g] / lane_sum(sums);  // psi_g / sum_v exp(z_gv - max_g)
      }
      float* out = output + row * vocab;
      const V tiny = splat_vector<V>(FLT_MIN);
      for (int64_t v = 0; v < padded; v += kWidth<V>) {
        V mixture = load_vector<V>(scratch + v) * weight[0];
        for (int64_t g = 1; g < groups; ++g) mixture += load_vector<V>(scratch + g * stride + v) * weight[g];
        const V log_mixture = log_positive(mixture > tiny ? mixture : tiny);
        if (v + kWidth<V> <= vocab) {
          store_vector(out + v, log_mixture);
        } else {
          float tail[kWidth<V>];
          store_vector(tail, log_mixture);
          std::memcpy(out + v, tail, (vocab - v) * sizeof(float));
        }
      }
    }
  }
};

}  // namespace

at::Tensor mixture_log_probs(const at::Tensor& group_logits, const at::Tensor& psi) {
  TORCH_CHECK(group_logits.dim() == 3 && group_logits.scalar_type() == at::kFloat &&
                  group_logits.device().is_cpu() && group_logits.size(2) > 0,
              "mixture_log_probs: group_logits must be a float32 CPU tensor (groups, rows, vocab), got ",
              group_logits.scalar_type(), " ", group_logits.sizes(), " on ", group_logits.device());
  TORCH_CHECK(psi.dim() == 1 && psi.scalar_type() == at::kFloat && psi.size(0) == group_logits.size(0),
              "mixture_log_probs: psi must be float32 with one weight per group (", group_logits.size(0), "), got ",
              psi.scalar_type(), " ", psi.sizes());
  const auto logits = group_logits.contiguous();
  const auto weights = psi.contiguous().cpu();
  const int64_t groups = logits.size(0), rows = logits.size(1), vocab = logits.size(2);
  auto output = at::empty({rows, vocab}, logits.options());
  const int64_t padded = (vocab + kLanes - 1) / kLanes * kLanes;
  hlf::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch(groups * padded);
    run_with_widest_vectors<MixRows>(logits.data_ptr<float>(), weights.data_ptr<float>(), output.data_ptr<float>(),
                                     groups, rows, vocab, begin, end, scratch.data());
  });
  return output;
}
