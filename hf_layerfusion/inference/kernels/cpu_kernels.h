// The functions of the `hf_layerfusion.inference` CPU kernels, bound to Python in bindings.cpp.
#pragma once
// ATen's tensor only: each source includes the operators it calls (<ATen/ops/*.h>). <torch/extension.h> (the C++
// frontend, every operator and pybind11) took ~20 s of compiling per source, most of the first build's minutes; only
// bindings.cpp includes the Python bindings' headers
#include <ATen/core/Tensor.h>

#include <map>
#include <string>
#include <tuple>
#include <vector>

namespace pybind11 {
class tuple;  // KernelLinear's pickled state, defined with the bindings (bindings.cpp)
}  // namespace pybind11

#include "instruction_sets.h"

int64_t parallel_for_threads(int64_t tasks, int64_t rounds, int64_t failing_task, int64_t chunk_microseconds);
// A linear layer's output of `rows` x `columns` floats: `out` viewed as (rows, columns) where given (`caller` names
// the function in the error for an `out` that is not a contiguous float32 CPU tensor of that many elements, or that
// overlaps `input`), else a new tensor like `input`'s
at::Tensor linear_output(const c10::optional<at::Tensor>& out, int64_t rows, int64_t columns,
                            const at::Tensor& input, const char* caller);
bool amx_available();
std::vector<std::string> int8_products(int64_t code_bits);
std::map<std::string, double> onednn_vnni_timings();
std::string int8_product(int64_t code_bits);
int64_t int8_code_bits();
at::Tensor pack_int8_weights(const at::Tensor& weight_t, int64_t code_bits, const std::string& product = "");
// Products of fewer rows than this run VNNI's kernels on a CPU with AMX (on the same packed weights): a tile computes
// 16 rows whatever the call's, and the tiles' sums pass through memory before they are dequantized
// (study/fast_cpu_translation_log.md measures the crossover, benchmarks/probe_amx_rows.py)
constexpr int64_t kAmxMinimumRows = 8;
// Products of fewer rows than this run VNNI's kernels where the product is oneDNN's (on the VNNI panels the layout
// keeps beside the weights oneDNN reads): below it a call's fixed cost in oneDNN outweighs its faster product
// (study/fast_cpu_translation_log.md measures the crossover)
constexpr int64_t kOneDnnMinimumRows = 24;
at::Tensor int8_linear(const at::Tensor& x, const at::Tensor& weight_t, const at::Tensor& packed_weights,
                          const at::Tensor& column_sums, const at::Tensor& weight_scale,
                          const c10::optional<at::Tensor>& bias, bool relu, int64_t code_bits,
                          int64_t amx_minimum_rows = kAmxMinimumRows, const std::string& product = "",
                          int64_t onednn_minimum_rows = kOneDnnMinimumRows,
                          const c10::optional<at::Tensor>& out = c10::nullopt);
bool float32_linear_available();
// float32_linear's weight layout: panels of 16 output features (one AVX-512 register, two AVX2 ones), two per pass,
// zero past out_features (inference_copies.py's PANEL_COLUMNS)
constexpr int64_t kFloat32PanelColumns = 16;
constexpr int64_t kFloat32PassColumns = 2 * kFloat32PanelColumns;
at::Tensor float32_linear(const at::Tensor& x, const at::Tensor& panels, int64_t out_features,
                             const c10::optional<at::Tensor>& bias, bool relu,
                             const c10::optional<at::Tensor>& out = c10::nullopt);
at::Tensor decode_attention(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                               const c10::optional<at::Tensor>& mask, double scaling,
                               const c10::optional<at::Tensor>& key_rows,
                               const c10::optional<at::Tensor>& buffer_rows);
at::Tensor mixture_log_probs(const at::Tensor& group_logits, const at::Tensor& psi);
at::Tensor add_layer_norm(const at::Tensor& x, const c10::optional<at::Tensor>& y, const at::Tensor& weight,
                             const at::Tensor& bias, double eps);

// A linear layer of the inference copies as the kernels run it, made once by `Float32Linear` or `Int8Linear`
// (inference_copies.py: their `kernel_linear`) from their weights: float32 panels (`float32_linear`) or int8 weights
// (`int8_linear`), with the bias and an optional ReLU after the product. A call passes only its input, and the decoding
// steps below take either kind, so the float32 and the int8 copy share them.
class KernelLinear {
 public:
  static KernelLinear float32(const at::Tensor& panels, int64_t out_features, const c10::optional<at::Tensor>& bias,
                              bool relu);
  static KernelLinear int8(const at::Tensor& weight_t, const at::Tensor& packed_weights,
                           const at::Tensor& column_sums, const at::Tensor& weight_scale,
                           const c10::optional<at::Tensor>& bias, bool relu, int64_t code_bits,
                           const std::string& product = "");
  // One layer computing `linears`' outputs side by side, each output exactly as its own layer does (every output
  // feature's product and dequantization is its own), from one quantization of the input and one call; all of one
  // kind (float32, or int8 of one format) and with the same ReLU
  static KernelLinear concatenate(const std::vector<KernelLinear>& linears);
  // `out`: where to write the output (a contiguous float32 tensor of its shape); None: a new tensor
  at::Tensor operator()(const at::Tensor& x, const c10::optional<at::Tensor>& out = c10::nullopt) const;
  int64_t out_features() const { return out_features_; }
  bool relu() const { return relu_; }
  int64_t code_bits() const { return code_bits_; }  // 0: float32
  const std::string& product() const { return product_; }  // int8: `product_`
  // the factory's name and arguments and back: pickling's state, which `copy.deepcopy` of an inference copy uses
  pybind11::tuple state() const;
  static KernelLinear from_state(const pybind11::tuple& state);

