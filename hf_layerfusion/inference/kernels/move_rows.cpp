// Beam search's cache reorder: row `targets[i]` of every buffer takes the contents of row `sources[i]`, all read
// before any is written, what `buffer.index_copy_(0, targets, buffer.index_select(0, sources))` does for each
// self-attention key/value buffer at each step. torch's pair copies every moved row twice (into a new tensor and back)
// and costs two operator calls per buffer; here one call moves the rows of all buffers, each row once: a row is
// written only after every move that reads it has read it, and a cycle of moves (beams 0 and 1 trading places) keeps
// one of its rows in a scratch row first.
#include "cpu_kernels.h"

#include "parallel.h"

#include <cstring>
#include <vector>

namespace {

// one copy of a move plan: row `source` (or scratch row `source` where `from_scratch`) into row `target` (or into
// scratch row `target` where `to_scratch`)
struct Copy {
  int64_t target, source;
  bool from_scratch, to_scratch;
};

// the copies that carry out the moves `targets[i] <- sources[i]` (distinct targets) in place, and how many scratch
// rows they use
std::vector<Copy> plan_moves(const int64_t* targets, const int64_t* sources, int64_t moves, int64_t rows,
                             int64_t* scratch_rows) {
  std::vector<int64_t> readers(rows, 0);   // moves not yet done that read each row
  std::vector<int64_t> scratch_of(rows, -1);  // the scratch row holding a row's old contents, once saved
  std::vector<int64_t> move_of(rows, -1);  // the move writing each row
  std::vector<int64_t> pending;
  for (int64_t i = 0; i < moves; ++i) {
    if (targets[i] == sources[i]) continue;
    ++readers[sources[i]];
    move_of[targets[i]] = i;
    pending.push_back(i);
  }
  std::vector<Copy> plan;
  std::vector<int64_t> ready;
  std::vector<char> done(moves, 0);
  for (int64_t i : pending)
    if (readers[targets[i]] == 0) ready.push_back(i);
  int64_t remaining = static_cast<int64_t>(pending.size());
  size_t next_pending = 0;
  *scratch_rows = 0;
  while (remaining > 0) {
    if (ready.empty()) {
      // only cycles are left: save one of their rows, so that its move can be done
      while (done[pending[next_pending]]) ++next_pending;
      const int64_t i = pending[next_pending];
      const int64_t row = targets[i];
      scratch_of[row] = (*scratch_rows)++;
      plan.push_back({scratch_of[row], row, false, true});
      readers[row] = 0;
      ready.push_back(i);
    }
    const int64_t i = ready.back();
    ready.pop_back();
    const int64_t source = sources[i];
    const bool from_scratch = scratch_of[source] >= 0;
    plan.push_back({targets[i], from_scratch ? scratch_of[source] : source, from_scratch, false});
    done[i] = 1;
    --remaining;
    // the source's last reader done: the move that writes it may run (unless it was saved, when it ran already or is
    // ready)
    if (--readers[source] == 0 && !from_scratch && move_of[source] >= 0 && !done[move_of[source]])
      ready.push_back(move_of[source]);
  }
  return plan;
}

}  // namespace

void move_rows(const std::vector<at::Tensor>& buffers, const at::Tensor& targets, const at::Tensor& sources) {
  const auto is_index = [](const at::Tensor& index) {
    return index.dim() == 1 && index.device().is_cpu() &&
           (index.scalar_type() == at::kLong || index.scalar_type() == at::kInt);
  };
  TORCH_CHECK(is_index(targets) && is_index(sources) && targets.size(0) == sources.size(0),
              "move_rows: targets and sources must be int64 or int32 CPU vectors of one length, got ",
              targets.scalar_type(), " ", targets.sizes(), " on ", targets.device(), " and ", sources.scalar_type(), " ",
              sources.sizes(), " on ", sources.device());
  if (buffers.empty() || targets.size(0) == 0) return;
  const int64_t rows = buffers[0].size(0);
  for (size_t b = 0; b < buffers.size(); ++b) {
    const auto& buffer = buffers[b];
    TORCH_CHECK(buffer.device().is_cpu() && buffer.dim() >= 1 && buffer.size(0) == rows,
                "move_rows: every buffer must be a CPU tensor of ", rows, " rows (the first one's), buffer ", b,
                " has sizes ", buffer.sizes(), " on ", buffer.device());
    TORCH_CHECK(rows == 0 || buffer.select(0, 0).is_contiguous(),
                "move_rows: each row of a buffer must be contiguous, buffer ", b, " has strides ", buffer.strides());
  }
  const auto target_index = targets.to(at::kLong).contiguous(), source_index = sources.to(at::kLong).contiguous();
  const int64_t* target_data = target_index.data_ptr<int64_t>();
  const int64_t* source_data = source_index.data_ptr<int64_t>();
  const int64_t moves = targets.size(0);
  std::vector<char> written(rows, 0);
  for (int64_t i = 0; i < moves; ++i) {
    TORCH_CHECK(target_data[i] >= 0 && target_data[i] < rows && source_data[i] >= 0 && source_data[i] < rows,
                "move_rows: move ", i, " (row ", source_data[i], " into row ", target_data[i], ") is outside the ",
                rows, " rows");
    TORCH_CHECK(!written[target_data[i]], "move_rows: row ", target_data[i], " is the target of two moves");
    written[target_data[i]] = 1;
  }
  int64_t scratch_rows = 0;
  const std::vector<Copy> plan = plan_moves(target_data, source_data, moves, rows, &scratch_rows);
  hlf::parallel_for(0, static_cast<int64_t>(buffers.size()), 1, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const auto& buffer = buffers[b];
      const size_t row_bytes = static_cast<size_t>(buffer.numel() / rows) * buffer.element_size();
      const int64_t row_stride = buffer.stride(0) * buffer.element_size();
      char* data = static_cast<char*>(buffer.data_ptr());
      std::vector<char> scratch(static_cast<size_t>(scratch_rows) * row_bytes);
      for (const Copy& copy : plan) {
        const char* from = copy.from_scratch ? scratch.data() + copy.source * row_bytes : data + copy.source * row_stride;
        char* to = copy.to_scratch ? scratch.data() + copy.target * row_bytes : data + copy.target * row_stride;
        std::memcpy(to, from, row_bytes);
      }
    }
  });
}
