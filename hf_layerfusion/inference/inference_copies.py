"""The inference copies of a model that `fast_generate` and the translation helpers run on CPU
(`prepare_for_inference`): the float32 copy (`Float32Linear` layers: the same function as the model's, with the sums
in another order) and the int8 copy (`Int8Linear` layers: faster, not token-exact). Both share every other tensor
with the model, attend through the decoding-attention kernel (`decoding_attention.py`), and run their sub-layers'
LayerNorms, the decoding steps their sub-layers declare and the output head's mixture of several groups as compiled
kernels too (`KernelResidualSublayer`, `mixture_kernel`). What a family declares to the copies, and nothing else,
is in `hf_layerfusion.modeling.extension_points`."""

from __future__ import annotations

import copy
import functools
import math
import weakref
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import nn
from transformers.utils import logging

from ..modeling.attention import CrossAttention, MultiHeadAttention
from ..modeling.layers import FeedForward, ResidualSublayer, TransformerLayer
from ..version import REMOTE_MODULE
from .cpu_kernels import compiled_kernels
from .decoding import DecodingCache, thread_scratch
from .decoding_attention import HEAD_DIMS, register_decoding_attention

QUANTIZATIONS = (None, "int8")
inference_copy_logger = logging.get_logger(__name__)
MERGE_ADVICE = (
    "merge adapters into the weights first (PEFT: `model = model.merge_and_unload()`); for layers another library "
    "quantized (`torch.ao.quantization.quantize_dynamic`, ...), give it the float model instead (its own int8 copy: "
    "`quantization=\"int8\"`)"
)
PANEL_COLUMNS = 16  # output features per panel of `Float32Linear` (kernels/float32_linear.cpp: one AVX-512 register)


class Float32Linear(nn.Module):
    """A float32 linear layer for decoding steps, through the compiled kernel `float32_linear`
    (kernels/float32_linear.cpp): the weights packed once into panels of 16 output features, position-major
    `(panels, in_features, 16)`, read as one stream per product, each output one fused multiply-add chain over the
    inputs in order, plus the bias. `F.linear` (MKL) computes the same sums, in blocks for long ones: the two agree to
    float rounding. With `relu=True` a following ReLU is folded into the call. The packed weights are a copy (the
    layer's weight memory once more). Built only where `float32_kernel_available()` (AVX-512, or AVX2 with FMA)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool = False):
        super().__init__()
        if not isinstance(relu, bool):
            raise TypeError(f"Float32Linear: relu must be a bool, got {relu!r}.")
        if not float32_kernel_available():
            raise RuntimeError(
                "Float32Linear needs the compiled float32_linear kernel (AVX-512, or AVX2 with FMA), not available here."
            )
        self.in_features, self.out_features, self.relu = weight.shape[1], weight.shape[0], relu
        # panels in pairs (the kernel's 32 output features per pass), zero past out_features
        padded = -(-self.out_features // (2 * PANEL_COLUMNS)) * 2 * PANEL_COLUMNS
        panels = weight.detach().float().new_zeros(padded, self.in_features)
        panels[: self.out_features] = weight.detach()
        self.panels = panels.view(padded // PANEL_COLUMNS, PANEL_COLUMNS, self.in_features).transpose(1, 2).contiguous()
        self.bias = None if bias is None else bias.detach().float().contiguous()
        # the kernel's arguments bound once (kernels/kernel_linear.cpp): a call passes only its input, and the
        # compiled decoding steps take the layer as it is
        self.kernel_linear = compiled_kernels().KernelLinear.float32(self.panels, self.out_features, self.bias, relu)

    def forward(self, hidden_states: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's output; written into `out` (a contiguous float32 tensor of its shape) where given."""
        return self.kernel_linear(hidden_states, out)

    def extra_repr(self) -> str:
        relu = ", relu=True" if self.relu else ""
        return f"in_features={self.in_features}, out_features={self.out_features}{relu}"


def float32_kernel_available() -> bool:
    """Whether the float32 copy can be made here: the CPU kernels compiled and the CPU has AVX-512, or AVX2 with FMA."""
    kernels = compiled_kernels()
    return kernels is not None and kernels.float32_linear_available()


MINIMUM_SPAN = 1e-30  # the kernel's kMinimumSpan: an all-zero row gets finite scales
# int8 x int8 products summed over at most this many inputs stay below 2^24 in magnitude (1032 x 128 x 127 < 2^24),
# where float32 holds every integer exactly: such a float32 matrix product is the exact integer product
EXACT_FLOAT32_DEPTH = 1024
# The int8 formats, by `code_bits`: the activation codes (lowest, highest) and the largest weight code. 8 bits use
# every int8 code (AMX's and AVX-512 VNNI's products); 7 bits (activation codes [0, 127], weights [-63, 63]) are what
# AVX2's 8-bit multiply-add `vpmaddubsw` sums without saturating (kernels/int8_linear.cpp).
ACTIVATION_CODES = {8: (-128, 127), 7: (0, 127)}
WEIGHT_CODE_MAX = {8: 127, 7: 63}
MAXIMUM_IN_FEATURES = 2**17  # sums of this many products (|each| <= 128 x 127) stay within int32 (the kernel's too)


def check_code_bits(code_bits) -> int:
    if type(code_bits) is not int or code_bits not in ACTIVATION_CODES:
        raise ValueError(f"code_bits must be one of {sorted(ACTIVATION_CODES)}, got {code_bits!r}.")
    return code_bits


