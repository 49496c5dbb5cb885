// A decoding step of one standard residual sub-layer of an inference copy in one call, for `KernelResidualSublayer.run`
// (`hf_layerfusion.inference.inference_copies`): what `ResidualSublayer.run` computes around the backbone's
// `MultiHeadAttention` (`s`), `CrossAttention` (`c`) or ReLU `FeedForward` (`f`) whose linear layers are
// `KernelLinear`s (float32 in the float32 copy, int8 in the int8 copy), at a step of the fast decoding loop. It calls
// the same kernels on the same views in the same order as the Python path (`float32_linear` or `int8_linear`,
// `decode_attention`, `add_layer_norm`, torch's `add`), so its numbers are that path's bit for bit; what it saves is
// the Python around them (module calls, views, the cache write, the attention interface's checks), about as long as
// the kernels themselves at d_model 256. Self-attention's q, k and v projections are one call of their concatenation
// (`KernelLinear::concatenate`: each output feature computed as by its own layer, the input quantized once).
//
// Residual block (`ResidualSublayer`): post-norm LayerNorm(h + f(h)), pre-norm h + f(LayerNorm(h)).
#include "cpu_kernels.h"
#include "parallel.h"

#include <ATen/TensorOperators.h>
#include <ATen/ops/ones.h>

#include <algorithm>
#include <cstring>
#include <string>

namespace {

struct ResidualNorm {
  const at::Tensor& weight;
  const at::Tensor& bias;
  double eps;
  bool normalize_before;

  at::Tensor enter(const at::Tensor& h) const {
    return normalize_before ? add_layer_norm(h, c10::nullopt, weight, bias, eps) : h;
  }
  at::Tensor exit(const at::Tensor& h, const at::Tensor& output) const {
    return normalize_before ? h + output : add_layer_norm(output, h, weight, bias, eps);
  }
};

void check_step_input(const at::Tensor& h, const char* name) {
  TORCH_CHECK(h.dim() == 3 && h.size(1) == 1 && h.scalar_type() == at::kFloat && h.device().is_cpu(),
              name, ": the input must be a float32 CPU tensor (rows, 1, d_model), got ", h.scalar_type(), " ",
              h.sizes(), " on ", h.device());
}

// A projection's output width and that no ReLU follows it, as the sub-layer needs them (its input width is checked by
// the product)
void check_projection(const KernelLinear& linear, int64_t out_features, const char* step, const char* name) {
  TORCH_CHECK(linear.out_features() == out_features && !linear.relu(), step, ": ", name, " must have ", out_features,
              " output features and no ReLU, got ", linear.out_features(), linear.relu() ? " and a ReLU" : "");
}

// buffer[:rows, position] = qkv[:, 0, offset : offset + d_model] (as (heads, head_dim)), one row at a time: torch's
// strided `copy_` took 50 µs for 128 rows of 256 floats, several times these row copies
void write_position(const at::Tensor& buffer, int64_t position, const at::Tensor& qkv, int64_t offset) {
  const int64_t rows = qkv.size(0), width = buffer.size(2) * buffer.size(3);
  if (!(buffer.stride(3) == 1 && buffer.stride(2) == buffer.size(3) && qkv.stride(2) == 1)) {  // not row blocks
    buffer.narrow(0, 0, rows).select(1, position).copy_(
        qkv.narrow(2, offset, width).view({rows, buffer.size(2), buffer.size(3)}));
    return;
  }
  float* target = buffer.data_ptr<float>() + position * buffer.stride(1);
  const float* source = qkv.data_ptr<float>() + offset;
  for (int64_t row = 0; row < rows; ++row)
    std::memcpy(target + row * buffer.stride(0), source + row * qkv.stride(0), width * sizeof(float));
}

}  // namespace

