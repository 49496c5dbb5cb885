"""The kernels' instruction set cap (kernels/instruction_sets.h, `cpu_kernels.limit_instruction_set`,
`HF_LAYERFUSION_MAX_CPU_ISA`): each cap removes the instructions above it and nothing else, bad values are refused by
name, int8 weights packed under a wider cap are refused by name under a narrower one, and under every cap this CPU
can take the fast loop translates as it does without one (the kernel tests run under every cap too, through the
`instruction_set` fixture)."""

import os
import subprocess
import sys

import pytest
import torch
from helpers import (
    REPO_ROOT,
    cpu_flags,
    expected_int8_products,
    instruction_sets_of_this_cpu,
    tiny_model,
    tiny_sources,
)

from hf_layerfusion.inference import fast_generate, prepare_for_inference
from hf_layerfusion.inference.cpu_kernels import INSTRUCTION_SETS, MAX_CPU_ISA_VARIABLE, limit_instruction_set
from hf_layerfusion.inference.inference_copies import Int8Linear, int8_copy


def test_each_cap_removes_the_instructions_above_it_and_restores_the_one_before(kernels, instruction_set):
    level = INSTRUCTION_SETS.index(instruction_set)
    assert kernels.max_instruction_set() == level
    flags = cpu_flags()
    float32_expected = (level >= 2 and "avx512f" in flags) or (level >= 1 and {"avx2", "fma"} <= flags)
    assert kernels.float32_linear_available() == float32_expected
    assert kernels.amx_available() == (level >= 3 and {"amx_tile", "amx_int8"} <= flags)
    for code_bits in (7, 8):
        assert kernels.int8_products(code_bits) == expected_int8_products(code_bits)
    with limit_instruction_set("generic"):
        assert kernels.max_instruction_set() == 0 and kernels.int8_products(8) == ["float32_blocks"]
        assert not kernels.float32_linear_available()
    assert kernels.max_instruction_set() == level


def test_bad_caps_are_refused_by_name(kernels):
    for bad in ("avx3", "", "AVX-512", None, 2):
        with pytest.raises(ValueError, match=r"instruction_set must be one of generic, avx2, avx512, amx.*got"):
            with limit_instruction_set(bad):
                pass
    with limit_instruction_set(" AVX2 "):  # any case and spacing
        assert kernels.max_instruction_set() == 1
    for bad in (-1, 4):
        with pytest.raises(RuntimeError, match=f"the cap is 0 \\(generic\\) to 3 \\(amx, no cap\\), got {bad}"):
            kernels.set_max_instruction_set(bad)
    assert kernels.max_instruction_set() == 3


def run_python(code: str, cap: str) -> subprocess.CompletedProcess:
    environment = {**os.environ, MAX_CPU_ISA_VARIABLE: cap, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=600)


def test_the_environment_sets_the_cap_when_the_kernels_load_and_a_bad_value_is_refused(kernels):
    code = ("from hf_layerfusion.inference.cpu_kernels import compiled_kernels; k = compiled_kernels(); "
            "print(k.max_instruction_set(), k.int8_products(8))")
    done = run_python(code, "avx2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[0] == "1" and "vnni" not in done.stdout and "amx" not in done.stdout
    refused = run_python(code, "avx3")
    assert refused.returncode != 0
    assert f"ValueError: {MAX_CPU_ISA_VARIABLE} must be one of generic, avx2, avx512, amx" in refused.stderr
    assert "'avx3'" in refused.stderr


def test_int8_weights_packed_under_a_wider_cap_are_refused_by_name_under_a_narrower_one(kernels):
    packed = [(bits, kernels.int8_products(bits)[0]) for bits in (7, 8)
              if kernels.int8_products(bits)[0] != "float32_blocks"]
    if not packed:
        pytest.skip("this CPU packs no int8 weights (no AVX2, AVX-512 VNNI or AMX)")
    inputs = torch.randn(3, 16)
    for code_bits, product in packed:
        layer = Int8Linear(torch.randn(8, 16), torch.randn(8), code_bits=code_bits)
        assert layer.kernel_linear.product == product
        expected = layer(inputs)
        with limit_instruction_set("generic"):
            with pytest.raises(RuntimeError, match=f"product '{product}' does not run {code_bits}-bit weights on this "
                                                   "CPU within the instruction set cap"):
                layer(inputs)
            assert torch.equal(Int8Linear(layer_weight(layer), layer.bias, code_bits=code_bits)(inputs), expected)
        assert torch.equal(layer(inputs), expected)


def layer_weight(layer: Int8Linear) -> torch.Tensor:
    """Float weights whose quantization is `layer`'s codes and scales again."""
    return layer.weight_t.t().float() * layer.weight_scale[:, None]


@pytest.mark.parametrize("model_type", ["plain_transformer", "gtrans"])
def test_under_every_cap_the_fast_loop_translates_as_without_one(kernels, instruction_set, model_type):
    """The float32 copy (where the cap leaves its kernel) or the model itself gives generate()'s tokens, and the
    int8 copy of each format the tokens it gives with every instruction the CPU has: every product and vector width
    computes the same numbers."""
    model = tiny_model(model_type, d_model=32)
    source = tiny_sources()
    for settings in ({"num_beams": 1}, {"num_beams": 3}):
        with torch.no_grad():
            expected = model.generate(**source, max_new_tokens=8, **settings)
        assert torch.equal(fast_generate(model, **source, max_new_tokens=8, fallback=False, **settings), expected)
        for code_bits in (7, 8):
            with limit_instruction_set(instruction_sets_of_this_cpu()[-1]):
                widest = int8_copy(model, code_bits)
                expected_int8 = fast_generate(widest, **source, max_new_tokens=8, quantization="int8",
                                              fallback=False, **settings)
            capped = int8_copy(model, code_bits)
            translated = fast_generate(capped, **source, max_new_tokens=8, quantization="int8", fallback=False,
                                       **settings)
            assert torch.equal(translated, expected_int8)
    engine = prepare_for_inference(model)
    assert (engine is not model) == kernels.float32_linear_available()


def test_prepare_for_inference_keeps_a_copy_per_cap(kernels):
    """A copy made under one cap is not handed out under another (its int8 weights are packed for the cap's product):
    each cap gets its own, kept while the weights are unchanged."""
    model = tiny_model("plain_transformer", d_model=32)
    uncapped = prepare_for_inference(model, "int8")
    assert prepare_for_inference(model, "int8") is uncapped
    with limit_instruction_set("generic"):
        capped = prepare_for_inference(model, "int8")
        assert capped is not uncapped and prepare_for_inference(model, "int8") is capped
        assert capped.output_projection.kernel_linear.product == "float32_blocks"
        assert prepare_for_inference(model) is model  # no float32 kernel under the generic cap: the model itself
    assert prepare_for_inference(model, "int8") is uncapped
