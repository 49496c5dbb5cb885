"""`Float32Linear` and its compiled kernel (kernels/float32_linear.cpp) against the product written out in float64
numpy: every row count of a pass (1-12 rows and more, split into blocks of near-equal size: AVX-512 passes of at most
12 rows, AVX2 passes of at most 6), layer sizes that are and are not multiples of its 32-feature passes, bias, folded
ReLU, batched and strided inputs; its checks name the bad input."""

import numpy as np
import pytest
import torch
from helpers import instruction_sets_of_this_cpu, usable_cpu_flags

from hf_layerfusion.inference import inference_copies
from hf_layerfusion.inference.cpu_kernels import limit_instruction_set
from hf_layerfusion.inference.inference_copies import Float32Linear, float32_kernel_available


def brute_force_linear(inputs: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool) -> np.ndarray:
    output = inputs.double().numpy() @ weight.double().numpy().T
    if bias is not None:
        output = output + bias.double().numpy()
    return np.maximum(output, 0) if relu else output


def assert_float_rounding_of(actual: torch.Tensor, inputs, weight, bias, relu: bool = False):
    """Equal to float64 arithmetic up to float32 rounding of a sum over the inputs: |error| <= 1e-5 of the sum of
    the terms' magnitudes (a term left out or counted twice is 1/in_features of it, 1e-3 for 1024 inputs)."""
    expected = brute_force_linear(inputs, weight, bias, relu)
    magnitude = inputs.double().abs().numpy() @ weight.double().abs().numpy().T
    if bias is not None:
        magnitude = magnitude + bias.double().abs().numpy()
    assert actual.shape == expected.shape and actual.dtype == torch.float32
    assert np.all(np.abs(actual.double().numpy() - expected) <= 1e-5 * magnitude + 1e-30), (
        np.abs(actual.double().numpy() - expected).max()
    )


def kernel_instruction_set_in_cpu_flags() -> bool:
    """AVX-512, or AVX2 with FMA, within the instruction set cap: the instruction sets the kernel is written for."""
    flags = usable_cpu_flags()
    return "avx512f" in flags or {"avx2", "fma"} <= flags


def test_the_kernel_runs_where_the_cpu_has_avx512_or_avx2_with_fma(kernels, instruction_set):
    assert kernels.float32_linear_available() == kernel_instruction_set_in_cpu_flags()


@pytest.fixture(params=[name for name in instruction_sets_of_this_cpu() if name != "generic"])
def vector_instruction_set(request, kernels) -> str:
    """The `instruction_set` fixture's caps at which the kernel runs (AVX2 with FMA and wider; none on a CPU
    without them: these tests are then skipped, and the package runs F.linear)."""
    with limit_instruction_set(request.param):
        yield request.param


@pytest.mark.parametrize("in_features,out_features", [(16, 32), (100, 50), (256, 256), (1024, 256), (256, 1000)])
@pytest.mark.parametrize("rows", [1, 5, 6, 7, 12, 13, 25, 32, 35, 128])
def test_kernel_is_the_product_to_float_rounding(rows, in_features, out_features, vector_instruction_set):
    generator = torch.Generator().manual_seed(rows * 7 + in_features)
    weight = torch.randn(out_features, in_features, generator=generator) * in_features**-0.5
    bias = torch.randn(out_features, generator=generator)
    inputs = torch.randn(rows, in_features, generator=generator)
    for layer_bias in (bias, None):
        for relu in (False, True):
            layer = Float32Linear(weight, layer_bias, relu=relu)
            assert_float_rounding_of(layer(inputs), inputs, weight, layer_bias, relu)


