"""`Int8Linear` and its compiled kernel against brute-force arithmetic, in both formats (8-bit codes, and the 7-bit
codes of AVX2's `vpmaddubsw` product): per-row asymmetric quantization (scale and zero point, round half to even), an
exact integer product, float dequantization; the kernel's AMX, AVX-512 VNNI, AVX2 and float32-block products and the
torch operations that replace it where it cannot be built, all bit for bit equal; the fallback and its warning. Every
product the CPU has runs, not only its fastest (`int8_linear`'s `product`): on a CPU with AMX all four (AVX2's with
7-bit weights), on one with VNNI and AVX2 but no AMX three; AMX's only on a CPU with AMX
(`test_each_product_is_used_where_the_cpu_has_it` says which ran)."""

import re
import warnings

import numpy as np
import pytest
import torch
from helpers import REPO_ROOT, expected_int8_products, run_python, usable_cpu_flags, vnni_before_onednn

from hf_layerfusion.inference import cpu_kernels
from hf_layerfusion.inference.cpu_kernels import compiled_kernels
from hf_layerfusion.inference.inference_copies import Int8Linear, exact_int8_product, int8_linear_reference


# code_bits -> (lowest activation code, number of activation steps, largest weight code), written out here
FORMATS = {8: (-128, 255, 127), 7: (0, 127, 63)}


def brute_force_int8_linear(
    inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool = False, code_bits: int = 8
) -> np.ndarray:
    """The scheme written out in numpy: symmetric weight codes per output feature in [-largest, largest]; per input
    row, codes c in [lowest, lowest + steps] with x ~ (c - zero) * span / steps over the row's range
    [min(x, 0), max(x, 0)]; an int64 product; float64 dequantization (so it matches the kernel's float32 to rounding,
    not bit for bit)."""
    lowest, steps, largest = FORMATS[code_bits]
    w = weight.numpy().astype(np.float32)
    w_scale = np.maximum(np.abs(w).max(axis=1), np.finfo(np.float32).tiny) / np.float32(largest)
    w_codes = np.rint(w / w_scale[:, None]).astype(np.int64)
    x = inputs.reshape(-1, w.shape[1]).numpy().astype(np.float32)
    low = np.minimum(x.min(axis=1, initial=0), 0)
    span = np.maximum(np.maximum(x.max(axis=1, initial=0), 0) - low, np.float32(1e-30))
    zero = np.rint(-low * (np.float32(steps) / span)) + lowest  # np.rint: half to even
    x_codes = np.clip(np.rint(x * (np.float32(steps) / span)[:, None]) + zero[:, None], lowest, lowest + steps)
    x_codes = x_codes.astype(np.int64)
    assert np.abs(w_codes).max() <= largest
    centred = x_codes - zero.astype(np.int64)[:, None]
    output = (centred @ w_codes.T) * (span.astype(np.float64)[:, None] / steps) * w_scale.astype(np.float64)[None, :]
    if bias is not None:
        output = output + bias.numpy().astype(np.float64)
    if relu:
        output = np.maximum(output, 0)
    return output.reshape(*inputs.shape[:-1], w.shape[0])


NO_TILES = torch.empty(0, dtype=torch.int8)  # the kernel's float32-block product


AMX_MINIMUM_ROWS = 8  # the kernel's kAmxMinimumRows: fewer rows run VNNI's product on the AMX layout
ONEDNN_MINIMUM_ROWS = 24  # the kernel's kOneDnnMinimumRows: fewer rows run VNNI's product on the oneDNN layout


def expected_product(code_bits: int) -> str:
    """The product the kernel must run `code_bits` layers with on this CPU under the instruction set cap: AMX takes either format (with VNNI, its
    products of fewer than `AMX_MINIMUM_ROWS` rows run VNNI's kernels on the same weights); AVX-512 VNNI (without
    AMX) 8-bit codes through oneDNN's product (VNNI's kernels below `ONEDNN_MINIMUM_ROWS` rows); AVX2 (without AMX)
    7-bit codes; anything else runs the float32 block products."""
    flags = usable_cpu_flags()
    vnni = {"avx512_vnni", "avx512bw"} <= flags
    if {"amx_tile", "amx_int8"} <= flags:
        return f"AMX (AVX-512 VNNI below {AMX_MINIMUM_ROWS} rows)" if vnni else "AMX"
    if vnni and code_bits == 8:
        if vnni_before_onednn():
            return "AVX-512 VNNI (measured faster than oneDNN s8s8 here)"
        return (f"oneDNN s8s8 through at::_int_mm (AVX-512 VNNI below {ONEDNN_MINIMUM_ROWS} rows; measured faster "
                "than AVX-512 VNNI here)")
    return "AVX2" if "avx2" in flags and code_bits == 7 else "float32 blocks"