def exact_int8_product(codes: torch.Tensor, weight_t: torch.Tensor) -> torch.Tensor:
    """`codes (M, K) @ weight_t (K, N)` of int8 matrices, exactly, as int32: float32 matrix products over blocks of
    `EXACT_FLOAT32_DEPTH` inputs (each exact), summed in int32. What `torch._int_mm` computes, at the speed of a float
    product on every CPU (`torch._int_mm` is far slower than a float product where the CPU has no VNNI:
    study/fast_cpu_translation_log.md)."""
    sums = None
    for start in range(0, codes.shape[1], EXACT_FLOAT32_DEPTH):
        block = slice(start, start + EXACT_FLOAT32_DEPTH)
        product = (codes[:, block].float() @ weight_t[block].float()).to(torch.int32)
        sums = product if sums is None else sums + product
    return sums if sums is not None else codes.new_zeros(codes.shape[0], weight_t.shape[1], dtype=torch.int32)


def int8_linear_reference(
    hidden_states: torch.Tensor,
    weight_t: torch.Tensor,
    column_sums: torch.Tensor,
    weight_scale: torch.Tensor,
    bias: torch.Tensor | None,
    relu: bool = False,
    code_bits: int = 8,
) -> torch.Tensor:
    """`Int8Linear`'s arithmetic in torch operations (what runs where the compiled kernel cannot be built, and
    what it computes): each row quantized with its own scale and zero point, its range [min(x, 0), max(x, 0)] mapped
    onto the activation codes of the `code_bits` format (`ACTIVATION_CODES`; round half to even), an exact int32
    product with the int8 weights `weight_t` `(in, out)` corrected by zero point x the weights' `column_sums`,
    dequantized by row scale x weight scale, plus the bias (then max(., 0) with `relu`)."""
    code_low, code_high = ACTIVATION_CODES[check_code_bits(code_bits)]
    levels = code_high - code_low
    rows = hidden_states.reshape(-1, weight_t.shape[0])
    low = rows.amin(dim=-1, keepdim=True).clamp_max(0)
    high = rows.amax(dim=-1, keepdim=True).clamp_min(0)
    span = (high - low).clamp_min(MINIMUM_SPAN)
    inverse = levels / span
    zero = torch.round(-low * inverse) + code_low
    codes = torch.clamp(torch.round(rows * inverse) + zero, code_low, code_high).to(torch.int8)
    sums = exact_int8_product(codes, weight_t) - zero.to(torch.int32) * column_sums
    output = sums.float() * ((span / levels) * weight_scale)
    if bias is not None:
        output = output + bias
    if relu:
        output = output.clamp_min(0)
    return output.view(*hidden_states.shape[:-1], weight_t.shape[1])


