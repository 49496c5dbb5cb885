// The rest of a beam-search step after the choice of candidates (`beam_top_k_continuations`), in one call: what
// transformers' `_beam_search` computes per step with `_get_running_beams_for_next_iteration`,
// `_update_finished_beams`, `_check_early_stop_heuristic` and `_beam_search_has_unfinished_sequences` (about forty
// torch operations per step on tensors of a few hundred numbers; study/fast_cpu_translation_log.md measures them), plus
// the end-token test and which items can no longer change.
//
// Numbers: every score is the helpers' float32 arithmetic in their order (the penalties of -1e9 added one by one, the
// length penalty a float32 division by `(float) pow(length, length_penalty)`, as torch divides by a Python float), so
// the scores are theirs bit for bit. The helpers' `torch.topk` leaves the order of equal scores unspecified; here they
// rank by position, lowest first (the finished beams before the new candidates, as concatenated).
#include "cpu_kernels.h"

#include <ATen/ops/empty.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr float kPenalty = -1.0e9f;  // the helpers' -1.0e9

// the positions of the `count` largest of `scores[0, n)`, best first, ties lowest position first (n is a few beams);
// `taken`: n flags of scratch
void top_positions(const float* scores, int64_t n, int64_t count, int64_t* out, uint8_t* taken) {
  std::fill(taken, taken + n, uint8_t{0});
  for (int64_t j = 0; j < count; ++j) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (taken[i]) continue;
      // NaN ranks above everything, as in torch.topk
      if (best < 0 || (std::isnan(scores[i]) && !std::isnan(scores[best])) || scores[i] > scores[best]) best = i;
    }
    taken[best] = 1;
    out[j] = best;
  }
}

void check_beam_tensor(const at::Tensor& tensor, const char* name, c10::ScalarType type, int64_t items,
                       int64_t beams, int64_t dims) {
  TORCH_CHECK(tensor.dim() == dims && tensor.size(0) == items && tensor.size(1) == beams &&
                  tensor.scalar_type() == type && tensor.device().is_cpu() && tensor.is_contiguous(),
              "beam_finish_step: ", name, " must be contiguous ", type, " CPU (", items, ", ", beams,
              dims == 3 ? ", width" : "", "), got ", tensor.scalar_type(), " ", tensor.sizes(),
              tensor.is_contiguous() ? "" : " (not contiguous)");
}

}  // namespace