def test_kernel_reads_batched_and_strided_inputs_and_rows_do_not_mix(vector_instruction_set):
    generator = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(40, 24, generator=generator), torch.randn(40, generator=generator)
    layer = Float32Linear(weight, bias)
    batched = torch.randn(2, 3, 24, generator=generator)
    assert layer(batched).shape == (2, 3, 40)
    assert_float_rounding_of(layer(batched).view(6, 40), batched.view(6, 24), weight, bias)
    strided = torch.randn(24, 7, generator=generator).t()  # rows not contiguous
    assert_float_rounding_of(layer(strided), strided, weight, bias)
    # a row's output does not depend on the rows it is computed with, nor on how the rows are split into passes
    assert torch.equal(layer(batched.view(6, 24))[4:5], layer(batched.view(6, 24)[4:5]))
    many = torch.randn(35, 24, generator=generator)
    assert torch.equal(layer(many), torch.cat([layer(row[None]) for row in many]))
    assert layer(torch.empty(0, 24)).shape == (0, 40)


def test_kernel_writes_into_a_given_output_the_numbers_it_returns(vector_instruction_set):
    generator = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(40, 24, generator=generator), torch.randn(40, generator=generator)
    layer = Float32Linear(weight, bias, relu=True)
    batched = torch.randn(2, 13, 24, generator=generator)  # 26 rows: passes of several sizes
    expected = layer(batched)
    out = torch.full((26 * 40,), float("nan"))
    result = layer(batched, out=out)
    assert result.shape == (2, 13, 40) and result.data_ptr() == out.data_ptr()
    assert torch.equal(result, expected) and torch.equal(out, expected.reshape(-1))
    assert_float_rounding_of(result.view(26, 40), batched.view(26, 24), weight, bias, relu=True)


def test_folded_relu_keeps_nan_as_torch_relu_does(vector_instruction_set):
    layer = Float32Linear(torch.randn(40, 24), torch.randn(40), relu=True)
    inputs = torch.randn(3, 24)
    inputs[1, 5] = float("nan")
    output = layer(inputs)
    assert output[1].isnan().all() and not output[[0, 2]].isnan().any()
    assert (output[[0, 2]] >= 0).all()


def test_kernel_rejects_inputs_it_cannot_compute(kernels, vector_instruction_set):
    layer = Float32Linear(torch.randn(40, 24), torch.randn(40))
    with pytest.raises(RuntimeError, match="the input must be a float32 CPU tensor, got Double"):
        layer(torch.randn(2, 24, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="the input has 23 features, the weights expect 24"):
        layer(torch.randn(2, 23))
    with pytest.raises(RuntimeError, match="out_features 100 does not match panels for 64 features"):
        kernels.float32_linear(torch.randn(2, 24), layer.panels, 100, None, False)
    with pytest.raises(RuntimeError, match="bias must be contiguous float32 with 40 values"):
        kernels.float32_linear(torch.randn(2, 24), layer.panels, 40, torch.randn(39), False)
    with pytest.raises(RuntimeError, match="panels must be contiguous float32"):
        kernels.float32_linear(torch.randn(2, 24), layer.panels[:3], 40, None, False)
    inputs = torch.randn(2, 24)
    for bad_out, message in ((torch.empty(80, dtype=torch.float64), "Double \\[80\\]"),
                             (torch.empty(79), "Float \\[79\\]"),
                             (torch.empty(40, 2).t(), "Float \\[2, 40\\] \\(not contiguous\\)")):
        with pytest.raises(RuntimeError, match="float32_linear: out must be a contiguous float32 CPU tensor of 2 x 40 "
                                               f"elements, got {message}"):
            layer(inputs, out=bad_out)
    shared = torch.randn(2 * 24 + 80)
    with pytest.raises(RuntimeError, match="float32_linear: out overlaps the input"):
        layer(shared[:48].view(2, 24), out=shared[40:120])
    with pytest.raises(TypeError, match="relu must be a bool, got 1"):
        Float32Linear(torch.randn(4, 4), None, relu=1)


def test_without_the_kernel_no_float32_layer_is_built(monkeypatch):
    monkeypatch.setattr(inference_copies, "float32_kernel_available", lambda: False)
    with pytest.raises(RuntimeError, match="needs the compiled float32_linear kernel"):
        Float32Linear(torch.randn(4, 4), None)


def test_availability_needs_the_compiled_kernels(monkeypatch):
    monkeypatch.setattr(inference_copies, "compiled_kernels", lambda: None)
    assert not float32_kernel_available()
