"""The compiled output mixture (`mixture_log_probs`, kernels/mixture_log_probs.cpp: GTrans' Eq. 5) against Eq. 5
computed in float64, and the inference copies' use of it through the output head's declared hooks
(`mix_output_groups`, `project_output_groups`, `set_output_kernels`)."""

import threading

import numpy as np
import pytest
import torch
from helpers import tiny_model

from hf_layerfusion.inference import prepare_for_inference, release_decoding_buffers
from hf_layerfusion.inference.decoding import thread_scratch
from hf_layerfusion.inference.inference_copies import OutputGroupsProjection, mixture_kernel
from hf_layerfusion.modeling.extension_points import probability_mixture


def eq5_float64(group_logits: torch.Tensor, psi: torch.Tensor) -> np.ndarray:
    """log max(sum_i psi_i softmax(z_i), FLT_MIN) in float64 (paper Eq. 5 with the model's clamp)."""
    z = group_logits.double().numpy()
    probabilities = np.exp(z - z.max(axis=-1, keepdims=True))
    probabilities /= probabilities.sum(axis=-1, keepdims=True)
    mixture = np.tensordot(psi.double().numpy(), probabilities, axes=1)
    return np.log(np.maximum(mixture, np.finfo(np.float32).tiny))


@pytest.mark.parametrize("groups, rows, vocab", [(1, 3, 16), (2, 5, 37), (3, 4, 8000), (6, 2, 5)])
def test_kernel_is_eq5(kernels, instruction_set, groups, rows, vocab):
    torch.manual_seed(groups * 1000 + vocab)
    group_logits = torch.randn(groups, rows, vocab) * 6
    psi = torch.softmax(torch.randn(groups), dim=0)
    output = kernels.mixture_log_probs(group_logits, psi)
    assert output.shape == (rows, vocab) and output.dtype == torch.float32
    np.testing.assert_allclose(output.numpy(), eq5_float64(group_logits, psi), rtol=2e-6, atol=2e-6)


def test_kernel_clamps_probabilities_that_underflow_in_every_group(kernels, instruction_set):
    group_logits = torch.zeros(2, 1, 20)
    group_logits[:, 0, 0] = 200.0  # every other token: probability e^-200 in both groups
    group_logits[1, 0, 1] = 150.0  # token 1: e^-50 / 2 in the mixture
    output = kernels.mixture_log_probs(group_logits, torch.tensor([0.5, 0.5]))
    expected = eq5_float64(group_logits, torch.tensor([0.5, 0.5]))
    tiny_log = float(np.log(np.finfo(np.float32).tiny))
    assert torch.equal(output[0, 2:], torch.full((18,), tiny_log, dtype=torch.float32))
    np.testing.assert_allclose(output.numpy(), expected, rtol=2e-6)


def test_kernel_names_bad_inputs(kernels):
    with pytest.raises(RuntimeError, match="group_logits must be a float32 CPU tensor"):
        kernels.mixture_log_probs(torch.randn(2, 3), torch.ones(2))
    with pytest.raises(RuntimeError, match="group_logits must be a float32 CPU tensor"):
        kernels.mixture_log_probs(torch.randn(2, 3, 4, dtype=torch.float64), torch.ones(2))
    with pytest.raises(RuntimeError, match=r"psi must be float32 with one weight per group \(2\)"):
        kernels.mixture_log_probs(torch.randn(2, 3, 4), torch.ones(3))


def test_the_copies_mix_gtrans_groups_with_the_kernel_and_the_model_with_torch(kernels):
    model = tiny_model("gtrans")
    group_logits, psi = torch.randn(3, 4, 2, 50), torch.softmax(torch.randn(3), dim=0)  # (groups, batch, length, vocab)
    with torch.no_grad():
        expected = model.mix_output_groups(group_logits, psi)
        assert model.output_mixture_kernel is None  # the model itself: torch operations
        torch.testing.assert_close(expected, probability_mixture(group_logits, psi), rtol=0, atol=0)
        for quantization in (None, "int8"):
            engine = prepare_for_inference(model, quantization)
            if engine is model:  # no float32 copy on this CPU
                continue
            assert engine.output_mixture_kernel is mixture_kernel
            torch.testing.assert_close(engine.mix_output_groups(group_logits, psi), expected, rtol=1e-5, atol=1e-5)
    with torch.enable_grad():  # the kernel has no backward: a differentiable call runs the model's torch operations
        logits = group_logits.clone().requires_grad_()
        prepare_for_inference(model, "int8").mix_output_groups(logits, psi).sum().backward()
    assert logits.grad is not None


def test_the_copies_project_gtrans_groups_into_the_threads_scratch(kernels):
    """`project_output_groups`: the model projects the stacked group features with torch; the copies through their
    own output projection (the numbers of their `project`) into the calling thread's scratch (`thread_scratch`), the
    same memory at every call whatever the rows; another thread writes its own; `release_decoding_buffers` frees
    it."""
    model = tiny_model("gtrans")
    generator = torch.Generator().manual_seed(0)
    features = [torch.randn(4, 1, model.config.d_model, generator=generator) for _ in range(3)]
    with torch.no_grad():
        expected = model.project_output_groups(features)
        assert model.output_groups_projection is None and torch.equal(expected, model.project(torch.stack(features)))
        for quantization in (None, "int8"):
            engine = prepare_for_inference(model, quantization)
            if engine is model:  # no float32 copy on this CPU
                continue
            projection = engine.output_groups_projection
            assert isinstance(projection, OutputGroupsProjection) and projection.projection is engine.output_projection
            first = engine.project_output_groups(features)
            scratch = thread_scratch(0)
            assert first.shape == (3, 4, 1, model.config.vocab_size) and first.data_ptr() == scratch.data_ptr()
            assert torch.equal(first, engine.project(torch.stack(features)))
            if quantization is None:
                torch.testing.assert_close(first, expected, rtol=1e-5, atol=1e-5)
            first = first.clone()
            fewer = engine.project_output_groups([f[:2] for f in features])
            assert fewer.data_ptr() == scratch.data_ptr() and torch.equal(fewer, first[:, :2])
            in_other_thread = []
            thread = threading.Thread(target=lambda: in_other_thread.append(engine.project_output_groups(features)))
            thread.start()
            thread.join()
            assert torch.equal(in_other_thread[0], first) and in_other_thread[0].data_ptr() != scratch.data_ptr()
            release_decoding_buffers()
            assert engine.project_output_groups(features).data_ptr() != scratch.data_ptr()


def test_set_output_kernels_names_what_it_cannot_take():
    """`set_output_kernels` takes modules for the projections and a callable for the mixture; anything else is a
    TypeError naming the argument, before any of them is set."""
    model = tiny_model("gtrans")
    for keyword, bad, message in (
        ("projection", torch.nn.functional.linear, "projection must be an nn.Module or None, got builtin_function"),
        ("groups_projection", "linear", "groups_projection must be an nn.Module or None, got str"),
        ("mixture", 3, "mixture must be callable or None, got int"),
    ):
        with pytest.raises(TypeError, match=f"set_output_kernels: {message}"):
            model.set_output_kernels(**{keyword: bad})
        assert model.output_projection is None and model.output_groups_projection is None
        assert model.output_mixture_kernel is None
