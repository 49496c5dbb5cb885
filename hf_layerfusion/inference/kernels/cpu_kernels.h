// The functions of the `hf_layerfusion.inference` CPU kernels, bound to Python in bindings.cpp.
#pragma once
#include <torch/extension.h>

int64_t parallel_for_threads(int64_t tasks);
bool amx_available();
std::string int8_product(int64_t code_bits);
int64_t int8_code_bits();
torch::Tensor pack_int8_weights(const torch::Tensor& weight_t, int64_t code_bits);
torch::Tensor int8_linear(const torch::Tensor& x, const torch::Tensor& weight_t, const torch::Tensor& packed_weights,
                          const torch::Tensor& column_sums, const torch::Tensor& weight_scale,
                          const c10::optional<torch::Tensor>& bias, bool relu, int64_t code_bits);
bool float32_linear_available();
torch::Tensor float32_linear(const torch::Tensor& x, const torch::Tensor& panels, int64_t out_features,
                             const c10::optional<torch::Tensor>& bias, bool relu);
torch::Tensor decode_attention(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                               const c10::optional<torch::Tensor>& mask, double scaling);
torch::Tensor mixture_log_probs(const torch::Tensor& group_logits, const torch::Tensor& psi);
torch::Tensor add_layer_norm(const torch::Tensor& x, const c10::optional<torch::Tensor>& y, const torch::Tensor& weight,
                             const torch::Tensor& bias, double eps);
torch::Tensor self_attention_step(const torch::Tensor& h, const torch::Tensor& norm_weight,
                                  const torch::Tensor& norm_bias, double eps, bool normalize_before,
                                  const torch::Tensor& q_panels, const c10::optional<torch::Tensor>& q_bias,
                                  const torch::Tensor& k_panels, const c10::optional<torch::Tensor>& k_bias,
                                  const torch::Tensor& v_panels, const c10::optional<torch::Tensor>& v_bias,
                                  const torch::Tensor& out_panels, const c10::optional<torch::Tensor>& out_bias,
                                  const torch::Tensor& key_buffer, const torch::Tensor& value_buffer,
                                  int64_t position, int64_t prefix,
                                  const c10::optional<torch::Tensor>& prefix_mask, double scaling);
torch::Tensor cross_attention_step(const torch::Tensor& h, const torch::Tensor& norm_weight,
                                   const torch::Tensor& norm_bias, double eps, bool normalize_before,
                                   const torch::Tensor& q_panels, const c10::optional<torch::Tensor>& q_bias,
                                   const torch::Tensor& out_panels, const c10::optional<torch::Tensor>& out_bias,
                                   const torch::Tensor& keys, const torch::Tensor& values,
                                   const c10::optional<torch::Tensor>& mask, double scaling);
torch::Tensor feed_forward_step(const torch::Tensor& h, const torch::Tensor& norm_weight, const torch::Tensor& norm_bias,
                                double eps, bool normalize_before, const torch::Tensor& fc1_panels,
                                int64_t ffn_dim, const c10::optional<torch::Tensor>& fc1_bias,
                                const torch::Tensor& fc2_panels, const c10::optional<torch::Tensor>& fc2_bias);
torch::Tensor first_argmax(const torch::Tensor& scores);