std::tuple<at::Tensor, at::Tensor, bool> beam_finish_step(
    const at::Tensor& topk_log_probs, const at::Tensor& topk_sequences, const at::Tensor& topk_beam_indices,
    const at::Tensor& running_sequences, const at::Tensor& running_beam_scores,
    const at::Tensor& running_beam_indices, const at::Tensor& sequences, const at::Tensor& beam_scores,
    const at::Tensor& beam_indices, const at::Tensor& is_sent_finished, const at::Tensor& improvable,
    const c10::optional<at::Tensor>& eos_tokens, int64_t cur_len, int64_t decoder_prompt_len, int64_t max_length,
    double length_penalty, int64_t early_stopping) {
  const int64_t items = running_beam_scores.size(0), beams = running_beam_scores.size(1), k = topk_log_probs.size(1);
  TORCH_CHECK(running_beam_scores.dim() == 2 && beams > 0 && k >= beams,
              "beam_finish_step: the running beam scores must be (items, beams) and the candidates (items, k >= "
              "beams), got ", running_beam_scores.sizes(), " and ", topk_log_probs.sizes());
  TORCH_CHECK(early_stopping >= 0 && early_stopping <= 2,
              "beam_finish_step: early_stopping must be 0 (False), 1 (True) or 2 (\"never\"), got ", early_stopping);
  check_beam_tensor(topk_log_probs, "the candidates' scores", at::kFloat, items, k, 2);
  check_beam_tensor(topk_sequences, "the candidates' sequences", at::kLong, items, k, 3);
  check_beam_tensor(topk_beam_indices, "the candidates' beam indices", at::kInt, items, k, 3);
  check_beam_tensor(running_sequences, "the running sequences", at::kLong, items, beams, 3);
  check_beam_tensor(running_beam_scores, "the running beam scores", at::kFloat, items, beams, 2);
  check_beam_tensor(running_beam_indices, "the running beam indices", at::kInt, items, beams, 3);
  check_beam_tensor(sequences, "the finished sequences", at::kLong, items, beams, 3);
  check_beam_tensor(beam_scores, "the finished scores", at::kFloat, items, beams, 2);
  check_beam_tensor(beam_indices, "the finished beam indices", at::kInt, items, beams, 3);
  check_beam_tensor(is_sent_finished, "is_sent_finished", at::kBool, items, beams, 2);
  check_beam_tensor(improvable, "the early-stop heuristic's state", at::kBool, items, 1, 2);
  const int64_t width = sequences.size(2), index_width = beam_indices.size(2);
  TORCH_CHECK(topk_sequences.size(2) == width && running_sequences.size(2) == width &&
                  topk_beam_indices.size(2) == index_width && running_beam_indices.size(2) == index_width,
              "beam_finish_step: the sequences must all be ", width, " wide and the beam indices ", index_width);
  const int64_t index_column = cur_len - decoder_prompt_len;
  TORCH_CHECK(cur_len >= 0 && cur_len < width && index_column >= 0 && index_column < index_width,
              "beam_finish_step: cur_len ", cur_len, " (decoder prompt ", decoder_prompt_len,
              ") is outside the sequences' ", width, " positions or the beam indices' ", index_width, " columns");
  std::vector<int64_t> eos;
  if (eos_tokens.has_value()) {
    const auto tokens = eos_tokens->to(at::kLong).contiguous().view({-1});
    eos.assign(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + tokens.numel());
  }

  const float* topk_scores = topk_log_probs.data_ptr<float>();
  const int64_t* topk_rows = topk_sequences.data_ptr<int64_t>();
  const int32_t* topk_index_rows = topk_beam_indices.data_ptr<int32_t>();
  int64_t* running_rows = running_sequences.data_ptr<int64_t>();
  float* running_scores = running_beam_scores.data_ptr<float>();
  int32_t* running_index_rows = running_beam_indices.data_ptr<int32_t>();
  int64_t* finished_rows = sequences.data_ptr<int64_t>();
  float* finished_scores = beam_scores.data_ptr<float>();
  int32_t* finished_index_rows = beam_indices.data_ptr<int32_t>();
  bool* finished = is_sent_finished.data_ptr<bool>();
  bool* can_improve = improvable.data_ptr<bool>();

  auto next_rows = at::empty({items * beams}, running_beam_indices.options());
  auto frozen = at::empty({items}, is_sent_finished.options());
  int32_t* next_row = next_rows.data_ptr<int32_t>();
  bool* frozen_items = frozen.data_ptr<bool>();

  // `(cur_len + 1 - decoder_prompt_len) ** length_penalty` and the heuristic's length, as Python computes them
  // (doubles), divided by as float32 scalars
  const float finished_length = static_cast<float>(std::pow(static_cast<double>(cur_len + 1 - decoder_prompt_len),
                                                            length_penalty));
  const int64_t hypothetical_length = early_stopping == 2 && length_penalty > 0.0 ? max_length - decoder_prompt_len
                                                                                  : cur_len + 1 - decoder_prompt_len;
  const float best_length = static_cast<float>(std::pow(static_cast<double>(hypothetical_length), length_penalty));
  const bool all_hit_max_length = cur_len + 1 >= max_length;

  std::vector<uint8_t> hits(k), taken(beams + k);
  std::vector<float> candidate_scores(k), merged_scores(beams + k);
  std::vector<int64_t> chosen(beams), merged_chosen(beams);
  std::vector<int64_t> old_rows(beams * width);
  std::vector<int32_t> old_index_rows(beams * index_width);
  std::vector<float> old_scores(beams);
  std::vector<uint8_t> old_finished(beams);
  bool any_improvable = false, all_finished = true, all_hit = true;

  for (int64_t item = 0; item < items; ++item) {
    const float* scores = topk_scores + item * k;
    for (int64_t j = 0; j < k; ++j) {
      bool hit = all_hit_max_length;
      if (!hit) {
        const int64_t token = topk_rows[(item * k + j) * width + cur_len];
        for (int64_t end_token : eos) hit = hit || token == end_token;
      }
      hits[j] = hit;
      all_hit = all_hit && hit;
    }

    // _get_running_beams_for_next_iteration: the best `beams` candidates that did not hit a stopping criterion
    for (int64_t j = 0; j < k; ++j) candidate_scores[j] = scores[j] + (hits[j] ? kPenalty : -0.0f);
    top_positions(candidate_scores.data(), k, beams, chosen.data(), taken.data());
    for (int64_t b = 0; b < beams; ++b) {
      const int64_t from = item * k + chosen[b], to = item * beams + b;
      std::memcpy(running_rows + to * width, topk_rows + from * width, width * sizeof(int64_t));
      std::memcpy(running_index_rows + to * index_width, topk_index_rows + from * index_width,
                  index_width * sizeof(int32_t));
      running_scores[to] = candidate_scores[chosen[b]];
      next_row[to] = running_index_rows[to * index_width + index_column];
    }

    // _update_finished_beams: the item's best `beams` of its finished beams and the candidates among its first
    // `beams` that just finished (scored with the length penalty)
    bool item_full = true;
    for (int64_t b = 0; b < beams; ++b) item_full = item_full && finished[item * beams + b];
    const float full_penalty = item_full && early_stopping == 1 ? kPenalty : -0.0f;
    const float frozen_penalty = can_improve[item] ? -0.0f : kPenalty;
    for (int64_t b = 0; b < beams; ++b) merged_scores[b] = finished_scores[item * beams + b];
    for (int64_t j = 0; j < k; ++j) {
      const bool just_finished = hits[j] && j < beams;
      float score = scores[j] / finished_length;
      score = score + full_penalty;
      score = score + frozen_penalty;
      score = score + (just_finished ? -0.0f : kPenalty);
      merged_scores[beams + j] = score;
    }
    top_positions(merged_scores.data(), beams + k, beams, merged_chosen.data(), taken.data());
    std::memcpy(old_rows.data(), finished_rows + item * beams * width, beams * width * sizeof(int64_t));
    std::memcpy(old_index_rows.data(), finished_index_rows + item * beams * index_width,
                beams * index_width * sizeof(int32_t));
    for (int64_t b = 0; b < beams; ++b) {
      old_scores[b] = finished_scores[item * beams + b];
      old_finished[b] = finished[item * beams + b];
    }
    for (int64_t b = 0; b < beams; ++b) {
      const int64_t from = merged_chosen[b], to = item * beams + b;
      if (from < beams) {
        std::memcpy(finished_rows + to * width, old_rows.data() + from * width, width * sizeof(int64_t));
        std::memcpy(finished_index_rows + to * index_width, old_index_rows.data() + from * index_width,
                    index_width * sizeof(int32_t));
        finished[to] = old_finished[from];
      } else {
        const int64_t j = from - beams;
        std::memcpy(finished_rows + to * width, topk_rows + (item * k + j) * width, width * sizeof(int64_t));
        std::memcpy(finished_index_rows + to * index_width, topk_index_rows + (item * k + j) * index_width,
                    index_width * sizeof(int32_t));
        finished[to] = hits[j] && j < beams;
      }
      finished_scores[to] = merged_scores[from];
    }

    // _check_early_stop_heuristic (at cur_len + 1): can the best running beam still beat the worst finished one?
    const float best_possible = running_scores[item * beams] / best_length;
    float worst_finished = finished_scores[item * beams];
    for (int64_t b = 1; b < beams; ++b) worst_finished = std::fmin(worst_finished, finished_scores[item * beams + b]);
    // torch.min propagates NaN
    for (int64_t b = 0; b < beams; ++b) {
      if (std::isnan(finished_scores[item * beams + b])) worst_finished = NAN;
    }
    bool beats_one = false;
    bool now_full = true;
    for (int64_t b = 0; b < beams; ++b) {
      const float worst = finished[item * beams + b] ? worst_finished : kPenalty;
      beats_one = beats_one || best_possible > worst;
      now_full = now_full && finished[item * beams + b];
    }
    can_improve[item] = can_improve[item] && beats_one;
    any_improvable = any_improvable || can_improve[item];
    all_finished = all_finished && now_full;
    // an item whose finished beams can no longer change: every candidate it could add scores -1e9 or less
    frozen_items[item] = !can_improve[item] || (early_stopping == 1 && now_full);
  }
  // _beam_search_has_unfinished_sequences
  const bool unfinished = any_improvable && !(all_finished && early_stopping == 1) && !all_hit;
  return {next_rows, frozen, unfinished};
}