def test_each_product_is_used_where_the_cpu_has_it_with_its_format(kernels, instruction_set):
    """Layers use by default the format of the CPU's fastest product: 8 bits with AMX or VNNI, 7 bits on AVX2
    without either (its `vpmaddubsw` product), 8 bits elsewhere (the float32 block products)."""
    has_amx = {"amx_tile", "amx_int8"} <= usable_cpu_flags()
    assert kernels.amx_available() == has_amx
    default_bits = 7 if expected_product(7) == "AVX2" and expected_product(8) == "float32 blocks" else 8
    assert kernels.int8_code_bits() == default_bits
    assert Int8Linear(torch.randn(8, 16), None).code_bits == default_bits
    for code_bits in (7, 8):
        expected = expected_product(code_bits)
        assert kernels.int8_product(code_bits) == expected
        assert kernels.int8_products(code_bits) == expected_int8_products(code_bits)
        layer = Int8Linear(torch.randn(8, 16), None, code_bits=code_bits)
        assert (layer.packed_weights.numel() > 0) == (expected != "float32 blocks")
        assert f"code_bits={code_bits}" in repr(layer)


def test_onednn_and_vnni_are_ordered_by_the_process_timings_and_layers_use_the_faster(kernels, instruction_set):
    """Where the CPU has VNNI and no AMX, `int8_products(8)` lists first whichever of oneDNN's product and VNNI's
    kernels this process timed faster (per row, one thread), and layers are packed for it by default; the timings are
    taken once, are real (positive, of products that take microseconds), and the choice does not move torch's random
    generator (a fresh process, seeded, draws the same numbers before and after)."""
    timings = kernels.onednn_vnni_timings()
    if not {"avx512_vnni", "avx512bw"} <= usable_cpu_flags():
        assert timings == {}
        return
    assert set(timings) == {"onednn", "vnni"} and all(0.01 < value < 1e5 for value in timings.values())
    assert kernels.onednn_vnni_timings() == timings  # measured once
    faster, slower = sorted(timings, key=timings.get)
    products = kernels.int8_products(8)
    if products[0] == "amx":
        assert products[1:3] == ["onednn", "vnni"]
        return
    assert products[:2] == [faster, slower]
    assert Int8Linear(torch.randn(8, 16), None, code_bits=8).kernel_linear.product == faster
    code = ("import torch; torch.manual_seed(3); before = torch.rand(4); torch.manual_seed(3)\n"
            "from hf_layerfusion.inference.cpu_kernels import compiled_kernels\n"
            "kernels = compiled_kernels(); kernels.int8_products(8); assert kernels.onednn_vnni_timings()\n"
            "assert torch.equal(torch.rand(4), before), 'the timings moved the random generator'")
    run_python(["-c", code], {"PYTHONPATH": str(REPO_ROOT)}, REPO_ROOT)


# odd sizes, sizes that fill AMX tiles exactly (16 rows, 64 deep, 64 columns) and one more than that, no rows; on a
# CPU with AMX and VNNI, rows on both sides of `AMX_MINIMUM_ROWS` (1, 5, 6, 7 run VNNI's kernels on the AMX layout)
CASES = [
    ((3, 5, 20), 13, True),
    ((32, 256), 300, True),
    ((1, 7), 5, False),
    ((4, 2, 64), 64, False),
    ((16, 128), 128, True),
    ((17, 65), 129, True),
    ((0, 16), 8, True),
    ((5, 40), 56, True),  # 7 panels of 8 (AVX2): a pass of 4 and one of 3; 3.5 panels of 16 (VNNI)
    ((7, 36), 100, False),  # VNNI: rows in passes of 4 and 3, 6.25 panels of 16 (passes of 4 and 3)
    ((2, 3, 300), 200, True),  # VNNI: 6 rows (4 + 2), 12.5 panels; depth 300 (75 groups of 4)
    ((5, 9, 33), 47, True),  # 45 rows: oneDNN's product by default, on both sides of its minimum when forced
]