// `s`: keys/values of this position written at `position` of the cache buffers (rows, capacity, heads, head_dim),
// then attention over positions [0, position]; the first `prefix` positions are keys/values given once per input
// (layer-wise coordination's source part), masked by `prefix_mask` (bool (rows or 1, 1, 1, prefix), true = attend;
// None: all attended) and the rest attended, the mask `mixed_attention_mask` builds; `qkv_proj` is q_proj, k_proj and
// v_proj concatenated; `key_rows` (rows, >= position + 1): the buffer row holding each row's keys/values at each
// position (`decode_attention`), None: the row itself
at::Tensor self_attention_step(const at::Tensor& h, const at::Tensor& norm_weight,
                                  const at::Tensor& norm_bias, double eps, bool normalize_before,
                                  const KernelLinear& qkv_proj, const KernelLinear& out_proj,
                                  const at::Tensor& key_buffer, const at::Tensor& value_buffer,
                                  int64_t position, int64_t prefix,
                                  const c10::optional<at::Tensor>& prefix_mask, double scaling,
                                  const c10::optional<at::Tensor>& key_rows) {
  check_step_input(h, "self_attention_step");
  const int64_t rows = h.size(0), d_model = h.size(2);
  check_projection(qkv_proj, 3 * d_model, "self_attention_step", "qkv_proj");
  check_projection(out_proj, d_model, "self_attention_step", "out_proj");
  // through key_rows, a row's earlier positions may lie in buffer rows past `rows` (beams that left the batch)
  const bool buffer_rows_fit = key_rows.has_value() ? key_buffer.size(0) >= rows : key_buffer.size(0) == rows;
  TORCH_CHECK(key_buffer.dim() == 4 && key_buffer.sizes() == value_buffer.sizes() && buffer_rows_fit &&
                  key_buffer.size(2) * key_buffer.size(3) == d_model &&
                  key_buffer.scalar_type() == at::kFloat && value_buffer.scalar_type() == at::kFloat,
              "self_attention_step: the cache buffers must be float32 (", rows, ", capacity, heads, head_dim) with "
              "heads x head_dim = ", d_model, ", got ", key_buffer.scalar_type(), " ", key_buffer.sizes(), " and ",
              value_buffer.scalar_type(), " ", value_buffer.sizes());
  TORCH_CHECK(prefix >= 0 && position >= prefix && position < key_buffer.size(1), "self_attention_step: position ",
              position, " is outside the cache's ", key_buffer.size(1), " positions after a prefix of ", prefix);
  c10::optional<at::Tensor> mask;
  if (prefix > 0) {
    mask = at::ones({rows, 1, 1, position + 1}, h.options().dtype(at::kBool));
    if (prefix_mask.has_value()) {
      TORCH_CHECK(prefix_mask->dim() == 4 && prefix_mask->scalar_type() == at::kBool &&
                      prefix_mask->size(3) == prefix,
                  "self_attention_step: the prefix mask must be bool (rows or 1, 1, 1, ", prefix, "), got ",
                  prefix_mask->scalar_type(), " ", prefix_mask->sizes());
      mask->narrow(3, 0, prefix).copy_(prefix_mask->expand({rows, 1, 1, prefix}));
    }
  }
  const int64_t heads = key_buffer.size(2), head_dim = key_buffer.size(3);
  const ResidualNorm norm{norm_weight, norm_bias, eps, normalize_before};
  const auto x = norm.enter(h);
  const auto qkv = qkv_proj(x);  // (rows, 1, 3 d_model): q, k, v side by side
  write_position(key_buffer, position, qkv, d_model);
  write_position(value_buffer, position, qkv, 2 * d_model);
  const auto query = qkv.narrow(2, 0, d_model).view({rows, 1, heads, head_dim}).transpose(1, 2);
  const auto attention = decode_attention(query, key_buffer.narrow(1, 0, position + 1).transpose(1, 2),
                                          value_buffer.narrow(1, 0, position + 1).transpose(1, 2), mask, scaling,
                                          key_rows.has_value() ? c10::optional<at::Tensor>(key_rows->narrow(1, 0, position + 1))
                                                               : c10::nullopt,
                                          c10::nullopt);
  return norm.exit(h, out_proj(attention.view({rows, 1, d_model})));
}

