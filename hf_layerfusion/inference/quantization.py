"""The int8 inference copy of a model (`prepare_for_inference(model, "int8")`), which `fast_generate` and the
translation helpers run: int8 linear layers, faster on CPU, not token-exact."""

from __future__ import annotations

import copy
import weakref

import torch
from torch import nn

from ..modeling.layers import FeedForward
from .cpu_kernels import compiled_kernels
from .decoding_attention import register_decoding_attention

QUANTIZATIONS = (None, "int8")


MINIMUM_SPAN = 1e-30  # the kernel's kMinimumSpan: an all-zero row gets finite scales


def int8_linear_reference(
    hidden_states: torch.Tensor,
    weight_t: torch.Tensor,
    column_sums: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    relu: bool = False,
) -> torch.Tensor:
    """`Int8Linear`'s arithmetic in torch operations (what runs where the compiled kernel cannot be built, and
    what it computes): each row quantized to int8 with its own scale and zero point, its range [min(x, 0), max(x, 0)]
    mapped onto [-128, 127] (round half to even), an exact int32 product with the int8 weights `weight_t` `(in, out)`
    corrected by zero point x the weights' `column_sums`, dequantized by row scale x weight scale, plus the bias (then
    max(., 0) with `relu`)."""
    rows = hidden_states.reshape(-1, weight_t.shape[0])
    low = rows.amin(dim=-1, keepdim=True).clamp_max(0)
    high = rows.amax(dim=-1, keepdim=True).clamp_min(0)
    span = (high - low).clamp_min(MINIMUM_SPAN)
    inverse = 255 / span
    zero = torch.round(-low * inverse) - 128
    codes = torch.clamp(torch.round(rows * inverse) + zero, -128, 127).to(torch.int8)
    sums = torch._int_mm(codes, weight_t) - zero.to(torch.int32) * column_sums
    output = sums.float() * ((span / 255) * weight_scale)
    if bias is not None:
        output = output + bias
    if relu:
        output = output.clamp_min(0)
    return output.view(*hidden_states.shape[:-1], weight_t.shape[1])


class Int8Linear(nn.Module):
    """A linear layer with int8 weights (symmetric, one scale per output feature) and int8 activations quantized on
    the fly with one scale and zero point per row (token): asymmetric, so that one-signed rows (after a ReLU) use all
    256 codes, and per row, so that a row with large activations (an outlier token, or another sentence of the batch)
    does not coarsen the other rows' resolution and a row's output does not depend on the rest of its batch. Products
    are summed exactly in int32, on the CPU's AMX tiles where it has them (weights packed into tiles here, once), else
    by `torch._int_mm` (oneDNN's VNNI kernels): the same numbers either way. Quantization, product and dequantization
    with the bias are one call of the compiled kernel (`compiled_kernels`): as separate torch operations the
    per-row quantization cost more than the product itself at decoding sizes. With `relu=True` the layer is followed
    by a ReLU, folded into the same call (`int8_copy` folds the feed-forward activation)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool = False):
        super().__init__()
        if not isinstance(relu, bool):
            raise TypeError(f"Int8Linear: relu must be a bool, got {relu!r}.")
        self.in_features, self.out_features, self.relu = weight.shape[1], weight.shape[0], relu
        weight = weight.detach().float()
        self.weight_scale = weight.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
        self.weight_t = torch.round(weight / self.weight_scale[:, None]).to(torch.int8).t().contiguous()
        self.column_sums = self.weight_t.sum(dim=0, dtype=torch.int32)  # the zero points' share of the sums
        self.bias = None if bias is None else bias.detach().float().contiguous()
        kernel = compiled_kernels()
        # empty where the CPU has no AMX: the kernel then runs `torch._int_mm`
        self.weight_tiles = self.weight_t.new_empty(0) if kernel is None else kernel.pack_amx_tiles(self.weight_t)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        kernel = compiled_kernels()
        inputs = hidden_states.float()
        if kernel is None:
            output = int8_linear_reference(
                inputs, self.weight_t, self.column_sums, self.weight_scale, self.bias, self.relu
            )
        else:
            output = kernel.int8_linear(
                inputs, self.weight_t, self.weight_tiles, self.column_sums, self.weight_scale, self.bias, self.relu
            )
        return output.to(hidden_states.dtype)

    def extra_repr(self) -> str:
        relu = ", relu=True" if self.relu else ""
        return f"in_features={self.in_features}, out_features={self.out_features}{relu}"


def int8_copy(model):
    """An inference copy of `model` whose every `nn.Linear` of the encoder-decoder, and the output projection
    (`project`, with Marian's `final_logits_bias`), is an `Int8Linear` (a feed-forward ReLU folded into the first
    one), and whose attention is `DECODING_ATTENTION` (the `decode_attention` kernel at decoding steps, SDPA
    elsewhere); every other tensor (embeddings, LayerNorms, fusion weights) is shared with `model`, not copied."""
    shared = {id(tensor): tensor for tensor in [*model.parameters(), *model.buffers()]}
    engine = copy.deepcopy(model, memo=shared).eval()
    for module in list(engine.model.modules()):
        if type(module).forward is FeedForward.forward and type(module.activation_fn) is nn.ReLU:
            # act(fc1(x)) with act = ReLU: folded into fc1's kernel call
            module.fc1, module.activation_fn = Int8Linear(module.fc1.weight, module.fc1.bias, relu=True), nn.Identity()
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, Int8Linear(child.weight, child.bias))
    engine.set_attn_implementation(register_decoding_attention())
    engine.int8_output_projection = Int8Linear(engine.lm_head.weight, engine.final_logits_bias[0])
    # `output_head` reads the logits through `project`: the copy's own projection replaces the float one
    engine.__dict__["project"] = engine.int8_output_projection
    return engine


_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def weights_fingerprint(model) -> tuple | None:
    """Where every weight lives and how often it was changed in place (None if unknown): a prepared copy is rebuilt
    when the model's weights changed after it was made (training, `load_state_dict`)."""
    try:
        return tuple((tensor.data_ptr(), tensor._version) for tensor in [*model.parameters(), *model.buffers()])
    except RuntimeError:  # inference tensors keep no version counter
        return None


def prepare_for_inference(model, quantization: str | None = None):
    """The model `fast_generate` runs: `model` itself for `quantization=None` (float, token-exact), or for
    `quantization="int8"` its int8 copy (`int8_copy`, made once and kept while `model` and its weights are
    unchanged). int8 changes the numbers, hence possibly tokens: its BLEU cost is measured in the README."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"Unknown quantization {quantization!r}; choose one of {QUANTIZATIONS}.")
    if quantization is None:
        return model
    if any(parameter.device.type != "cpu" for parameter in model.parameters()):
        raise ValueError(f"quantization={quantization!r} runs on the CPU; move the model there (`model.to('cpu')`).")
    fingerprint = weights_fingerprint(model)
    cached = _prepared.get(model, {}).get(quantization)
    if cached is not None and fingerprint is not None and cached[0] == fingerprint:
        return cached[1]
    engine = int8_copy(model)
    _prepared.setdefault(model, {})[quantization] = (fingerprint, engine)
    return engine