@pytest.mark.parametrize("code_bits", [7, 8])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize("shape, out_features, with_bias", CASES)
def test_kernel_equals_brute_force_and_its_torch_fallback_bit_for_bit(
    kernels, instruction_set, shape, out_features, with_bias, relu, code_bits
):
    generator = torch.Generator().manual_seed(sum(shape) + out_features)
    inputs = torch.randn(*shape, generator=generator) * torch.rand(*shape[:-1], 1, generator=generator) * 10
    inputs[..., ::3] = inputs[..., ::3].relu()  # some rows one-signed (after a ReLU), shifting their zero point
    inputs[1::2] = inputs[1::2].relu()
    weight = torch.randn(out_features, shape[-1], generator=generator)
    bias = torch.randn(out_features, generator=generator) if with_bias else None
    layer = Int8Linear(weight, bias, relu=relu, code_bits=code_bits)
    codes = (layer.weight_t, layer.packed_weights, layer.column_sums, layer.weight_scale, layer.bias, relu, code_bits)
    compiled = kernels.int8_linear(inputs, *codes)
    blocks = kernels.int8_linear(inputs, layer.weight_t, NO_TILES, *codes[2:])
    fallback = int8_linear_reference(inputs, layer.weight_t, *codes[2:])
    assert compiled.shape == (*shape[:-1], out_features)
    assert torch.equal(compiled, fallback) and torch.equal(blocks, fallback)
    # every product this CPU has, not only its fastest (an AVX2 machine's product also runs on one with AMX)
    for product in kernels.int8_products(code_bits):
        packed = kernels.pack_int8_weights(layer.weight_t, code_bits, product)
        assert torch.equal(kernels.int8_linear(inputs, layer.weight_t, packed, *codes[2:], product=product), fallback)
    expected = brute_force_int8_linear(inputs, weight, bias, relu, code_bits)
    np.testing.assert_allclose(compiled.numpy(), expected, rtol=1e-5, atol=1e-4)
    assert torch.equal(layer(inputs), compiled)
    if relu:  # the folded ReLU is the layer followed by torch's ReLU, bit for bit
        assert torch.equal(compiled, torch.relu(Int8Linear(weight, bias, code_bits=code_bits)(inputs)))


@pytest.mark.parametrize("code_bits", [7, 8])
@pytest.mark.parametrize("shape, out_features, with_bias", CASES)
def test_every_product_writes_into_a_given_output_the_numbers_it_returns(
    kernels, instruction_set, shape, out_features, with_bias, code_bits
):
    """`out=`: each product this CPU has, on both sides of its minimum row counts (AMX's tiles or VNNI's kernels,
    oneDNN's product or VNNI's), writes the reference's numbers into the given memory, whatever it held (NaN), and
    returns it viewed as the output; so does the layer, through its kernel and through the torch operations."""
    generator = torch.Generator().manual_seed(7 * sum(shape) + out_features)
    inputs = torch.randn(*shape, generator=generator) * 3
    inputs[1::2] = inputs[1::2].relu()
    layer = Int8Linear(torch.randn(out_features, shape[-1], generator=generator),
                       torch.randn(out_features, generator=generator) if with_bias else None, code_bits=code_bits)
    codes = (layer.column_sums, layer.weight_scale, layer.bias, False, code_bits)
    reference = int8_linear_reference(inputs, layer.weight_t, *codes)
    elements = reference.numel()

    def assert_written_into(out, result):
        assert result.shape == reference.shape and torch.equal(result, reference)
        assert torch.equal(out, reference.reshape(-1)) and (elements == 0 or result.data_ptr() == out.data_ptr())

    for product in kernels.int8_products(code_bits):
        packed = kernels.pack_int8_weights(layer.weight_t, code_bits, product)
        for minimum_rows in (0, 10**9):
            out = torch.full((elements,), float("nan"))
            result = kernels.int8_linear(inputs, layer.weight_t, packed, *codes, amx_minimum_rows=minimum_rows,
                                         product=product, onednn_minimum_rows=minimum_rows, out=out)
            assert_written_into(out, result)
    out = torch.full((elements,), float("nan"))
    assert_written_into(out, layer(inputs, out=out))
    layer.kernel_linear = None  # the torch operations, as where the kernels cannot be built
    out = torch.full((elements,), float("nan"))
    assert_written_into(out, layer(inputs, out=out))