 private:
  KernelLinear() = default;
  at::Tensor weights_;                     // float32: panels (panels, in, 16); int8: weight_t (in, out)
  at::Tensor packed_weights_, column_sums_, weight_scale_;  // int8 only
  c10::optional<at::Tensor> bias_;
  int64_t out_features_ = 0;
  bool relu_ = false;
  int64_t code_bits_ = 0;
  // int8: the product whose layout `packed_weights_` holds, named at every call, so that a call after the instruction
  // set cap was lowered below it is refused by name instead of reading the layout as another product's
  std::string product_;
};

at::Tensor self_attention_step(const at::Tensor& h, const at::Tensor& norm_weight,
                                  const at::Tensor& norm_bias, double eps, bool normalize_before,
                                  const KernelLinear& qkv_proj, const KernelLinear& out_proj,
                                  const at::Tensor& key_buffer,
                                  const at::Tensor& value_buffer, int64_t position, int64_t prefix,
                                  const c10::optional<at::Tensor>& prefix_mask, double scaling,
                                  const c10::optional<at::Tensor>& key_rows);
at::Tensor cross_attention_step(const at::Tensor& h, const at::Tensor& norm_weight,
                                   const at::Tensor& norm_bias, double eps, bool normalize_before,
                                   const KernelLinear& q_proj, const KernelLinear& out_proj, const at::Tensor& keys,
                                   const at::Tensor& values, const c10::optional<at::Tensor>& mask,
                                   double scaling, const c10::optional<at::Tensor>& memory_rows);
at::Tensor feed_forward_step(const at::Tensor& h, const at::Tensor& norm_weight, const at::Tensor& norm_bias,
                                double eps, bool normalize_before, const KernelLinear& fc1, const KernelLinear& fc2);
// The decoder's layers at one decoding step in one call (decoding_step.cpp; `CompiledDecoderLayers` in
// inference_copies.py): the sub-layer steps above, added in the stack's order with `end_layer` after each layer's last
class DecoderLayerSteps {
 public:
  void add_self_attention(const at::Tensor& norm_weight, const at::Tensor& norm_bias, double eps,
                          bool normalize_before, const KernelLinear& qkv_proj, const KernelLinear& out_proj,
                          int64_t slot, double scaling);
  void add_cross_attention(const at::Tensor& norm_weight, const at::Tensor& norm_bias, double eps,
                           bool normalize_before, const KernelLinear& q_proj, const KernelLinear& out_proj,
                           int64_t slot, double scaling);
  void add_feed_forward(const at::Tensor& norm_weight, const at::Tensor& norm_bias, double eps,
                        bool normalize_before, const KernelLinear& fc1, const KernelLinear& fc2);
  void end_layer();
  std::vector<at::Tensor> operator()(const at::Tensor& h, const std::vector<at::Tensor>& keys,
                                        const std::vector<at::Tensor>& values, const std::vector<int64_t>& lengths,
                                        const std::vector<int64_t>& prefixes,
                                        const std::vector<at::Tensor>& cross_keys,
                                        const std::vector<at::Tensor>& cross_values,
                                        const c10::optional<at::Tensor>& memory_mask,
                                        const c10::optional<at::Tensor>& key_rows,
                                        const c10::optional<at::Tensor>& memory_rows) const;
  int64_t layers() const { return static_cast<int64_t>(layer_ends_.size()); }

 private:
  enum class Form { self_attention, cross_attention, feed_forward };
  struct SublayerStep {
    Form form;
    at::Tensor norm_weight, norm_bias;
    double eps;
    bool normalize_before;
    KernelLinear first, second;  // qkv_proj and out_proj, q_proj and out_proj, or fc1 and fc2
    int64_t slot;                // the attention's cache slot (-1: a feed-forward)
    double scaling;
  };
  std::vector<SublayerStep> steps_;
  std::vector<int64_t> layer_ends_;  // one past each layer's last step
  int64_t self_slots_ = 0, cross_slots_ = 0;
};

at::Tensor first_argmax(const at::Tensor& scores);
std::tuple<at::Tensor, int64_t> greedy_choice(const at::Tensor& scores, const at::Tensor& finished,
                                                 const at::Tensor& sequences,
                                                 const c10::optional<at::Tensor>& rows, int64_t position,
                                                 const c10::optional<int64_t>& pad_token,
                                                 const c10::optional<at::Tensor>& eos_tokens);
std::tuple<at::Tensor, at::Tensor> beam_top_k(const at::Tensor& log_probs, const at::Tensor& beam_scores,
                                                     int64_t k);
std::tuple<at::Tensor, at::Tensor, at::Tensor> beam_top_k_continuations(
    const at::Tensor& log_probs, const at::Tensor& beam_scores, int64_t k, const at::Tensor& running_sequences,
    const at::Tensor& running_beam_indices, int64_t cur_len, int64_t beam_index_column);
std::tuple<at::Tensor, at::Tensor, bool> beam_finish_step(
    const at::Tensor& topk_log_probs, const at::Tensor& topk_sequences, const at::Tensor& topk_beam_indices,
    const at::Tensor& running_sequences, const at::Tensor& running_beam_scores,
    const at::Tensor& running_beam_indices, const at::Tensor& sequences, const at::Tensor& beam_scores,
    const at::Tensor& beam_indices, const at::Tensor& is_sent_finished, const at::Tensor& improvable,
    const c10::optional<at::Tensor>& eos_tokens, int64_t cur_len, int64_t decoder_prompt_len, int64_t max_length,
    double length_penalty, int64_t early_stopping);
void move_rows(const std::vector<at::Tensor>& buffers, const at::Tensor& targets, const at::Tensor& sources);
