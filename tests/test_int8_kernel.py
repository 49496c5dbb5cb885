"""`Int8Linear` and its compiled kernel against brute-force arithmetic: per-row asymmetric int8 quantization (scale
and zero point, round half to even), an exact integer product, float dequantization; the kernel's AMX, AVX2 and float32-block products and the
torch operations that replace it where it cannot be built, all bit for bit equal; the fallback and its warning."""

import warnings

import numpy as np
import pytest
import torch
from helpers import cpu_flags

from hf_layerfusion.inference import cpu_kernels
from hf_layerfusion.inference.cpu_kernels import compiled_kernels
from hf_layerfusion.inference.inference_copies import Int8Linear, exact_int8_product, int8_linear_reference


def brute_force_int8_linear(
    inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool = False
) -> np.ndarray:
    """The scheme written out in numpy: symmetric int8 codes per output feature; per input row, codes c with
    x ~ (c - zero) * span / 255 over the row's range [min(x, 0), max(x, 0)]; an int64 product; float64
    dequantization (so it matches the kernel's float32 to rounding, not bit for bit)."""
    w = weight.numpy().astype(np.float32)
    w_scale = np.maximum(np.abs(w).max(axis=1), np.finfo(np.float32).tiny) / np.float32(127)
    w_codes = np.rint(w / w_scale[:, None]).astype(np.int64)
    x = inputs.reshape(-1, w.shape[1]).numpy().astype(np.float32)
    low = np.minimum(x.min(axis=1, initial=0), 0)
    span = np.maximum(np.maximum(x.max(axis=1, initial=0), 0) - low, np.float32(1e-30))
    zero = np.rint(-low * (np.float32(255) / span)) - 128  # np.rint: half to even
    x_codes = np.clip(np.rint(x * (np.float32(255) / span)[:, None]) + zero[:, None], -128, 127).astype(np.int64)
    assert np.abs(w_codes).max() <= 127
    centred = x_codes - zero.astype(np.int64)[:, None]
    output = (centred @ w_codes.T) * (span.astype(np.float64)[:, None] / 255) * w_scale.astype(np.float64)[None, :]
    if bias is not None:
        output = output + bias.numpy().astype(np.float64)
    if relu:
        output = np.maximum(output, 0)
    return output.reshape(*inputs.shape[:-1], w.shape[0])


NO_TILES = torch.empty(0, dtype=torch.int8)  # the kernel's float32-block product


def test_amx_or_avx2_is_used_where_the_cpu_has_it(kernels):
    layer = Int8Linear(torch.randn(8, 16), None)
    has_amx = {"amx_tile", "amx_int8"} <= cpu_flags()
    assert kernels.amx_available() == has_amx
    expected = "AMX" if has_amx else "AVX2" if "avx2" in cpu_flags() else "float32 blocks"
    assert kernels.int8_product() == expected
    assert (layer.packed_weights.numel() > 0) == (expected != "float32 blocks")