@pytest.mark.parametrize("code_bits", [7, 8])
@pytest.mark.parametrize("shape, out_features, with_bias", CASES)
def test_amx_weights_give_the_same_numbers_on_tiles_and_on_vnni_at_every_size(
    kernels, shape, out_features, with_bias, code_bits
):
    """On a CPU with AMX and VNNI one packed layout serves both products: tiles from `amx_minimum_rows` rows, VNNI's
    kernels below. Forced each way at every size (0: tiles always; a huge minimum: VNNI always), both give the
    reference's numbers; elsewhere the argument changes nothing."""
    assert kernels.AMX_MINIMUM_ROWS == AMX_MINIMUM_ROWS
    generator = torch.Generator().manual_seed(3 * sum(shape) + out_features)
    inputs = torch.randn(*shape, generator=generator) * 4
    inputs[1::2] = inputs[1::2].relu()
    layer = Int8Linear(torch.randn(out_features, shape[-1], generator=generator),
                       torch.randn(out_features, generator=generator) if with_bias else None, code_bits=code_bits)
    codes = (layer.weight_t, layer.packed_weights, layer.column_sums, layer.weight_scale, layer.bias, False, code_bits)
    reference = int8_linear_reference(inputs, *codes[:1], *codes[2:])
    for minimum in (0, 10**9, AMX_MINIMUM_ROWS):
        assert torch.equal(kernels.int8_linear(inputs, *codes, amx_minimum_rows=minimum), reference), minimum
    with pytest.raises(RuntimeError, match="amx_minimum_rows must be >= 0, got -1"):
        kernels.int8_linear(inputs, *codes, amx_minimum_rows=-1)


@pytest.mark.parametrize("shape, out_features, with_bias", CASES)
def test_onednn_weights_give_the_same_numbers_through_onednn_and_vnni_at_every_size(
    kernels, shape, out_features, with_bias
):
    """On a CPU with VNNI the "onednn" product reads weight_t through oneDNN (`at::_int_mm`) from
    `onednn_minimum_rows` rows and VNNI's kernels on the layout's panels below. Forced each way at every size (0:
    oneDNN always; a huge minimum: VNNI always), both give the reference's numbers."""
    if "onednn" not in kernels.int8_products(8):
        pytest.skip("oneDNN's product runs where the CPU has AVX-512 VNNI")
    assert kernels.ONEDNN_MINIMUM_ROWS == ONEDNN_MINIMUM_ROWS
    generator = torch.Generator().manual_seed(5 * sum(shape) + out_features)
    inputs = torch.randn(*shape, generator=generator) * 4
    inputs[1::2] = inputs[1::2].relu()
    layer = Int8Linear(torch.randn(out_features, shape[-1], generator=generator),
                       torch.randn(out_features, generator=generator) if with_bias else None, code_bits=8)
    packed = kernels.pack_int8_weights(layer.weight_t, 8, "onednn")
    assert torch.equal(packed, kernels.pack_int8_weights(layer.weight_t, 8, "vnni"))  # VNNI's panels
    codes = (layer.weight_t, packed, layer.column_sums, layer.weight_scale, layer.bias, True, 8)
    reference = int8_linear_reference(inputs, layer.weight_t, *codes[2:])
    for minimum in (0, 10**9, ONEDNN_MINIMUM_ROWS):
        got = kernels.int8_linear(inputs, *codes, product="onednn", onednn_minimum_rows=minimum)
        assert torch.equal(got, reference), minimum
    with pytest.raises(RuntimeError, match="onednn_minimum_rows must be >= 0, got -1"):
        kernels.int8_linear(inputs, *codes, product="onednn", onednn_minimum_rows=-1)