class Int8Linear(nn.Module):
    """A linear layer with int8 weights (symmetric, one scale per output feature) and int8 activations quantized on
    the fly with one scale and zero point per row (token): asymmetric, so that one-signed rows (after a ReLU) use all
    the codes, and per row, so that a row with large activations (an outlier token, or another sentence of the batch)
    does not coarsen the other rows' resolution and a row's output does not depend on the rest of its batch. Products
    are summed exactly in int32. Quantization, product and dequantization with the bias are one call of the compiled
    kernel (`compiled_kernels`): as separate torch operations the per-row quantization cost more than the product
    itself at decoding sizes. With `relu=True` the layer is followed by a ReLU, folded into the same call
    (`kernel_copy` folds the feed-forward activation).

    `code_bits` picks the format (`ACTIVATION_CODES`, `WEIGHT_CODE_MAX`); by default the one this CPU's fastest
    product takes (the kernel's `int8_code_bits()`): 8 bits (activation codes [-128, 127], weights [-127, 127]) on
    AMX tiles, on a CPU with AVX-512 VNNI through oneDNN's s8 x s8 product (`at::_int_mm`; VNNI's `vpdpbusd` kernels
    for products of few rows), where there is no AVX2 (exact float32 block products,
    `exact_int8_product`), or without the compiled kernel; 7 bits (activation codes [0, 127], weights [-63, 63]) on
    AVX2 without either, where the 8-bit multiply-add `vpmaddubsw` sums 7-bit codes without saturating, with twice
    the multiply-adds per instruction of the 16-bit products an exact 8-bit product needs there
    (kernels/int8_linear.cpp). The weights are packed here, once, for this CPU's product (`kernel.int8_product`
    names it). Each format gives the same numbers on every product (`int8_linear_reference` with its `code_bits`);
    the formats' speed and BLEU cost are measured in study/fast_cpu_translation_log.md."""

    def __init__(
        self, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool = False, code_bits: int | None = None
    ):
        super().__init__()
        if not isinstance(relu, bool):
            raise TypeError(f"Int8Linear: relu must be a bool, got {relu!r}.")
        kernel = compiled_kernels()
        if code_bits is None:
            code_bits = 8 if kernel is None else kernel.int8_code_bits()
        self.code_bits = check_code_bits(code_bits)
        self.in_features, self.out_features, self.relu = weight.shape[1], weight.shape[0], relu
        if self.in_features > MAXIMUM_IN_FEATURES:
            raise ValueError(
                f"Int8Linear: {self.in_features} input features; at most {MAXIMUM_IN_FEATURES} keep its int32 sums "
                "exact."
            )
        weight = weight.detach().float()
        largest_code = WEIGHT_CODE_MAX[self.code_bits]
        self.weight_scale = weight.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / largest_code
        self.weight_t = torch.round(weight / self.weight_scale[:, None]).to(torch.int8).t().contiguous()
        self.column_sums = self.weight_t.sum(dim=0, dtype=torch.int32)  # the zero points' share of the sums
        self.bias = None if bias is None else bias.detach().float().contiguous()
        # empty where this CPU has no packed product for the format: the kernel then runs float32 block products
        self.packed_weights = (
            self.weight_t.new_empty(0) if kernel is None else kernel.pack_int8_weights(self.weight_t, self.code_bits)
        )
        # the kernel's arguments bound once (kernels/kernel_linear.cpp), as `Float32Linear` does; None without it
        self.kernel_linear = None if kernel is None else kernel.KernelLinear.int8(
            self.weight_t, self.packed_weights, self.column_sums, self.weight_scale, self.bias, relu, self.code_bits
        )

    def forward(self, hidden_states: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        """The layer's output; written into `out` (a contiguous float32 tensor of its shape, for float32 inputs) where
        given."""
        # (no-op conversions skipped: each costs microseconds, at decoding steps a visible share of a product's call)
        inputs = hidden_states if hidden_states.dtype == torch.float32 else hidden_states.float()
        if out is not None and inputs is not hidden_states:
            raise TypeError(f"Int8Linear: out is given for float32 inputs only, got {hidden_states.dtype} inputs.")
        if self.kernel_linear is not None:
            output = self.kernel_linear(inputs, out)
        else:
            output = int8_linear_reference(
                inputs, self.weight_t, self.column_sums, self.weight_scale, self.bias, self.relu, self.code_bits
            )
            if out is not None:  # the kernel's rule: the output's number of floats, contiguous
                if out.dtype != torch.float32 or not out.is_contiguous() or out.numel() != output.numel():
                    raise ValueError(
                        f"Int8Linear: out must be a contiguous float32 tensor of {output.numel()} elements, got "
                        f"{out.dtype} {tuple(out.shape)}."
                    )
                output = out.view(output.shape).copy_(output)
        return output if output.dtype == hidden_states.dtype else output.to(hidden_states.dtype)

    def extra_repr(self) -> str:
        relu = ", relu=True" if self.relu else ""
        return f"in_features={self.in_features}, out_features={self.out_features}{relu}, code_bits={self.code_bits}"


class DecodingStep(NamedTuple):
    """A sub-layer's compiled decoding step (`KernelResidualSublayer.bind_decoding_step`): its declared form,
    the kernel's arguments bound once (LayerNorm, `KernelLinear` projections), and an attention's cache index and
    scaling. Data, not a closure, so that a deep copy of an inference copy steps with its own tensors."""

    form: str
    arguments: tuple
    layer_idx: int | None = None
    scaling: float | None = None


def compiled_linear(linear: nn.Module) -> bool:
    """Whether `linear` is an inference copy's linear layer that the compiled decoding steps can call: a
    `Float32Linear` or `Int8Linear` (or a subclass that keeps its `forward`, which calls `kernel_linear` as the steps
    do) with a bound kernel."""
    return (
        isinstance(linear, (Float32Linear, Int8Linear))
        and type(linear).forward in (Float32Linear.forward, Int8Linear.forward)
        and linear.kernel_linear is not None
    )


class KernelResidualSublayer(ResidualSublayer):
    """A `ResidualSublayer` of the inference copies whose LayerNorm, with the residual sum before it (post-norm `exit`)
    or alone (pre-norm `enter`), is one call of the compiled `add_layer_norm` kernel (kernels/layer_norm.cpp: torch's
    LayerNorm up to float rounding) on float32 CPU inputs in eval mode without gradients; anything else runs
    `ResidualSublayer`'s own torch operations.

    In both copies, a block around a sub-layer whose class declares its decoding step (`Sublayer.decoding_step()`:
    the backbone's attention, cross-attention and ReLU feed-forward, layer-wise coordination's mixed attention) also
    runs each step of the fast decoding loop (`DecodingCache`) as one compiled call (`bind_decoding_step`,
    kernels/decoding_step.cpp): the same kernels on the same views as its Python path, so the same numbers bit for
    bit, without the Python around them. Other sub-layers run their Python path."""

    def __init__(self, sublayer: ResidualSublayer):  # `sublayer`'s LayerNorm module, its parameters shared
        nn.Module.__init__(self)
        self.layer_norm = norm = sublayer.layer_norm
        self.normalize_before, self.dropout = sublayer.normalize_before, sublayer.dropout
        self.train(sublayer.training)
        # the kernel's arguments, read once (a plain tuple: not registered again as parameters), where it takes this
        # LayerNorm: affine, over one dimension of a multiple of 16 features
        kernel_fits = norm.weight is not None and norm.bias is not None and norm.weight.shape[-1] % 16 == 0
        self.kernel_arguments = (norm.weight, norm.bias, norm.eps) if kernel_fits else None
        self.decoding_step = None  # a `DecodingStep` where bound; see `bind_decoding_step`

    def bind_decoding_step(self, sublayer: nn.Module) -> bool:
        """Run the decoding steps of this block around `sublayer` as one compiled call, where its class declares what
        a step computes (`sublayer.decoding_step()`, hf_layerfusion.modeling.extension_points) and the kernel computes
        exactly that: `Float32Linear` or `Int8Linear` projections with their compiled `kernel_linear` (a
        feed-forward's ReLU folded into its first layer), head_dim a multiple of 16 up to 128, and this block's
        LayerNorm in the kernel. Returns whether it does."""
        form = sublayer.decoding_step()  # declared by the sub-layer's own class, never inherited
        if form is None or compiled_kernels() is None or self.kernel_arguments is None:
            return False
        norm = (*self.kernel_arguments, self.normalize_before)
        if form == "feed_forward":
            if not (type(sublayer.activation_fn) is nn.Identity and sublayer.fc1.relu is True
                    and all(compiled_linear(layer) for layer in (sublayer.fc1, sublayer.fc2))):
                return False  # an activation other than ReLU is not folded into fc1
            self.decoding_step = DecodingStep(form, (*norm, sublayer.fc1.kernel_linear, sublayer.fc2.kernel_linear))
            return True
        projections = {"self": ("q_proj", "k_proj", "v_proj", "out_proj"), "memory": ("q_proj", "out_proj")}[form]
        linears = [getattr(sublayer, name).kernel_linear if compiled_linear(getattr(sublayer, name)) else None
                   for name in projections]
        if sublayer.head_dim not in HEAD_DIMS or None in linears:
            return False
        if form == "self":
            # q, k and v in one call: each output as its own layer computes it (a copy of their weights, once more)
            linears = [type(linears[0]).concatenate(linears[:3]), linears[3]]
        arguments = (*norm, *linears)
        self.decoding_step = DecodingStep(form, arguments, sublayer.layer_idx, sublayer.scaling)
        return True

    def run_decoding_step(self, hidden_states: torch.Tensor, context) -> torch.Tensor | None:
        """The bound `decoding_step`'s kernel call, or None where this step is not one it computes."""
        form, arguments, layer_idx, scaling = self.decoding_step
        kernels = compiled_kernels()
        if form == "feed_forward":
            return kernels.feed_forward_step(hidden_states, *arguments)
        if form == "self":
            slot = context.cache.self_attention_cache.slots.get(layer_idx)
            if slot is None or context.attention_mask is not None or slot.length >= slot.keys.shape[1]:
                return None  # the first step makes the slot; a full slot raises in the Python path
            prefix_mask = context.memory_mask if slot.prefix else None
            if prefix_mask is not None and prefix_mask.dtype != torch.bool:
                return None
            output = kernels.self_attention_step(
                hidden_states, *arguments, slot.keys, slot.values, slot.length, slot.prefix, prefix_mask, scaling,
                context.cache.self_attention_cache.key_rows,
            )
            slot.length += 1
            return output
        cache, mask = context.cache, context.memory_mask
        if not cache.is_updated.get(layer_idx, False) or not (mask is None or mask.dtype == torch.bool):
            return None  # the first step computes the keys/values
        layer = cache.cross_attention_cache.layers[layer_idx]
        return kernels.cross_attention_step(hidden_states, *arguments, layer.keys, layer.values, mask, scaling)

    def run(self, kind, sublayer, hidden_states, context):
        if (
            self.decoding_step is not None
            and type(context.cache) is DecodingCache  # a step of the fast decoding loop, one position per row
            and hidden_states.dim() == 3
            and hidden_states.shape[1] == 1
            and hidden_states.dtype == torch.float32
            and not context.attention_kwargs
            and not self.training
            and not torch.is_grad_enabled()
        ):
            output = self.run_decoding_step(hidden_states, context)
            if output is not None:
                return output, None
        return super().run(kind, sublayer, hidden_states, context)

    def normalize(self, hidden_states: torch.Tensor, residual: torch.Tensor | None = None) -> torch.Tensor | None:
        """LayerNorm(hidden_states (+ residual)) through the kernel, or None where it does not apply."""
        arguments = self.kernel_arguments
        if (
            arguments is None
            or self.training
            or hidden_states.dtype != torch.float32
            or hidden_states.device.type != "cpu"
            or (residual is not None and residual.shape != hidden_states.shape)
            or (torch.is_grad_enabled() and arguments[0].requires_grad)  # the kernel has no backward
        ):
            return None
        kernels = compiled_kernels()
        return None if kernels is None else kernels.add_layer_norm(hidden_states, residual, *arguments)

    def enter(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.normalize_before:
            normalized = self.normalize(hidden_states)
            if normalized is not None:
                return normalized
        return super().enter(hidden_states)

    def exit(self, residual: torch.Tensor, sublayer_output: torch.Tensor) -> torch.Tensor:
        if not self.normalize_before:
            normalized = self.normalize(sublayer_output, residual)
            if normalized is not None:
                return normalized
        return super().exit(residual, sublayer_output)


# what the first step of each decoding step form computes before its kernels, where the sub-layer's forward is the
# backbone's: an empty self-attention slot ("self"), the memory's keys/values through `project_keys_values` ("memory");
# `CompiledDecoderLayers.open_first_step` makes exactly that. A family's own forward may make its first step otherwise
# (layer-wise coordination's mixed attention keeps the source keys as the slot's prefix, its layer-wise
# cross-attention normalises the memory first): that step then runs through `run_layers`, the next ones in one call.
BACKBONE_FIRST_STEPS = {"self": MultiHeadAttention.forward, "memory": CrossAttention.forward}


class CompiledDecoderLayers:
    """The decoder layers of an inference copy at each step of the fast decoding loop as one compiled call
    (`DecoderLayerSteps`, kernels/decoding_step.cpp), for stacks whose every sub-layer runs its bound decoding step
    (`KernelResidualSublayer.bind_decoding_step`) and that connect their layers plainly (no `Connection`, or one that
    changes the embeddings alone, `connection`, applied before the call): the kernel calls that `run_layers` makes
    through the blocks' `run_decoding_step`, in the same order on the same tensors, so the same numbers bit for bit,
    without the Python of the layer and block modules between them (`compiled_decoder_layers` builds it;
    `DecoderSteps.logits` calls `states`).

    `self_attentions` are the stack's self-attention slots `(slot, heads, head_dim)`, `cross_attentions` its
    cross-attention sub-layers `(slot, module, layer position)`: where every attention's first step is the backbone's
    (`opens_first_step`, see `BACKBONE_FIRST_STEPS`), `states` makes before the first step what the Python path's
    first step would (`open_first_step`), so that every step runs in the one call; elsewhere the first step runs
    through `run_layers` and the one call takes over from the second."""

    def __init__(self, kernel_steps, self_attentions: list[tuple[int, int, int]],
                 cross_attentions: list[tuple[int, MultiHeadAttention, int]], layers: nn.ModuleList,
                 connection: nn.Module | None = None, opens_first_step: bool = True):
        self.kernel_steps = kernel_steps
        self.self_attentions, self.cross_attentions = self_attentions, cross_attentions
        self.layers = tuple(layers)
        self.connection, self.opens_first_step = connection, opens_first_step
        # whether every attention module of the layers takes a sentence's beams as query positions over one key row
        # (`DecoderSteps`' key groups), found once here rather than by a walk over the modules at every call
        self.accepts_key_groups = all(
            module.accepts_key_groups for module in layers.modules() if isinstance(module, MultiHeadAttention)
        )

    def open_first_step(self, embeddings: torch.Tensor, cache: DecodingCache, memory_for_layer: Callable) -> None:
        """What the first step of the Python path makes before its kernels: each cross-attention's keys and values of
        its memory (through the module's own `project_keys_values`, as its first step computes them) and each
        self-attention slot, empty, for the rows of `embeddings`."""
        for _, attention, position in self.cross_attentions:
            attention.project_keys_values(memory_for_layer(position), cache, static_keys=True)
        for slot, heads, head_dim in self.self_attentions:
            cache.self_attention_cache.open_slot(slot, embeddings.new_empty((embeddings.shape[0], heads, 0, head_dim)))

    def states(self, embeddings: torch.Tensor, cache: DecodingCache, memory_mask: torch.Tensor | None,
               memory_for_layer: Callable, memory_rows: torch.Tensor | None = None):
        """The states `[s_0 .. s_L]` of a decoding step (`run_layers(..., normalize=False)`), each self-attention
        slot one position longer; None where the blocks would not run their compiled steps either (a full slot, for
        which the Python path raises; a mask that is not boolean; a cache another path began). `memory_rows`: the
        row of the cross-attention keys/values and of `memory_mask` that each key row reads (`DecoderSteps`)."""
        if memory_mask is not None and memory_mask.dtype != torch.bool:
            return None
        slots = cache.self_attention_cache.slots
        if not slots and not cache.is_updated:
            if not self.opens_first_step:
                return None
            self.open_first_step(embeddings, cache, memory_for_layer)
        if len(slots) != len(self.self_attentions) or not all(
            cache.is_updated.get(slot, False) for slot, _, _ in self.cross_attentions
        ):
            return None
        slots = [slots[slot] for slot, _, _ in self.self_attentions]
        if any(slot.length >= slot.keys.shape[1] for slot in slots):
            return None
        if self.connection is not None:
            embeddings = self.connection(0, embeddings, [])  # s_0, as `run_layers` connects it
        cross = [cache.cross_attention_cache.layers[slot] for slot, _, _ in self.cross_attentions]
        outputs = self.kernel_steps(
            embeddings,
            [slot.keys for slot in slots],
            [slot.values for slot in slots],
            [slot.length for slot in slots],
            [slot.prefix for slot in slots],
            [layer.keys for layer in cross],
            [layer.values for layer in cross],
            memory_mask,
            cache.self_attention_cache.key_rows,
            memory_rows,
        )
        for slot in slots:
            slot.length += 1
        return [embeddings, *outputs]


# `compiled_decoder_layers` per decoder (an inference copy's, never changed once made: changed weights make a new copy)
# and number of layers, made at a decoder's first fast call instead of at every call
_compiled_layers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def compiled_decoder_layers(decoder, layers) -> CompiledDecoderLayers | None:
    """`CompiledDecoderLayers` for `layers` of `decoder` (an inference copy's), or None where the kernels are not
    built, the stack connects its layers (a `connection` that changes more than the embeddings), a layer is not a
    plain `TransformerLayer`, or a sub-layer's block has no bound decoding step: those steps run through
    `run_layers`. Made once per decoder and layers."""
    kernels = compiled_kernels()
    connection = decoder.connection
    if kernels is None or decoder.training or not (connection is None or connection.changes_only_embeddings()):
        return None
    cached = _compiled_layers.get(decoder, {}).get(len(layers))
    if cached is not None and all(kept is layer for kept, layer in zip(cached.layers, layers)):
        return cached
    compiled = compile_decoder_layers(kernels, decoder, layers)
    if compiled is not None:
        _compiled_layers.setdefault(decoder, {})[len(layers)] = compiled
    return compiled


def compile_decoder_layers(kernels, decoder, layers) -> CompiledDecoderLayers | None:
    """`compiled_decoder_layers` without its cache."""
    kernel_steps = kernels.DecoderLayerSteps()
    self_attentions, cross_attentions = {}, {}
    opens_first_step = True
    for position, layer in enumerate(layers):
        if type(layer) is not TransformerLayer:
            return None
        for _, name in layer.sublayers:
            block, sublayer = layer.get_submodule(f"{name}_block"), layer.get_submodule(name)
            if not isinstance(block, KernelResidualSublayer) or block.decoding_step is None:
                return None
            form, arguments, layer_idx, scaling = block.decoding_step
            if form in BACKBONE_FIRST_STEPS and type(sublayer).forward is not BACKBONE_FIRST_STEPS[form]:
                opens_first_step = False
            if form == "feed_forward":
                kernel_steps.add_feed_forward(*arguments)
            elif form == "self":
                kernel_steps.add_self_attention(*arguments, layer_idx, scaling)
                heads = sublayer.config.d_model // sublayer.head_dim
                self_attentions[layer_idx] = (layer_idx, heads, sublayer.head_dim)
            else:
                kernel_steps.add_cross_attention(*arguments, layer_idx, scaling)
                cross_attentions[layer_idx] = (layer_idx, sublayer, position)
        kernel_steps.end_layer()
    if set(self_attentions) != set(range(len(self_attentions))) or set(cross_attentions) != set(
        range(len(cross_attentions))
    ):
        return None  # the slots of a shortened stack (`num_layers_needed`) are its first ones; anything else runs in Python
    return CompiledDecoderLayers(kernel_steps, [self_attentions[i] for i in range(len(self_attentions))],
                                 [cross_attentions[i] for i in range(len(cross_attentions))], layers,
                                 decoder.connection, opens_first_step)


@functools.cache
def copy_knows(module_class: type) -> bool:
    """Whether `kernel_copy` can copy a module of `module_class`: torch.nn's own modules and transformers'
    activations, and the package's modules or any subclass of them (the backbone, the families and a new family's
    extension points, which call their linear layers and never read their weights; in the package or in a model's
    Hub code, `is_package_module`). Not the modules of other libraries
    that wrap a model's layers: PEFT's adapter layers (`lora.Linear` computes `base_layer(x)` plus its own low-rank
    path and reads `base_layer.weight`), the PEFT model around a model, other libraries' quantized linear layers:
    replacing the linear layers inside them would drop or break what they add."""
    if module_class.__module__.startswith(("torch.nn.modules.", "transformers.activations")):
        return True
    return any(is_package_module(base.__module__) for base in module_class.__mro__)


def is_package_module(name: str) -> bool:
    """Whether the module `name` holds the package's own classes: one of the package's modules, or the Hub code a
    saved model carries (`REMOTE_MODULE`, loaded by transformers under `transformers_modules`, where this function
    itself is inlined)."""
    return name.partition(".")[0] == "hf_layerfusion" or (
        name.startswith("transformers_modules.") and name.rpartition(".")[2] == REMOTE_MODULE
    )


def modules_the_copy_does_not_know(model: nn.Module) -> str | None:
    """The modules of `model` that `copy_knows` does not know, described for a message (each class with its first
    module's name and how many more), or None where there are none."""
    unknown: dict[type, list[str]] = {}
    for name, module in model.named_modules():
        if not copy_knows(type(module)):
            unknown.setdefault(type(module), []).append(name)
    if not unknown:
        return None
    return ", ".join(
        f"{cls.__module__}.{cls.__qualname__} (`{names[0] or 'the model itself'}`"
        + (f" and {len(names) - 1} more)" if len(names) > 1 else ")")
        for cls, names in unknown.items()
    )


def kernel_copy(model, linear_class: Callable[..., nn.Module], name: str):
    """An inference copy of `model` whose every `nn.Linear` of the encoder-decoder, and the output projection
    (`project`, with Marian's `final_logits_bias`), is a `linear_class(weight, bias, relu)` (a feed-forward ReLU
    folded into the first one), and whose attention is `DECODING_ATTENTION` (the `decode_attention` kernel at decoding
    steps, SDPA elsewhere), whose sub-layers' residual sums and LayerNorms are `KernelResidualSublayer`s (each running
    the decoding step its sub-layer declares as one call), and whose output head's mixture of several groups
    (`mix_output_groups`) is the compiled `mixture_kernel`: the output head's two through the model's
    `set_output_kernels` (several groups' logits at once through `OutputGroupsProjection`). Every other tensor
    (embeddings, LayerNorm weights, fusion weights) and the generation config are shared with `model`, not copied.
    `prepared_for_inference` names the copy (`name`). Raises `ValueError` for a model with modules the copy cannot
    copy (`copy_knows`: PEFT's adapters, ...), naming them."""
    unknown = modules_the_copy_does_not_know(model)
    if unknown is not None:
        raise ValueError(
            f"The {name} inference copy replaces the model's linear layers by compiled kernels and cannot copy "
            f"modules of other libraries around the model or its layers: {unknown}. To translate with it, "
            f"{MERGE_ADVICE}."
        )
    shared = {id(tensor): tensor for tensor in [*model.parameters(), *model.buffers()]}
    shared[id(model.generation_config)] = model.generation_config  # later changes to it reach the copy
    engine = copy.deepcopy(model, memo=shared).eval()
    for module in list(engine.model.modules()):
        if type(module).forward is FeedForward.forward and type(module.activation_fn) is nn.ReLU:
            # act(fc1(x)) with act = ReLU: folded into fc1's kernel call
            module.fc1, module.activation_fn = linear_class(module.fc1.weight, module.fc1.bias, relu=True), nn.Identity()
        for child_name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, child_name, linear_class(child.weight, child.bias))
            elif type(child) is ResidualSublayer:
                setattr(module, child_name, KernelResidualSublayer(child))
    for layer in engine.model.modules():
        if isinstance(layer, TransformerLayer):
            for _, sublayer_name in layer.sublayers:
                block = layer.get_submodule(f"{sublayer_name}_block")
                block.bind_decoding_step(layer.get_submodule(sublayer_name))
    engine.set_attn_implementation(register_decoding_attention())
    # the output head's declared hooks: `project` through the copy's own projection (`project_output_groups` through
    # the same layer into kept memory), `mix_output_groups` (GTrans' Eq. 5: five torch passes) through one kernel call
    projection = linear_class(engine.lm_head.weight, engine.final_logits_bias[0])
    engine.set_output_kernels(
        projection=projection, mixture=mixture_kernel, groups_projection=OutputGroupsProjection(projection)
    )
    engine.prepared_for_inference = name
    return engine


class OutputGroupsProjection(nn.Module):
    """An inference copy's output projection (`projection`: its `Float32Linear` or `Int8Linear`) for the stacked
    features of several output groups, written into the calling thread's scratch (`thread_scratch`) instead of a new
    tensor: the head reads these group logits only before it returns (`project_output_groups`), and GTrans' (three
    8,000-word groups, 12 MB at a beam search of 32 sentences) made new at every step were mapped fresh by the C
    library, a page fault for every 4 KiB written (study/fast_cpu_translation_log.md measures them). The result lasts
    until the thread's next call."""

    def __init__(self, projection: nn.Module):
        super().__init__()
        self.projection = projection

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if features.dtype != torch.float32 or features.device.type != "cpu":
            return self.projection(features)
        shape = (*features.shape[:-1], self.projection.out_features)
        numel = math.prod(shape)
        return self.projection(features, out=thread_scratch(numel)[:numel].view(shape))


def mixture_kernel(group_logits: torch.Tensor, psi: torch.Tensor) -> torch.Tensor | None:
    """`probability_mixture` (hf_layerfusion.modeling.extension_points) through the compiled `mixture_log_probs`
    kernel (kernels/mixture_log_probs.cpp: the same function, float rounding apart) for float32 CPU group logits
    `(groups, ..., vocab)` without gradients; None elsewhere (`mix_output_groups` then runs the torch operations)."""
    kernels = compiled_kernels()
    if (
        kernels is None
        or group_logits.dim() < 2
        or group_logits.dtype != torch.float32
        or group_logits.device.type != "cpu"
        or (torch.is_grad_enabled() and (group_logits.requires_grad or psi.requires_grad))  # no backward
    ):
        return None
    rows = group_logits.reshape(group_logits.shape[0], -1, group_logits.shape[-1])  # (groups, rows, vocab)
    return kernels.mixture_log_probs(rows, psi.float()).view(group_logits.shape[1:])


def int8_copy(model, code_bits: int | None = None):
    """`kernel_copy` with `Int8Linear` layers in the format `code_bits` (default: this CPU's, `Int8Linear`'s), e.g.
    to measure another format's BLEU on this CPU (study/bench_inference.py `--int8-formats`); given to
    `fast_generate(..., quantization="int8")` or `hf_layerfusion.translate(..., quantization="int8")`, the copy is run
    as it is."""
    linear_class = Int8Linear if code_bits is None else functools.partial(Int8Linear, code_bits=check_code_bits(code_bits))
    return kernel_copy(model, linear_class, "int8")


def float32_copy(model):
    """`kernel_copy` with `Float32Linear` layers."""
    return kernel_copy(model, Float32Linear, "float32")


_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def parameters_and_buffers(model: nn.Module) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Every parameter and every buffer of `model` and its submodules (a shared one as often as it is held): what
    `parameters()` and `buffers()` give, read from the modules' own tables without the generators and names those
    build (a third of the time; this runs at every `fast_generate` call)."""
    parameters, buffers, modules = [], [], [model]
    while modules:
        module = modules.pop()
        parameters.extend(tensor for tensor in module._parameters.values() if tensor is not None)
        buffers.extend(tensor for tensor in module._buffers.values() if tensor is not None)
        modules.extend(child for child in module._modules.values() if child is not None)
    return parameters, buffers


# a tensor's bit patterns as integers of its element size, by that size (`content_checksum`)
BIT_PATTERN_TYPES = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}


def content_checksum(tensor: torch.Tensor) -> int:
    """The sum of `tensor`'s bytes read as 64-bit integers, wrapping around (where its layout allows; else its elements'
    bit patterns summed exactly): a write changes it unless its changes cancel out exactly in the sum (a permutation
    of the elements does). Not a 32-bit sum: scaling by 2 moves every float32 pattern by 2^23, which 512 elements add
    up to 2^32. One read of the weights at memory speed, the integer sums vectorized (study/fast_cpu_translation_log.md
    measures it against a translation)."""
    try:
        return int(tensor.view(torch.int64).sum())
    except RuntimeError:  # an odd last dimension, an odd offset, a stride: its elements one by one, summed exactly
        return int(tensor.view(BIT_PATTERN_TYPES[tensor.element_size()]).sum(dtype=torch.int64))


def weights_fingerprint(tensors: list[torch.Tensor]) -> tuple | None:
    """Which tensors hold the weights (`tensors`: the model's parameters and buffers), where they live, how often they
    were changed in place and what they hold (None if unknown): a prepared copy is rebuilt when the model's weights
    changed after it was made (training, `load_state_dict`, with `assign=True` too: new tensors). The contents'
    checksums (`content_checksum`, once per distinct tensor) see what no version counter does: a write through
    `.data` (`p.data.mul_(decay)`, as EMA and weight-averaging code makes) counts on the version counter of the
    `.data` tensor, a new one, not on the parameter's."""
    try:
        versions = tuple((id(tensor), tensor.data_ptr(), tensor._version) for tensor in tensors)
    except RuntimeError:  # inference tensors keep no version counter
        return None
    distinct = {id(tensor): tensor for tensor in tensors}.values()
    return versions, tuple(content_checksum(tensor) for tensor in distinct)


def float32_copy_applies(model, parameters: list[torch.Tensor] | None = None) -> bool:
    """Whether `prepare_for_inference(model)` makes the float32 copy: an hf_layerfusion model in eval mode, float32,
    on the CPU, where `float32_kernel_available()` (`parameters`: the model's, where the caller has them)."""
    if not hasattr(model, "output_head"):  # first: anything else (a stand-in, a wrapper) is run as it is
        return False
    parameters = parameters_and_buffers(model)[0] if parameters is None else parameters
    return (
        not model.training
        and all(parameter.is_cpu and parameter.dtype == torch.float32 for parameter in parameters)
        and float32_kernel_available()
    )


def prepare_for_inference(model, quantization: str | None = None):
    """The model `fast_generate` runs for `model`, made once and kept while `model` and its weights are unchanged:

    - `quantization=None`: its float32 copy (`float32_copy`: the compiled `Float32Linear` and decoding-attention
      kernels, the same function as the model's with the sums in another order, so the tokens of `generate()` unless
      two candidates tie to the last bits), where `float32_copy_applies`; elsewhere (neither AVX-512 nor AVX2 with FMA, no compiler, GPU,
      half precision, training mode, the Hub code, and a model holding modules of other libraries that wrap its
      layers, such as PEFT's adapters: `copy_knows`, said in a warning) the model itself;
    - `quantization="int8"`: its int8 copy (`int8_copy`; changes the numbers, hence possibly tokens: its BLEU cost is
      measured in the README); `ValueError` for a model with such modules (merge adapters first).

    A copy given back to this function is returned as it is. A copy is kept per instruction set cap of the kernels
    (`cpu_kernels.limit_instruction_set`): one made under another cap is made again for this one."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"Unknown quantization {quantization!r}; choose one of {QUANTIZATIONS}.")
    prepared = getattr(model, "prepared_for_inference", None)
    if prepared is not None:
        if quantization not in (None, prepared):
            raise ValueError(
                f"This model is already the {prepared} inference copy of a model; prepare the original model for "
                f"quantization={quantization!r}."
            )
        return model
    if quantization is None and not hasattr(model, "output_head"):
        return model  # anything else (a stand-in, a wrapper) is run as it is, before reading its tensors
    parameters, buffers = parameters_and_buffers(model)
    if quantization is None:
        if not float32_copy_applies(model, parameters):  # which also checks that it is on the CPU
            return model
    elif not all(parameter.is_cpu for parameter in parameters):
        raise ValueError(f"quantization={quantization!r} runs on the CPU; move the model there (`model.to('cpu')`).")
    # a copy per instruction set cap (cpu_kernels.limit_instruction_set): int8 weights are packed for the cap's product
    kernels = compiled_kernels()
    key = (quantization or "float32", None if kernels is None else kernels.max_instruction_set())
    fingerprint = weights_fingerprint(parameters + buffers)
    cached = _prepared.get(model, {}).get(key)
    if cached is not None and fingerprint is not None and cached[0] == fingerprint:
        engine = cached[1]
        # the copy shares the model's generation config object: one assigned since (`model.generation_config = ...`)
        # must replace it there too, or the copy would decode with the old settings
        engine.generation_config = model.generation_config
        return engine
    if quantization is None:
        unknown = modules_the_copy_does_not_know(model)
        if unknown is not None:  # checked where a copy would be made: changing modules changes the parameters
            inference_copy_logger.warning_once(
                f"hf_layerfusion's float32 inference copy cannot copy modules of other libraries around the model or "
                f"its layers: {unknown}. The fast loop runs the model's own layers, without the compiled kernels; to "
                f"run them, {MERGE_ADVICE}."
            )
            return model
    engine = int8_copy(model) if quantization == "int8" else float32_copy(model)
    _prepared.setdefault(model, {})[key] = (fingerprint, engine)
    return engine