// `c`: attention over the cross-attention keys/values (buffer rows, heads, source, head_dim) computed at the first
// step; `memory_rows` (key rows,): the buffer row of keys, values and mask that each key row reads (rows that left the
// batch leave theirs behind), None: key row r reads buffer row r; with fewer key rows than rows, each key row serves
// `rows / key rows` consecutive rows (a sentence's beams), folded into query positions as
// `MultiHeadAttention.attend_to` does
at::Tensor cross_attention_step(const at::Tensor& h, const at::Tensor& norm_weight,
                                   const at::Tensor& norm_bias, double eps, bool normalize_before,
                                   const KernelLinear& q_proj, const KernelLinear& out_proj, const at::Tensor& keys,
                                   const at::Tensor& values, const c10::optional<at::Tensor>& mask,
                                   double scaling, const c10::optional<at::Tensor>& memory_rows) {
  check_step_input(h, "cross_attention_step");
  const int64_t rows = h.size(0), d_model = h.size(2);
  check_projection(q_proj, d_model, "cross_attention_step", "q_proj");
  check_projection(out_proj, d_model, "cross_attention_step", "out_proj");
  const int64_t key_rows = memory_rows.has_value() ? memory_rows->size(0) : keys.size(0);
  TORCH_CHECK(keys.dim() == 4 && key_rows > 0 && rows % key_rows == 0 && keys.size(1) * keys.size(3) == d_model,
              "cross_attention_step: ", rows, " rows need keys (key rows dividing them, heads, source, head_dim) with "
              "heads x head_dim = ", d_model, ", got ", keys.sizes(),
              memory_rows.has_value() ? " read through memory_rows of " + std::to_string(key_rows) + " key rows" : "");
  const int64_t groups = rows / key_rows, heads = keys.size(1), head_dim = keys.size(3);
  const ResidualNorm norm{norm_weight, norm_bias, eps, normalize_before};
  auto query = q_proj(norm.enter(h)).view({rows, 1, heads, head_dim}).transpose(1, 2);
  if (groups > 1) {  // (rows, heads, 1, d) -> (key rows, heads, groups, d)
    query = query.reshape({key_rows, groups, heads, 1, head_dim}).transpose(1, 2).reshape({key_rows, heads, groups, head_dim});
  }
  // (key rows, groups, heads, d)
  const auto attention = decode_attention(query, keys, values, mask, scaling, c10::nullopt, memory_rows);
  return norm.exit(h, out_proj(attention.reshape({rows, 1, d_model})));
}

// `f`: fc2(ReLU(fc1(x))), the ReLU folded into fc1's call as in the copies' `FeedForward`
at::Tensor feed_forward_step(const at::Tensor& h, const at::Tensor& norm_weight, const at::Tensor& norm_bias,
                                double eps, bool normalize_before, const KernelLinear& fc1, const KernelLinear& fc2) {
  check_step_input(h, "feed_forward_step");
  TORCH_CHECK(fc1.relu(), "feed_forward_step: fc1 must have the ReLU folded in, got fc1 without one");
  check_projection(fc2, h.size(2), "feed_forward_step", "fc2");
  const ResidualNorm norm{norm_weight, norm_bias, eps, normalize_before};
  return norm.exit(h, fc2(fc1(norm.enter(h))));
}

// ---------------------------------------------------------------------------------------------- the layers in one call
// `DecoderLayerSteps`: the sub-layer steps above, added once in the stack's order, then each decoding step of every
// layer in one call: the same kernels on the same views in the same order as calling the steps one by one from Python
// (the numbers bit for bit), without the Python between them (the layer and block modules, the cache lookups), which
// at d_model 256 cost about as much per step as a one-row step's kernels.
void DecoderLayerSteps::add_self_attention(const at::Tensor& norm_weight, const at::Tensor& norm_bias, double eps,
                                           bool normalize_before, const KernelLinear& qkv_proj,
                                           const KernelLinear& out_proj, int64_t slot, double scaling) {
  TORCH_CHECK(slot >= 0, "DecoderLayerSteps: a self-attention slot must be >= 0, got ", slot);
  steps_.push_back({Form::self_attention, norm_weight, norm_bias, eps, normalize_before, qkv_proj, out_proj, slot,
                    scaling});
  self_slots_ = std::max(self_slots_, slot + 1);
}

void DecoderLayerSteps::add_cross_attention(const at::Tensor& norm_weight, const at::Tensor& norm_bias,
                                            double eps, bool normalize_before, const KernelLinear& q_proj,
                                            const KernelLinear& out_proj, int64_t slot, double scaling) {
  TORCH_CHECK(slot >= 0, "DecoderLayerSteps: a cross-attention slot must be >= 0, got ", slot);
  steps_.push_back({Form::cross_attention, norm_weight, norm_bias, eps, normalize_before, q_proj, out_proj, slot,
                    scaling});
  cross_slots_ = std::max(cross_slots_, slot + 1);
}

void DecoderLayerSteps::add_feed_forward(const at::Tensor& norm_weight, const at::Tensor& norm_bias, double eps,
                                         bool normalize_before, const KernelLinear& fc1, const KernelLinear& fc2) {
  steps_.push_back({Form::feed_forward, norm_weight, norm_bias, eps, normalize_before, fc1, fc2, -1, 0.0});
}

void DecoderLayerSteps::end_layer() {
  TORCH_CHECK(!steps_.empty() && (layer_ends_.empty() || layer_ends_.back() < static_cast<int64_t>(steps_.size())),
              "DecoderLayerSteps: a layer must have at least one sub-layer step");
  layer_ends_.push_back(static_cast<int64_t>(steps_.size()));
}