# odd sizes, sizes that fill AMX tiles exactly (16 rows, 64 deep, 64 columns) and one more than that, no rows
CASES = [
    ((3, 5, 20), 13, True),
    ((32, 256), 300, True),
    ((1, 7), 5, False),
    ((4, 2, 64), 64, False),
    ((16, 128), 128, True),
    ((17, 65), 129, True),
    ((0, 16), 8, True),
]


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("shape, out_features, with_bias", CASES)
def test_kernel_equals_brute_force_and_its_torch_fallback_bit_for_bit(kernels, shape, out_features, with_bias, relu):
    generator = torch.Generator().manual_seed(sum(shape) + out_features)
    inputs = torch.randn(*shape, generator=generator) * torch.rand(*shape[:-1], 1, generator=generator) * 10
    inputs[..., ::3] = inputs[..., ::3].relu()  # some rows one-signed (after a ReLU), shifting their zero point
    inputs[1::2] = inputs[1::2].relu()
    weight = torch.randn(out_features, shape[-1], generator=generator)
    bias = torch.randn(out_features, generator=generator) if with_bias else None
    layer = Int8Linear(weight, bias, relu=relu)
    codes = (layer.weight_t, layer.packed_weights, layer.column_sums, layer.weight_scale, layer.bias, relu)
    compiled = kernels.int8_linear(inputs, *codes)
    blocks = kernels.int8_linear(inputs, layer.weight_t, NO_TILES, *codes[2:])
    fallback = int8_linear_reference(inputs, layer.weight_t, *codes[2:])
    assert compiled.shape == (*shape[:-1], out_features)
    assert torch.equal(compiled, fallback) and torch.equal(blocks, fallback)
    expected = brute_force_int8_linear(inputs, weight, bias, relu)
    np.testing.assert_allclose(compiled.numpy(), expected, rtol=1e-5, atol=1e-4)
    assert torch.equal(layer(inputs), compiled)
    if relu:  # the folded ReLU is the layer followed by torch's ReLU, bit for bit
        assert torch.equal(compiled, torch.relu(Int8Linear(weight, bias)(inputs)))


def test_rows_are_quantized_with_their_own_range_rounding_half_to_even(kernels):
    # identity weights: each output is (code - zero) x span / 255 of its input, i.e. the rounded input where the
    # row's range [min(x, 0), max(x, 0)] spans 255
    layer = Int8Linear(torch.eye(6), None)
    codes = (layer.weight_t, layer.packed_weights, layer.column_sums, layer.weight_scale, None)
    rows = torch.tensor([[255.0, 0.5, 1.5, 2.5, 0.0, 3.5], [-1.0, 254.0, 0.5, 1.5, 2.5, -0.5]])
    expected = torch.tensor([[255.0, 0.0, 2.0, 2.0, 0.0, 4.0], [-1.0, 254.0, 0.0, 2.0, 2.0, 0.0]])
    torch.testing.assert_close(kernels.int8_linear(rows, *codes), expected)
    # a one-signed row uses all 256 codes: values on its grid (multiples of span / 255) come back exactly, where a
    # symmetric scheme (steps of max / 127) would miss them by up to 1
    ramp = torch.arange(6.0)[None, :] * 51  # 0, 51, ..., 255
    torch.testing.assert_close(kernels.int8_linear(ramp, *codes), ramp)
    # one row with large activations leaves the other rows' numbers unchanged (the output is batch-independent)
    batch = torch.randn(5, 6)
    alone = kernels.int8_linear(batch[1:2], *codes)
    batch[3] *= 1000
    assert torch.equal(kernels.int8_linear(batch, *codes)[1:2], alone)
    assert torch.equal(kernels.int8_linear(torch.zeros(2, 6), *codes), torch.zeros(2, 6))


