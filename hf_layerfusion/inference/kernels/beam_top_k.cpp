// Beam search's choice at each step: for each batch item, the k best of its `beams x vocab` candidates, each scored
// `log_probs[beam, token] + beam_scores[beam]`, what `generate()` computes as a (beams, vocab) addition followed by
// `torch.topk` over the item's flattened candidates (transformers' `_get_top_k_continuations`). torch takes about 2 ms
// for that at 32 items x 4 beams x 8,000 tokens on one core (a full pass to add, then a partial sort); here an item
// is one pass over its log-probabilities, 16 floats at a time (8 on AVX2), against the current k-th best score: a
// vector where no lane beats it (almost all of them after the first few) costs one comparison.
//
// Numbers: each score is the same float32 addition as torch's, so the values are torch's bit for bit. Order: by score,
// and among equal scores by candidate index (beam * vocab + token), lowest first (torch.topk leaves the order of ties
// unspecified). An item with a NaN score is handed to torch.topk itself (which ranks NaN above everything).
#include "cpu_kernels.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/topk.h>
#include <ATen/ops/zeros.h>

#include "parallel.h"

#include <cmath>
#include <cstring>

#include "vector16.h"

namespace {

// the best `k` candidates so far, best first; equal scores in the order they were offered (ascending index)
struct BestCandidates {
  float* scores;
  int64_t* indices;
  int64_t k;
  int64_t count = 0;

  // `score` (not NaN) of a candidate whose index is above every index held; when full, only for a score above the
  // last one held (which it pushes out)
  HLF_INLINE void insert(float score, int64_t index) {
    int64_t position = count < k ? count : k - 1;
    while (position > 0 && scores[position - 1] < score) {
      scores[position] = scores[position - 1];
      indices[position] = indices[position - 1];
      --position;
    }
    scores[position] = score;
    indices[position] = index;
    if (count < k) ++count;
  }
};

// whether any lane of a comparison's mask is set
template <class Int>
HLF_INLINE bool any_lane(Int mask) {
  uint64_t words[sizeof(Int) / sizeof(uint64_t)];
  std::memcpy(words, &mask, sizeof(words));
  uint64_t any = 0;
  for (uint64_t word : words) any |= word;
  return any != 0;
}

struct TopKItems {
  // items [begin, end): log_probs rows item * beams + beam (row_stride apart), beam_scores (items, beams) contiguous,
  // out_scores / out_indices (items, k); has_nan[item] = 1 where the item has a NaN score (its outputs then unset)
  template <class V>
  HLF_INLINE static void run(const float* log_probs, int64_t row_stride, int64_t vocab, const float* beam_scores,
                             int64_t beams, int64_t k, float* out_scores, int64_t* out_indices, uint8_t* has_nan,
                             int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      BestCandidates best{out_scores + item * k, out_indices + item * k, k};
      bool nan = false;
      for (int64_t beam = 0; beam < beams && !nan; ++beam) {
        const float* x = log_probs + (item * beams + beam) * row_stride;
        const float beam_score = beam_scores[item * beams + beam];
        const int64_t offset = beam * vocab;
        int64_t token = 0;
        // the first k candidates of the item enter whatever their score
        for (; best.count < k && token < vocab; ++token) {
          const float score = x[token] + beam_score;
          if (std::isnan(score)) {
            nan = true;
            break;
          }
          best.insert(score, offset + token);
        }
        if (nan) break;
        // then only a score above the k-th (an equal one comes later in index order: it would rank after it)
        float threshold = best.count == k ? best.scores[k - 1] : -INFINITY;  // not full: the beam's tokens are done
        const V added = splat_vector<V>(beam_score);
        for (; token + kWidth<V> <= vocab && !nan; token += kWidth<V>) {
          const V scores = load_vector<V>(x + token) + added;
          // !(score <= threshold): above it, or NaN
          if (!any_lane(~(scores <= splat_vector<V>(threshold)))) continue;
          for (int lane = 0; lane < kWidth<V>; ++lane) {
            const float score = scores[lane];
            if (std::isnan(score)) {
              nan = true;
              break;
            }
            if (score > threshold) {
              best.insert(score, offset + token + lane);
              threshold = best.scores[k - 1];
            }
          }
        }
        for (; token < vocab && !nan; ++token) {
          const float score = x[token] + beam_score;
          if (std::isnan(score)) {
            nan = true;
          } else if (score > threshold) {
            best.insert(score, offset + token);
            threshold = best.scores[k - 1];
          }
        }
      }
      has_nan[item] = nan ? 1 : 0;
    }
  }
};

}  // namespace

