// The functions of the `hf_layerfusion.inference` CPU kernels, bound to Python in bindings.cpp.
#pragma once
#include <torch/extension.h>

bool amx_available();
torch::Tensor pack_amx_tiles(const torch::Tensor& weight_t);
torch::Tensor int8_linear(const torch::Tensor& x, const torch::Tensor& weight_t, const torch::Tensor& weight_tiles,
                          const torch::Tensor& column_sums, const torch::Tensor& weight_scale,
                          const c10::optional<torch::Tensor>& bias, bool relu);
bool float32_linear_available();
torch::Tensor float32_linear(const torch::Tensor& x, const torch::Tensor& panels, int64_t out_features,
                             const c10::optional<torch::Tensor>& bias, bool relu);
torch::Tensor decode_attention(const torch::Tensor& query, const torch::Tensor& key, const torch::Tensor& value,
                               const c10::optional<torch::Tensor>& mask, double scaling);
torch::Tensor mixture_log_probs(const torch::Tensor& group_logits, const torch::Tensor& psi);
torch::Tensor add_layer_norm(const torch::Tensor& x, const c10::optional<torch::Tensor>& y, const torch::Tensor& weight,
                             const torch::Tensor& bias, double eps);