def test_kernel_rejects_inputs_it_cannot_compute(kernels):
    layer = Int8Linear(torch.randn(4, 8), torch.randn(4))
    weight_t, tiles, sums, scale = layer.weight_t, layer.packed_weights, layer.column_sums, layer.weight_scale
    with pytest.raises(RuntimeError, match="must be float32, got Double"):
        kernels.int8_linear(torch.randn(2, 8, dtype=torch.float64), weight_t, tiles, sums, scale, layer.bias)
    with pytest.raises(RuntimeError, match="has 5 features, the weight expects 8"):
        kernels.int8_linear(torch.randn(2, 5), weight_t, tiles, sums, scale, layer.bias)
    with pytest.raises(RuntimeError, match="bias must have 4"):
        kernels.int8_linear(torch.randn(2, 8), weight_t, tiles, sums, scale, torch.randn(3))
    with pytest.raises(RuntimeError, match="column_sums must have 4 contiguous int32"):
        kernels.int8_linear(torch.randn(2, 8), weight_t, tiles, sums.long(), scale, layer.bias)
    if tiles.numel() > 0:
        with pytest.raises(RuntimeError, match="packed_weights do not match weight_t"):
            kernels.int8_linear(torch.randn(2, 8), weight_t, tiles[:-1], sums, scale, layer.bias)
    # the module itself takes any float dtype (a bfloat16 model) and answers in it
    assert layer(torch.randn(2, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16
    with pytest.raises(TypeError, match="relu must be a bool, got 1"):
        Int8Linear(torch.randn(4, 8), None, relu=1)


def test_without_a_compiler_int8_layers_warn_once_and_compute_the_same_numbers(kernels, monkeypatch):
    layer, inputs = Int8Linear(torch.randn(12, 16), torch.randn(12)), torch.randn(3, 16)
    compiled = layer(inputs)

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    compiled_kernels.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"could not be compiled \(RuntimeError: Ninja is required"):
            assert torch.equal(layer(inputs), compiled)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: later calls reuse the answer
            assert torch.equal(layer(inputs), compiled)
    finally:
        compiled_kernels.cache_clear()
    monkeypatch.undo()
    assert cpu_kernels.compiled_kernels() is not None


def test_without_the_kernel_source_as_in_hub_code_int8_layers_warn_and_compute_the_same_numbers(kernels, monkeypatch):
    layer, inputs = Int8Linear(torch.randn(12, 16), torch.randn(12)), torch.randn(3, 16)
    compiled = layer(inputs)
    monkeypatch.setattr(cpu_kernels, "KERNEL_SOURCES", ("int8_linear.cpp", "missing.cpp"))
    compiled_kernels.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"missing.cpp is not there .*Hub code.*same numbers"):
            assert torch.equal(layer(inputs), compiled)
    finally:
        compiled_kernels.cache_clear()


def test_extreme_codes_sum_exactly(kernels):
    """Rows whose codes are all at the ends of the int8 range times weights at +-127 over 2,500 inputs: sums of
    +-2^25 that an 8-bit multiply-add (`vpmaddubsw`, which saturates pairs at 2^15) or one float32 product could not
    hold exactly; the kernel's products (this CPU's and the float32-block one) equal exact integer arithmetic."""
    weight = torch.full((20, 2500), 1.0)
    weight[1::2] = -1.0
    weight[::3, ::2] *= -1
    inputs = torch.full((5, 2500), -1.0)
    inputs[1] = 1.0
    inputs[2, ::2] = 1.0
    inputs[3] = torch.linspace(-1.0, 1.0, 2500)
    layer = Int8Linear(weight, None)
    codes = (layer.weight_t, layer.packed_weights, layer.column_sums, layer.weight_scale, None)
    expected = int8_linear_reference(inputs, layer.weight_t, *codes[2:])
    assert torch.equal(kernels.int8_linear(inputs, *codes), expected)
    assert torch.equal(kernels.int8_linear(inputs, layer.weight_t, NO_TILES, *codes[2:]), expected)
    sums = (inputs.sign().clamp_min(0) * 255 - 128).long() @ layer.weight_t.long()  # the codes of rows 0-2 are exact
    assert sums[:3].abs().max() > 2**24
    np.testing.assert_allclose(expected.numpy(), brute_force_int8_linear(inputs, weight, None), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("depth", [0, 1, 1024, 1025, 3000])
def test_the_torch_operations_sum_int8_products_exactly_past_float32_precision(depth):
    """`exact_int8_product` (the float32 products of `int8_linear_reference`) equals torch's integer product, also
    where one float32 product over all inputs could not be exact (sums past 2^24 at 1,025 inputs and more)."""
    generator = torch.Generator().manual_seed(depth)
    codes = torch.randint(-128, 128, (6, depth), dtype=torch.int8, generator=generator)
    weight_t = torch.randint(-127, 128, (depth, 33), dtype=torch.int8, generator=generator)
    codes[:2], weight_t[:, :2] = -128, -127  # the largest sums: 16,256 per input
    expected = (codes.long() @ weight_t.long()).to(torch.int32)
    assert expected.abs().max() >= (2**24 if depth > 1032 else 0)
    assert torch.equal(exact_int8_product(codes, weight_t), expected)