@pytest.mark.parametrize("code_bits", [7, 8])
def test_rows_are_quantized_with_their_own_range_rounding_half_to_even(kernels, instruction_set, code_bits):
    # identity weights: each output is (code - zero) x span / steps of its input, i.e. the rounded input where the
    # row's range [min(x, 0), max(x, 0)] spans `steps` (255 codes apart with 8 bits, 127 with 7)
    steps = FORMATS[code_bits][1]
    layer = Int8Linear(torch.eye(6), None, code_bits=code_bits)
    codes = (layer.weight_t, layer.packed_weights, layer.column_sums, layer.weight_scale, None, False, code_bits)
    rows = torch.tensor([[steps, 0.5, 1.5, 2.5, 0.0, 3.5], [-1.0, steps - 1, 0.5, 1.5, 2.5, -0.5]])
    expected = torch.tensor([[steps, 0.0, 2.0, 2.0, 0.0, 4.0], [-1.0, steps - 1, 0.0, 2.0, 2.0, 0.0]])
    torch.testing.assert_close(kernels.int8_linear(rows, *codes), expected)
    # a one-signed row uses all its codes: values on its grid (multiples of span / steps) come back exactly, where a
    # symmetric scheme (steps of max / largest weight code) would miss them by up to 1
    ramp = torch.linspace(0, steps, 6).round()[None, :]
    torch.testing.assert_close(kernels.int8_linear(ramp, *codes), ramp)
    # one row with large activations leaves the other rows' numbers unchanged (the output is batch-independent)
    batch = torch.randn(5, 6)
    alone = kernels.int8_linear(batch[1:2], *codes)
    batch[3] *= 1000
    assert torch.equal(kernels.int8_linear(batch, *codes)[1:2], alone)
    assert torch.equal(kernels.int8_linear(torch.zeros(2, 6), *codes), torch.zeros(2, 6))


@pytest.mark.parametrize("code_bits", [7, 8])
def test_the_quantized_input_buffer_is_reused_by_calls_of_any_size_and_layout(kernels, code_bits):
    """Each call quantizes its input into a buffer of the calling thread, kept between calls: a large call, then
    smaller ones, non-contiguous inputs (a transposed batch, a strided slice) and a large one again each give the
    reference numbers, and no result changes when a later call reuses the buffer (the outputs are their own)."""
    generator = torch.Generator().manual_seed(code_bits)
    layer = Int8Linear(torch.randn(40, 72, generator=generator), torch.randn(40, generator=generator),
                       code_bits=code_bits)
    codes = (layer.weight_t, layer.packed_weights, layer.column_sums, layer.weight_scale, layer.bias, False, code_bits)
    inputs = [
        torch.randn(300, 72, generator=generator) * 5,
        torch.randn(1, 72, generator=generator),
        torch.randn(9, 6, 72, generator=generator).transpose(0, 1),
        torch.randn(11, 144, generator=generator)[:, ::2],
        torch.randn(3, 72, generator=generator).relu(),
        torch.randn(301, 72, generator=generator),
    ]
    assert not inputs[2].is_contiguous() and not inputs[3].is_contiguous()
    results = [kernels.int8_linear(x, *codes) for x in inputs]
    for x, result in zip(inputs, results):
        assert result.shape == (*x.shape[:-1], 40)
        assert torch.equal(result, int8_linear_reference(x.contiguous(), layer.weight_t, *codes[2:]))