// `keys`, `values`, `lengths`, `prefixes`: each self-attention slot's cache buffers, filled length (the position this
// step writes) and prefix; `cross_keys`, `cross_values`: each cross-attention slot's keys/values; `memory_mask`: the
// cross-attention mask, also the prefix mask of slots with a prefix (as `KernelResidualSublayer.run_decoding_step`
// passes them); `key_rows`: every self-attention slot's buffer row of each row's position (`self_attention_step`);
// `memory_rows`: every cross-attention slot's (and the memory mask's) buffer row of each key row
// (`cross_attention_step`); slots with a prefix read their prefix mask, the memory mask row by row, through it too.
// Returns each layer's output.
std::vector<at::Tensor> DecoderLayerSteps::operator()(const at::Tensor& h, const std::vector<at::Tensor>& keys,
                                                         const std::vector<at::Tensor>& values,
                                                         const std::vector<int64_t>& lengths,
                                                         const std::vector<int64_t>& prefixes,
                                                         const std::vector<at::Tensor>& cross_keys,
                                                         const std::vector<at::Tensor>& cross_values,
                                                         const c10::optional<at::Tensor>& memory_mask,
                                                         const c10::optional<at::Tensor>& key_rows,
                                                         const c10::optional<at::Tensor>& memory_rows) const {
  TORCH_CHECK(!layer_ends_.empty() && layer_ends_.back() == static_cast<int64_t>(steps_.size()),
              "DecoderLayerSteps: end the last layer (end_layer) before stepping");
  const auto self_slots = static_cast<size_t>(self_slots_), cross_slots = static_cast<size_t>(cross_slots_);
  TORCH_CHECK(keys.size() == self_slots && values.size() == self_slots && lengths.size() == self_slots &&
                  prefixes.size() == self_slots,
              "DecoderLayerSteps: expected keys, values, lengths and prefixes of ", self_slots,
              " self-attention slots, got ", keys.size(), ", ", values.size(), ", ", lengths.size(), " and ",
              prefixes.size());
  TORCH_CHECK(cross_keys.size() == cross_slots && cross_values.size() == cross_slots,
              "DecoderLayerSteps: expected keys and values of ", cross_slots, " cross-attention slots, got ",
              cross_keys.size(), " and ", cross_values.size());
  // the prefix mask of each row: the memory mask's buffer row that its key row reads (a few bytes per row, once per
  // call), instead of the memory, its mask and the keys/values copied into the rows kept when rows leave the batch
  c10::optional<at::Tensor> prefix_mask = memory_mask;
  const bool any_prefix = std::any_of(prefixes.begin(), prefixes.end(), [](int64_t p) { return p > 0; });
  if (any_prefix && memory_rows.has_value() && memory_mask.has_value() && memory_mask->size(0) > 1) {
    const int64_t rows = h.size(0), key_rows = memory_rows->size(0);
    TORCH_CHECK(key_rows > 0 && rows % key_rows == 0, "DecoderLayerSteps: ", rows, " rows need memory_rows of a ",
                "number of key rows dividing them, got ", key_rows);
    prefix_mask = memory_mask->index_select(0, *memory_rows).repeat_interleave(rows / key_rows, 0);
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(layer_ends_.size());
  at::Tensor state = h;
  size_t layer = 0;
  for (size_t index = 0; index < steps_.size(); ++index) {
    const SublayerStep& step = steps_[index];
    switch (step.form) {
      case Form::self_attention: {
        const auto slot = static_cast<size_t>(step.slot);
        state = self_attention_step(state, step.norm_weight, step.norm_bias, step.eps, step.normalize_before,
                                    step.first, step.second, keys[slot], values[slot], lengths[slot], prefixes[slot],
                                    prefixes[slot] > 0 ? prefix_mask : c10::nullopt, step.scaling, key_rows);
        break;
      }
      case Form::cross_attention: {
        const auto slot = static_cast<size_t>(step.slot);
        state = cross_attention_step(state, step.norm_weight, step.norm_bias, step.eps, step.normalize_before,
                                     step.first, step.second, cross_keys[slot], cross_values[slot], memory_mask,
                                     step.scaling, memory_rows);
        break;
      }
      case Form::feed_forward:
        state = feed_forward_step(state, step.norm_weight, step.norm_bias, step.eps, step.normalize_before,
                                  step.first, step.second);
        break;
    }
    if (static_cast<int64_t>(index) + 1 == layer_ends_[layer]) {
      outputs.push_back(state);
      ++layer;
    }
  }
  return outputs;
}