std::tuple<at::Tensor, at::Tensor> beam_top_k(const at::Tensor& log_probs, const at::Tensor& beam_scores,
                                                     int64_t k) {
  TORCH_CHECK(log_probs.dim() == 2 && log_probs.scalar_type() == at::kFloat && log_probs.device().is_cpu() &&
                  log_probs.size(1) > 0 && log_probs.stride(1) == 1,
              "beam_top_k: the log-probabilities must be float32 CPU (items * beams, vocab) with vocab > 0 contiguous, "
              "got ", log_probs.scalar_type(), " ", log_probs.sizes(), " on ", log_probs.device());
  TORCH_CHECK(beam_scores.dim() == 2 && beam_scores.scalar_type() == at::kFloat && beam_scores.device().is_cpu() &&
                  beam_scores.size(1) > 0 && beam_scores.numel() == log_probs.size(0),
              "beam_top_k: the beam scores must be float32 CPU (items, beams) with one score per row of the "
              "log-probabilities (", log_probs.size(0), " rows), got ", beam_scores.scalar_type(), " ",
              beam_scores.sizes());
  const int64_t items = beam_scores.size(0), beams = beam_scores.size(1), vocab = log_probs.size(1);
  TORCH_CHECK(k >= 1 && k <= beams * vocab, "beam_top_k: k must be in [1, beams * vocab = ", beams * vocab, "], got ",
              k);
  const auto scores_in = beam_scores.contiguous();
  auto out_scores = at::empty({items, k}, log_probs.options());
  auto out_indices = at::empty({items, k}, log_probs.options().dtype(at::kLong));
  auto has_nan = at::zeros({items}, log_probs.options().dtype(at::kByte));
  const float* data = log_probs.data_ptr<float>();
  const float* beam_data = scores_in.data_ptr<float>();
  float* scores_data = out_scores.data_ptr<float>();
  int64_t* indices_data = out_indices.data_ptr<int64_t>();
  uint8_t* nan_data = has_nan.data_ptr<uint8_t>();
  const int64_t stride = log_probs.stride(0);
  hlf::parallel_for(0, items, 4, [&](int64_t begin, int64_t end) {
    run_with_widest_vectors<TopKItems>(data, stride, vocab, beam_data, beams, k, scores_data, indices_data, nan_data,
                                       begin, end);
  });
  for (int64_t item = 0; item < items; ++item) {
    if (!nan_data[item]) continue;
    const auto candidates = (log_probs.narrow(0, item * beams, beams) + scores_in[item].unsqueeze(1)).reshape({-1});
    const auto [values, indices] = at::topk(candidates, k);
    out_scores[item].copy_(values);
    out_indices[item].copy_(indices);
  }
  return {out_scores, out_indices};
}

// transformers' `_get_top_k_continuations` (without sampling) after the choice in one call: each candidate of
// `beam_top_k` continues beam `index / vocab` with token `index % vocab`; its sequence is that beam's row of
// `running_sequences` (items, beams, width) with the token written at `cur_len`, its beam indices that beam's row of
// `running_beam_indices` (items, beams, index width) with `item * beams + beam` written at `beam_index_column`. What
// the helper's division, modulo, two `take_along_dim` gathers and two writes compute (each a torch operation of a
// few to tens of microseconds, every step), as (scores (items, k), sequences (items, k, width), beam indices
// (items, k, index width)).
std::tuple<at::Tensor, at::Tensor, at::Tensor> beam_top_k_continuations(
    const at::Tensor& log_probs, const at::Tensor& beam_scores, int64_t k, const at::Tensor& running_sequences,
    const at::Tensor& running_beam_indices, int64_t cur_len, int64_t beam_index_column) {
  auto [scores, candidates] = beam_top_k(log_probs, beam_scores, k);
  const int64_t items = beam_scores.size(0), beams = beam_scores.size(1), vocab = log_probs.size(1);
  TORCH_CHECK(running_sequences.dim() == 3 && running_sequences.size(0) == items &&
                  running_sequences.size(1) == beams && running_sequences.scalar_type() == at::kLong,
              "beam_top_k_continuations: the running sequences must be int64 (", items, ", ", beams,
              ", width), got ", running_sequences.scalar_type(), " ", running_sequences.sizes());
  TORCH_CHECK(running_beam_indices.dim() == 3 && running_beam_indices.size(0) == items &&
                  running_beam_indices.size(1) == beams && running_beam_indices.scalar_type() == at::kInt,
              "beam_top_k_continuations: the running beam indices must be int32 (", items, ", ", beams,
              ", width), got ", running_beam_indices.scalar_type(), " ", running_beam_indices.sizes());
  TORCH_CHECK(cur_len >= 0 && cur_len < running_sequences.size(2), "beam_top_k_continuations: cur_len ", cur_len,
              " is outside the sequences' ", running_sequences.size(2), " positions");
  TORCH_CHECK(beam_index_column >= 0 && beam_index_column < running_beam_indices.size(2),
              "beam_top_k_continuations: beam_index_column ", beam_index_column, " is outside the beam indices' ",
              running_beam_indices.size(2), " columns");
  const auto sequences_in = running_sequences.contiguous();
  const auto beam_indices_in = running_beam_indices.contiguous();
  const int64_t width = sequences_in.size(2), index_width = beam_indices_in.size(2);
  auto sequences = at::empty({items, k, width}, sequences_in.options());
  auto beam_indices = at::empty({items, k, index_width}, beam_indices_in.options());
  const int64_t* candidate = candidates.data_ptr<int64_t>();
  const int64_t* sequence_rows = sequences_in.data_ptr<int64_t>();
  const int32_t* index_rows = beam_indices_in.data_ptr<int32_t>();
  int64_t* sequence_out = sequences.data_ptr<int64_t>();
  int32_t* index_out = beam_indices.data_ptr<int32_t>();
  for (int64_t item = 0; item < items; ++item) {
    for (int64_t j = 0; j < k; ++j) {
      const int64_t chosen = candidate[item * k + j], beam = chosen / vocab, row = item * beams + beam;
      int64_t* sequence = sequence_out + (item * k + j) * width;
      std::memcpy(sequence, sequence_rows + row * width, width * sizeof(int64_t));
      sequence[cur_len] = chosen % vocab;
      int32_t* indices = index_out + (item * k + j) * index_width;
      std::memcpy(indices, index_rows + row * index_width, index_width * sizeof(int32_t));
      indices[beam_index_column] = static_cast<int32_t>(row);
    }
  }
  return {scores, sequences, beam_indices};
}
