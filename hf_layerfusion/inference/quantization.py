"""The int8 inference copy of a model (`prepare_for_inference(model, "int8")`), which `fast_generate` and the
translation helpers run: int8 linear layers, faster on CPU, not token-exact."""

from __future__ import annotations

import copy
import functools
import os
import shutil
import sys
import warnings
import weakref
from pathlib import Path

import torch
from torch import nn

QUANTIZATIONS = (None, "int8")
KERNEL_SOURCE = ("kernels", "int8_linear.cpp")  # beside this file
# no fused multiply-add: the kernel's float arithmetic is `int8_linear_reference`'s, bit for bit
KERNEL_CFLAGS = ["-O3", "-fno-math-errno", "-ffp-contract=off"]


MINIMUM_SPAN = 1e-30  # the kernel's kMinimumSpan: an all-zero row gets finite scales


def int8_linear_reference(
    hidden_states: torch.Tensor,
    weight_t: torch.Tensor,
    column_sums: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """`Int8Linear`'s arithmetic in torch operations (what runs where the compiled kernel cannot be built, and
    what it computes): each row quantized to int8 with its own scale and zero point, its range [min(x, 0), max(x, 0)]
    mapped onto [-128, 127] (round half to even), an exact int32 product with the int8 weights `weight_t` `(in, out)`
    corrected by zero point x the weights' `column_sums`, dequantized by row scale x weight scale, plus the bias."""
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
    return output.view(*hidden_states.shape[:-1], weight_t.shape[1])


@functools.cache
def compiled_int8_kernel():
    """The C++ kernel of `Int8Linear` (kernels/int8_linear.cpp), compiled for this machine at first use (about
    20 s, then cached by torch in its extensions folder, `TORCH_EXTENSIONS_DIR`), or None, after a warning that
    names the reason, where it cannot be built (no C++ compiler or ninja; the Hub code, which does not carry the C++
    source): int8 layers then run `int8_linear_reference`, the same numbers, slower."""
    fallback = "int8 layers compute the same numbers with torch operations, slower"
    source = Path(__file__).parent.joinpath(*KERNEL_SOURCE)
    if not source.is_file():
        warnings.warn(
            f"hf_layerfusion: the int8 kernel's source {source} is not there (this code runs outside the "
            f"installed package, e.g. as a model's Hub code); {fallback}. `pip install hf_layerfusion` for the kernel.",
            stacklevel=2,
        )
        return None
    # the `ninja` wheel installs its binary next to the interpreter, which is not on PATH when the environment is not
    # activated; torch looks for it on PATH
    interpreter_bin = os.path.dirname(sys.executable)
    if shutil.which("ninja") is None and shutil.which("ninja", path=interpreter_bin) is not None:
        os.environ["PATH"] = os.pathsep.join([interpreter_bin, os.environ.get("PATH", "")])
    try:
        from torch.utils.cpp_extension import load

        return load(name="hf_layerfusion_int8_linear", sources=[str(source)], extra_cflags=KERNEL_CFLAGS)
    except Exception as error:  # a missing compiler or ninja shows as OSError, RuntimeError or CalledProcessError
        warnings.warn(
            f"hf_layerfusion: the int8 kernel {source.name} could not be compiled ({type(error).__name__}: "
            f"{str(error).strip()[:500]}); {fallback}. It needs a C++ compiler and ninja (`pip install ninja`).",
            stacklevel=2,
        )
        return None


class Int8Linear(nn.Module):
    """A linear layer with int8 weights (symmetric, one scale per output feature) and int8 activations quantized on
    the fly with one scale and zero point per row (token): asymmetric, so that one-signed rows (after a ReLU) use all
    256 codes, and per row, so that a row with large activations (an outlier token, or another sentence of the batch)
    does not coarsen the other rows' resolution and a row's output does not depend on the rest of its batch. Products
    are summed exactly in int32, on the CPU's AMX tiles where it has them (weights packed into tiles here, once), else
    by `torch._int_mm` (oneDNN's VNNI kernels): the same numbers either way. Quantization, product and dequantization
    with the bias are one call of the compiled kernel (`compiled_int8_kernel`): as separate torch operations the
    per-row quantization cost more than the product itself at decoding sizes."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        weight = weight.detach().float()
        self.weight_scale = weight.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
        self.weight_t = torch.round(weight / self.weight_scale[:, None]).to(torch.int8).t().contiguous()
        self.column_sums = self.weight_t.sum(dim=0, dtype=torch.int32)  # the zero points' share of the sums
        self.bias = None if bias is None else bias.detach().float().contiguous()
        kernel = compiled_int8_kernel()
        # empty where the CPU has no AMX: the kernel then runs `torch._int_mm`
        self.weight_tiles = self.weight_t.new_empty(0) if kernel is None else kernel.pack_amx_tiles(self.weight_t)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        kernel = compiled_int8_kernel()
        inputs = hidden_states.float()
        if kernel is None:
            output = int8_linear_reference(inputs, self.weight_t, self.column_sums, self.weight_scale, self.bias)
        else:
            output = kernel.int8_linear(
                inputs, self.weight_t, self.weight_tiles, self.column_sums, self.weight_scale, self.bias
            )
        return output.to(hidden_states.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def int8_copy(model):
    """An inference copy of `model` whose every `nn.Linear` of the encoder-decoder, and the output projection
    (`project`, with Marian's `final_logits_bias`), is an `Int8Linear`; every other tensor (embeddings, LayerNorms,
    fusion weights) is shared with `model`, not copied."""
    shared = {id(tensor): tensor for tensor in [*model.parameters(), *model.buffers()]}
    engine = copy.deepcopy(model, memo=shared).eval()
    for module in list(engine.model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, Int8Linear(child.weight, child.bias))
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
