// `KernelLinear` (cpu_kernels.h): a linear layer of the inference copies, made once from its weights, called with its
// input only.
#include "cpu_kernels.h"

#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>

namespace {

// The kernels' own checks of the weights, run once on one zero row, so that a KernelLinear that was made can be called
template <typename Linear>
Linear checked(Linear linear, int64_t in_features) {
  linear(at::zeros({1, in_features}, at::kFloat));
  return linear;
}

}  // namespace

KernelLinear KernelLinear::float32(const at::Tensor& panels, int64_t out_features,
                                   const c10::optional<at::Tensor>& bias, bool relu) {
  TORCH_CHECK(panels.dim() == 3, "KernelLinear.float32: panels must be (panels, in_features, 16), got ", panels.sizes());
  KernelLinear linear;
  linear.weights_ = panels;
  linear.bias_ = bias;
  linear.out_features_ = out_features;
  linear.relu_ = relu;
  return checked(linear, panels.size(1));
}

KernelLinear KernelLinear::int8(const at::Tensor& weight_t, const at::Tensor& packed_weights,
                                const at::Tensor& column_sums, const at::Tensor& weight_scale,
                                const c10::optional<at::Tensor>& bias, bool relu, int64_t code_bits,
                                const std::string& product) {
  TORCH_CHECK(weight_t.dim() == 2, "KernelLinear.int8: weight_t must be (in_features, out_features), got ",
              weight_t.sizes());
  KernelLinear linear;
  linear.weights_ = weight_t;
  linear.packed_weights_ = packed_weights;
  linear.column_sums_ = column_sums;
  linear.weight_scale_ = weight_scale;
  linear.bias_ = bias;
  linear.out_features_ = weight_t.size(1);
  linear.relu_ = relu;
  linear.code_bits_ = code_bits;
  // packed weights are in the layout of `product`, by default this CPU's fastest for the format (as
  // `pack_int8_weights` packs them by default); without any, the float32 blocks
  linear.product_ = packed_weights.numel() == 0 ? "float32_blocks"
                    : product.empty()           ? int8_products(code_bits).front()
                                                : product;
  return checked(linear, weight_t.size(0));
}

KernelLinear KernelLinear::concatenate(const std::vector<KernelLinear>& linears) {
  TORCH_CHECK(!linears.empty(), "KernelLinear.concatenate: no layers given");
  const KernelLinear& first = linears.front();
  for (const auto& linear : linears)
    TORCH_CHECK(linear.code_bits_ == first.code_bits_ && linear.relu_ == first.relu_ &&
                    linear.bias_.has_value() == first.bias_.has_value() &&
                    linear.weights_.size(first.code_bits_ == 0 ? 1 : 0) ==
                        first.weights_.size(first.code_bits_ == 0 ? 1 : 0),
                "KernelLinear.concatenate: the layers differ in kind (code bits ", first.code_bits_, " and ",
                linear.code_bits_, "), ReLU, bias or input features");
  std::vector<at::Tensor> weights, biases;
  for (const auto& linear : linears) {
    if (linear.bias_.has_value()) biases.push_back(*linear.bias_);
  }
  const c10::optional<at::Tensor> bias =
      biases.empty() ? c10::nullopt : c10::optional<at::Tensor>(at::cat(biases));
  if (first.code_bits_ == 0) {
    // each layer's (out, in) weights back from its panels (panels, in, 16), the zero padding cut, then repacked
    for (const auto& linear : linears) {
      const auto& panels = linear.weights_;
      weights.push_back(panels.transpose(1, 2).reshape({-1, panels.size(1)}).narrow(0, 0, linear.out_features_));
    }
    const auto weight = at::cat(weights);
    const int64_t out_features = weight.size(0), in_features = weight.size(1);
    const int64_t padded = (out_features + kFloat32PassColumns - 1) / kFloat32PassColumns * kFloat32PassColumns;
    auto panels = at::zeros({padded, in_features}, weight.options());
    panels.narrow(0, 0, out_features).copy_(weight);
    panels = panels.view({padded / kFloat32PanelColumns, kFloat32PanelColumns, in_features}).transpose(1, 2).contiguous();
    return float32(panels, out_features, bias, first.relu_);
  }
  std::vector<at::Tensor> column_sums, weight_scales;
  for (const auto& linear : linears) {
    weights.push_back(linear.weights_);
    column_sums.push_back(linear.column_sums_);
    weight_scales.push_back(linear.weight_scale_);
  }
  const auto weight_t = at::cat(weights, 1);
  // packed for this CPU's product where the layers are (none where it has none)
  const auto packed = first.packed_weights_.numel() > 0 ? pack_int8_weights(weight_t, first.code_bits_, first.product_)
                                                        : first.packed_weights_;
  return int8(weight_t, packed, at::cat(column_sums), at::cat(weight_scales), bias, first.relu_,
              first.code_bits_, first.product_);
}

at::Tensor linear_output(const c10::optional<at::Tensor>& out, int64_t rows, int64_t columns,
                            const at::Tensor& input, const char* caller) {
  if (!out.has_value()) return at::empty({rows, columns}, input.options());
  TORCH_CHECK(out->scalar_type() == at::kFloat && out->device().is_cpu() && out->is_contiguous() &&
                  out->numel() == rows * columns,
              caller, ": out must be a contiguous float32 CPU tensor of ", rows, " x ", columns, " elements, got ",
              out->scalar_type(), " ", out->sizes(), out->is_contiguous() ? "" : " (not contiguous)");
  const auto* first = static_cast<const char*>(out->data_ptr());
  const auto* input_first = static_cast<const char*>(input.data_ptr());
  TORCH_CHECK(first + out->nbytes() <= input_first || input_first + input.nbytes() <= first,
              caller, ": out overlaps the input (the output is written while the input is read)");
  return out->view({rows, columns});
}

at::Tensor KernelLinear::operator()(const at::Tensor& x, const c10::optional<at::Tensor>& out) const {
  return code_bits_ == 0 ? float32_linear(x, weights_, out_features_, bias_, relu_, out)
                         : int8_linear(x, weights_, packed_weights_, column_sums_, weight_scale_, bias_, relu_,
                                       code_bits_, kAmxMinimumRows, product_, kOneDnnMinimumRows, out);
}
