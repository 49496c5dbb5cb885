// Greedy search's choice at each step: the index of each row's largest score, the first one where several tie, and
// the first NaN where the row has one: what `scores.max(dim=-1).indices` (and `argmax`) return, for float32
// `(rows, vocab)` scores. torch's reduction takes about 100 µs for 32 x 8000 scores on one core; here a row is one pass,
// 16 floats at a time (8 on AVX2), each lane keeping its largest value and where it first occurred.
#include "cpu_kernels.h"

#include <ATen/Parallel.h>

#include <cmath>

#include "vector16.h"

namespace {

struct ArgmaxRows {
  template <class V>
  HLF_INLINE static void run(const float* scores, int64_t row_stride, int64_t vocab, int64_t* output, int64_t begin,
                             int64_t end) {
    using Int = typename VectorTypes<V>::Int;
    const int64_t whole = vocab / kWidth<V> * kWidth<V>;
    Int lane_offsets;
    for (int lane = 0; lane < kWidth<V>; ++lane) lane_offsets[lane] = lane;
    for (int64_t row = begin; row < end; ++row) {
      const float* x = scores + row * row_stride;
      // per lane: the largest value so far and where it first occurred (a strict > keeps the first of equal values)
      V maxima = splat_vector<V>(-INFINITY);
      Int positions{}, unordered{};  // unordered: lanes that saw a NaN (x != x)
      for (int64_t v = 0; v < whole; v += kWidth<V>) {
        const V values = load_vector<V>(x + v);
        const auto greater = values > maxima;
        maxima = greater ? values : maxima;
        positions = greater ? lane_offsets + static_cast<int32_t>(v) : positions;
        unordered |= values != values;
      }
      // lanes that saw no value above -inf keep position 0 (lane offset 0 only in lane 0): correct for a row of -inf
      float maximum = -INFINITY;
      int64_t index = vocab;
      bool has_nan = false;
      for (int lane = 0; lane < kWidth<V> && lane < whole; ++lane) {
        has_nan |= unordered[lane] != 0;
        const int64_t position = maxima[lane] == -INFINITY ? lane : positions[lane];  // first -inf of the lane
        if (maxima[lane] > maximum || (maxima[lane] == maximum && position < index)) {
          maximum = maxima[lane];
          index = position;
        }
      }
      for (int64_t v = whole; v < vocab; ++v) {
        has_nan |= std::isnan(x[v]);
        if (x[v] > maximum || index == vocab) {  // the tail comes after every vector position
          maximum = x[v];
          index = v;
        }
      }
      if (has_nan) {
        index = 0;
        while (!std::isnan(x[index])) ++index;
      }
      output[row] = index;
    }
  }
};

}  // namespace

torch::Tensor first_argmax(const torch::Tensor& scores) {
  TORCH_CHECK(scores.dim() == 2 && scores.scalar_type() == torch::kFloat32 && scores.device().is_cpu() &&
                  scores.size(1) > 0 && scores.stride(1) == 1,
              "first_argmax: the scores must be float32 CPU (rows, vocab) with vocab > 0 contiguous, got ",
              scores.scalar_type(), " ", scores.sizes(), " on ", scores.device());
  auto output = torch::empty({scores.size(0)}, scores.options().dtype(torch::kInt64));
  const float* data = scores.data_ptr<float>();
  int64_t* indices = output.data_ptr<int64_t>();
  const int64_t stride = scores.stride(0), vocab = scores.size(1);
  at::parallel_for(0, scores.size(0), 16, [&](int64_t begin, int64_t end) {
    run_with_widest_vectors<ArgmaxRows>(data, stride, vocab, indices, begin, end);
  });
  return output;
}