def test_kernel_rejects_inputs_it_cannot_compute(kernels):
    layer = Int8Linear(torch.randn(4, 8), torch.randn(4))
    weight_t, tiles, sums, scale = layer.weight_t, layer.packed_weights, layer.column_sums, layer.weight_scale
    bits = layer.code_bits
    with pytest.raises(RuntimeError, match="must be float32, got Double"):
        kernels.int8_linear(
            torch.randn(2, 8, dtype=torch.float64), weight_t, tiles, sums, scale, layer.bias, False, bits
        )
    with pytest.raises(RuntimeError, match="has 5 features, the weight expects 8"):
        kernels.int8_linear(torch.randn(2, 5), weight_t, tiles, sums, scale, layer.bias, False, bits)
    with pytest.raises(RuntimeError, match="bias must have 4"):
        kernels.int8_linear(torch.randn(2, 8), weight_t, tiles, sums, scale, torch.randn(3), False, bits)
    with pytest.raises(RuntimeError, match="column_sums must have 4 contiguous int32"):
        kernels.int8_linear(torch.randn(2, 8), weight_t, tiles, sums.long(), scale, layer.bias, False, bits)
    with pytest.raises(RuntimeError, match="code_bits must be 7 or 8, got 6"):
        kernels.int8_linear(torch.randn(2, 8), weight_t, tiles, sums, scale, layer.bias, False, 6)
    if tiles.numel() > 0:
        with pytest.raises(RuntimeError, match="packed_weights do not match weight_t"):
            kernels.int8_linear(torch.randn(2, 8), weight_t, tiles[:-1], sums, scale, layer.bias, False, bits)
    if "avx2" in kernels.int8_products(7):  # its panels hold 7-bit weights only
        with pytest.raises(RuntimeError, match="7-bit weights lie in \\[-63, 63\\], got one of magnitude 127"):
            kernels.pack_int8_weights(Int8Linear(torch.randn(4, 8), None, code_bits=8).weight_t, 7, "avx2")
        with pytest.raises(RuntimeError, match="got one of magnitude 128"):  # int8's abs(-128) is -128
            kernels.pack_int8_weights(torch.full((8, 4), -128, dtype=torch.int8), 7, "avx2")
    runnable = ", ".join(kernels.int8_products(7))
    for bad in ("vnni", "sse", "AMX"):  # VNNI's own panels take 8-bit weights only; names are the kernel's
        message = f"product '{bad}' does not run 7-bit weights on this CPU; it runs: {runnable}"
        with pytest.raises(RuntimeError, match=re.escape(f"pack_int8_weights: {message}")):
            kernels.pack_int8_weights(weight_t, 7, bad)
        with pytest.raises(RuntimeError, match=re.escape(f"int8_linear: {message}")):
            kernels.int8_linear(torch.randn(2, 8), weight_t, tiles, sums, scale, layer.bias, False, 7, product=bad)
    seven_bit_products = kernels.int8_products(7)
    if len(seven_bit_products) > 2:  # weights packed for one product, read as another's: their sizes differ here
        packed = kernels.pack_int8_weights(weight_t, 7, seven_bit_products[0])
        with pytest.raises(RuntimeError, match="packed_weights do not match weight_t"):
            kernels.int8_linear(torch.randn(2, 8), weight_t, packed, sums, scale, None, False, 7,
                                product=seven_bit_products[1])
    if kernels.int8_product(7) == "AVX2" and kernels.int8_product(8) == "float32 blocks":
        seven_bit = Int8Linear(torch.randn(4, 8), torch.randn(4), code_bits=7)
        with pytest.raises(RuntimeError, match="no product that reads 8-bit weights packed"):
            kernels.int8_linear(torch.randn(2, 8), seven_bit.weight_t, seven_bit.packed_weights,
                                seven_bit.column_sums, seven_bit.weight_scale, seven_bit.bias, False, 8)
    wide = Int8Linear(torch.randn(1, 2**17), None)
    with pytest.raises(RuntimeError, match="131073 input features; at most 131072"):
        kernels.int8_linear(torch.randn(1, 2**17 + 1), torch.zeros(2**17 + 1, 1, dtype=torch.int8), NO_TILES,
                            wide.column_sums, wide.weight_scale, None, False, 8)
    with pytest.raises(ValueError, match="131073 input features; at most 131072"):
        Int8Linear(torch.randn(1, 2**17 + 1), None)
    for bad in (6, 16, True, 7.0, "7"):
        with pytest.raises(ValueError, match=f"code_bits must be one of \\[7, 8\\], got {bad!r}"):
            Int8Linear(torch.randn(4, 8), None, code_bits=bad)
    inputs = torch.randn(2, 8)
    for bad_out, message in (
        (torch.empty(8, dtype=torch.float64), "Double \\[8\\]"),
        (torch.empty(9), "Float \\[9\\]"),
        (torch.empty(4, 2).t(), "Float \\[2, 4\\] \\(not contiguous\\)"),
    ):
        with pytest.raises(RuntimeError, match="int8_linear: out must be a contiguous float32 CPU tensor of 2 x 4 "
                                               f"elements, got {message}"):
            layer(inputs, out=bad_out)
    with pytest.raises(RuntimeError, match="int8_linear: out overlaps the input"):
        shared = torch.randn(16)
        layer(shared.view(2, 8), out=shared[8:])
    torch_operations = Int8Linear(torch.randn(4, 8), None)
    torch_operations.kernel_linear = None  # as where the kernels cannot be built
    for bad_out, message in ((torch.empty(9), "torch.float32 \\(9,\\)"),
                             (torch.empty(4, 2).t(), "torch.float32 \\(2, 4\\)")):
        with pytest.raises(ValueError, match="Int8Linear: out must be a contiguous float32 tensor of 8 elements, "
                                             f"got {message}"):
            torch_operations(inputs, out=bad_out)
    with pytest.raises(TypeError, match="Int8Linear: out is given for float32 inputs only, got torch.bfloat16 inputs"):
        layer(inputs.bfloat16(), out=torch.empty(8))
    # the module itself takes any float dtype (a bfloat16 model) and answers in it
    assert layer(torch.randn(2, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16
    with pytest.raises(TypeError, match="relu must be a bool, got 1"):
        Int8Linear(torch.randn(4, 8), None, relu=1)


def test_without_a_compiler_int8_layers_warn_once_and_compute_the_same_numbers(kernels, monkeypatch, tmp_path):
    """Without the compiled kernels a layer takes the 8-bit format and runs `int8_linear_reference`: the numbers of the
    kernel in that format."""
    weight, bias, inputs = torch.randn(12, 16), torch.randn(12), torch.randn(3, 16)
    compiled = Int8Linear(weight, bias, code_bits=8)(inputs)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # no build to find: this machine's would be loaded

    def no_compiler(*args, **kwargs):
        raise RuntimeError("Ninja is required to load C++ extensions")

    monkeypatch.setattr(torch.utils.cpp_extension, "load", no_compiler)
    compiled_kernels.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"could not be compiled \(RuntimeError: Ninja is required"):
            layer = Int8Linear(weight, bias)
        assert layer.kernel_linear is None and layer.code_bits == 8
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # once: later calls reuse the answer
            assert torch.equal(layer(inputs), compiled)
            assert torch.equal(Int8Linear(weight, bias)(inputs), compiled)
    finally:
        compiled_kernels.cache_clear()
    monkeypatch.undo()
    assert cpu_kernels.compiled_kernels() is not None


def test_without_the_kernel_source_as_in_hub_code_int8_layers_warn_and_compute_the_same_numbers(kernels, monkeypatch):
    weight, bias, inputs = torch.randn(12, 16), torch.randn(12), torch.randn(3, 16)
    compiled = Int8Linear(weight, bias, code_bits=8)(inputs)
    monkeypatch.setattr(cpu_kernels, "KERNEL_SOURCES", ("int8_linear.cpp", "missing.cpp"))
    compiled_kernels.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"missing.cpp is not there .*Hub code.*same numbers"):
            layer = Int8Linear(weight, bias)
        assert layer.kernel_linear is None and torch.equal(layer(inputs), compiled)
    finally:
        compiled_kernels.cache_clear()


