"""The int8 inference copy of a model (`prepare_for_inference(model, "int8")`), which `fast_generate` and the
translation helpers run: int8 linear layers, faster on CPU, not token-exact."""

from __future__ import annotations

import copy
import warnings
import weakref

import torch
from torch import nn

QUANTIZATIONS = (None, "int8")


class Int8Linear(nn.Module):
    """A linear layer with int8 weights (symmetric, one scale per output feature) and int8 activations quantized on
    the fly, through torch's dynamically quantized linear kernel (`quantized::linear_dynamic`).

    That kernel quantizes its whole input with one scale. Each row (token) is therefore first divided by its largest
    magnitude, so that every row spans about [-1, 1] and is quantized with its own resolution (the result is
    multiplied back and the bias added in float): one row with large activations (an outlier token, or another
    sentence of the batch) would otherwise coarsen every other row's quantization, which measurably cost BLEU. The
    weights are packed for oneDNN where torch has it (int8 AMX/VNNI matrix multiplication accumulating in int32, so
    the activations keep all 8 bits), else for torch's current quantized engine (fbgemm accumulates pairs in int16
    and needs 7-bit activations, `reduce_range`)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        weight = weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
        with warnings.catch_warnings():  # torch 2.13 flags quantized tensors as deprecated (they still work)
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(
                weight, scales.double(), torch.zeros_like(scales, dtype=torch.int64), axis=0, dtype=torch.qint8
            )
        engines = torch.backends.quantized.supported_engines
        engine = "onednn" if "onednn" in engines else torch.backends.quantized.engine
        previous = torch.backends.quantized.engine
        torch.backends.quantized.engine = engine
        try:
            self.packed = torch.ops.quantized.linear_prepack(qweight, None)
        finally:
            torch.backends.quantized.engine = previous
        self.reduce_range = engine != "onednn"
        self.bias = None if bias is None else bias.detach().float()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        row_scale = hidden_states.abs().amax(dim=-1, keepdim=True).clamp_min_(torch.finfo(hidden_states.dtype).tiny)
        output = torch.ops.quantized.linear_dynamic(hidden_states / row_scale, self.packed, self.reduce_range)
        return output.mul_(row_scale) if self.bias is None else torch.addcmul(self.bias, output, row_scale)

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
