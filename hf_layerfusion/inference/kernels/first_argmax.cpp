// Greedy search's choice at each step: the index of each row's largest score, the first one where several tie, and
// the first NaN where the row has one: what `scores.max(dim=-1).indices` (and `argmax`) return, for float32
// `(rows, vocab)` scores. torch's reduction takes about 100 µs for 32 x 8000 scores on one core; here a row is one pass,
// 16 floats at a time (8 on AVX2), each lane keeping its largest value and where it first occurred.
//
// `greedy_choice` is the rest of a greedy step after that choice, as `generate()`'s `_sample` does it with torch
// operations (about ten calls and a synchronising count per step, tens of microseconds at the one-row steps where a
// step's kernels take a few hundred): finished rows get the padding token, rows whose token is an end token finish,
// each token is written into the sequences at its row.
#include "cpu_kernels.h"

#include <ATen/ops/empty.h>

#include "parallel.h"

#include <algorithm>
#include <cmath>
#include <tuple>

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

at::Tensor first_argmax(const at::Tensor& scores) {
  TORCH_CHECK(scores.dim() == 2 && scores.scalar_type() == at::kFloat && scores.device().is_cpu() &&
                  scores.size(1) > 0 && scores.stride(1) == 1,
              "first_argmax: the scores must be float32 CPU (rows, vocab) with vocab > 0 contiguous, got ",
              scores.scalar_type(), " ", scores.sizes(), " on ", scores.device());
  auto output = at::empty({scores.size(0)}, scores.options().dtype(at::kLong));
  const float* data = scores.data_ptr<float>();
  int64_t* indices = output.data_ptr<int64_t>();
  const int64_t stride = scores.stride(0), vocab = scores.size(1);
  hlf::parallel_for(0, scores.size(0), 16, [&](int64_t begin, int64_t end) {
    run_with_widest_vectors<ArgmaxRows>(data, stride, vocab, indices, begin, end);
  });
  return output;
}

// scores (rows, vocab) as first_argmax; finished (rows,) bool, updated in place; sequences (batch, width) int64, row
// rows[r] (r itself without rows) getting row r's token at `position`; eos_tokens: None or int64 (n,) (then
// pad_token is required) -> (the tokens (rows,) int64, how many rows are finished)
std::tuple<at::Tensor, int64_t> greedy_choice(const at::Tensor& scores, const at::Tensor& finished,
                                                 const at::Tensor& sequences,
                                                 const c10::optional<at::Tensor>& rows, int64_t position,
                                                 const c10::optional<int64_t>& pad_token,
                                                 const c10::optional<at::Tensor>& eos_tokens) {
  auto tokens = first_argmax(scores);
  const int64_t count = scores.size(0);
  TORCH_CHECK(finished.dim() == 1 && finished.size(0) == count && finished.scalar_type() == at::kBool &&
                  finished.is_contiguous() && finished.device().is_cpu(),
              "greedy_choice: finished must be a contiguous bool CPU tensor (", count, ",), got ",
              finished.scalar_type(), " ", finished.sizes());
  TORCH_CHECK(sequences.dim() == 2 && sequences.scalar_type() == at::kLong && sequences.device().is_cpu() &&
                  position >= 0 && position < sequences.size(1),
              "greedy_choice: the sequences must be int64 CPU (batch, width) with position ", position,
              " inside width, got ", sequences.scalar_type(), " ", sequences.sizes());
  const int64_t batch = sequences.size(0);
  const int64_t* row_of = nullptr;
  if (rows.has_value()) {
    TORCH_CHECK(rows->dim() == 1 && rows->size(0) == count && rows->scalar_type() == at::kLong &&
                    rows->is_contiguous() && rows->device().is_cpu(),
                "greedy_choice: rows must be a contiguous int64 CPU tensor (", count, ",), got ",
                rows->scalar_type(), " ", rows->sizes());
    row_of = rows->data_ptr<int64_t>();
    for (int64_t r = 0; r < count; ++r)
      TORCH_CHECK(row_of[r] >= 0 && row_of[r] < batch, "greedy_choice: rows[", r, "] = ", row_of[r],
                  " is outside the ", batch, " rows of the sequences");
  } else {
    TORCH_CHECK(count == batch, "greedy_choice: ", count, " rows of scores need ", count,
                " rows of sequences without `rows`, got ", batch);
  }
  const int64_t* eos = nullptr;
  int64_t eos_count = 0;
  if (eos_tokens.has_value()) {
    TORCH_CHECK(eos_tokens->dim() == 1 && eos_tokens->scalar_type() == at::kLong &&
                    eos_tokens->is_contiguous() && eos_tokens->device().is_cpu(),
                "greedy_choice: eos_tokens must be a contiguous int64 CPU tensor (n,), got ",
                eos_tokens->scalar_type(), " ", eos_tokens->sizes());
    TORCH_CHECK(pad_token.has_value(), "greedy_choice: eos_tokens need a pad_token for the finished rows");
    eos = eos_tokens->data_ptr<int64_t>();
    eos_count = eos_tokens->size(0);
  }
  int64_t* token = tokens.data_ptr<int64_t>();
  bool* done = finished.data_ptr<bool>();
  int64_t* sequence = sequences.data_ptr<int64_t>();
  const int64_t row_stride = sequences.stride(0), column = position * sequences.stride(1);
  int64_t finished_rows = 0;
  for (int64_t r = 0; r < count; ++r) {
    if (eos != nullptr) {
      if (done[r]) token[r] = *pad_token;
      done[r] = done[r] || std::find(eos, eos + eos_count, token[r]) != eos + eos_count;
    }
    finished_rows += done[r];
    sequence[(row_of ? row_of[r] : r) * row_stride + column] = token[r];
  }
  return {tokens, finished_rows};
}