@pytest.mark.parametrize("code_bits", [7, 8])
def test_extreme_codes_sum_exactly(kernels, instruction_set, code_bits):
    """Rows whose codes are all at the ends of their range times weights at +-largest over 2,500 inputs: sums past
    2^24 that one float32 product could not hold exactly, and, with 7 bits, the largest pairs AVX2's `vpmaddubsw`
    adds (codes 127 x offset weights 127, twice: 32,258 < 2^15; 8-bit codes would saturate it); the kernel's
    products (this CPU's and the float32-block one) equal exact integer arithmetic."""
    lowest, steps, largest = FORMATS[code_bits]
    weight = torch.full((20, 2500), 1.0)
    weight[1::2] = -1.0
    weight[::3, ::2] *= -1
    inputs = torch.full((5, 2500), -1.0)
    inputs[1] = 1.0
    inputs[2, ::2] = 1.0
    inputs[3] = torch.linspace(-1.0, 1.0, 2500)
    layer = Int8Linear(weight, None, code_bits=code_bits)
    assert layer.weight_t.abs().max() == largest
    codes = (layer.weight_t, layer.packed_weights, layer.column_sums, layer.weight_scale, None, False, code_bits)
    expected = int8_linear_reference(inputs, layer.weight_t, *codes[2:])
    assert torch.equal(kernels.int8_linear(inputs, *codes), expected)
    assert torch.equal(kernels.int8_linear(inputs, layer.weight_t, NO_TILES, *codes[2:]), expected)
    row_codes = lowest + (inputs > 0).long() * steps  # the codes of rows 0-2 are exact
    sums = row_codes @ layer.weight_t.long()
    assert sums[:3].abs().max() > 2**24
    np.testing.assert_allclose(
        expected.numpy(), brute_force_int8_linear(inputs, weight, None, code_bits=code_bits), rtol=1e-5, atol=1e-3
    )


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
