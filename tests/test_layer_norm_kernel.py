"""The compiled residual sum + LayerNorm (`add_layer_norm`, kernels/layer_norm.cpp) against LayerNorm computed in
float64, and the inference copies' `KernelResidualSublayer` against the model's own sub-layers."""

import numpy as np
import pytest
import torch
from helpers import CountingKernels, tiny_model

from hf_layerfusion.inference import inference_copies, prepare_for_inference
from hf_layerfusion.inference.inference_copies import KernelResidualSublayer
from hf_layerfusion.modeling.layers import ResidualSublayer


def layer_norm_float64(x, weight, bias, eps) -> np.ndarray:
    x = x.double().numpy()
    mean = x.mean(axis=-1, keepdims=True)
    variance = ((x - mean) ** 2).mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(variance + eps) * weight.double().numpy() + bias.double().numpy()


@pytest.mark.parametrize("shape", [(1, 16), (5, 1, 48), (32, 1, 256), (3, 7, 1024)])
def test_kernel_is_layer_norm_of_the_sum(kernels, instruction_set, shape):
    torch.manual_seed(shape[-1])
    x, y = torch.randn(shape) * 3 + 1, torch.randn(shape)
    weight, bias = torch.randn(shape[-1]), torch.randn(shape[-1])
    for eps in (1e-5, 1e-12):
        np.testing.assert_allclose(kernels.add_layer_norm(x, y, weight, bias, eps).numpy(),
                                   layer_norm_float64(x + y, weight, bias, eps), rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(kernels.add_layer_norm(x, None, weight, bias, eps).numpy(),
                                   layer_norm_float64(x, weight, bias, eps), rtol=1e-5, atol=1e-5)
    strided = torch.randn(shape[-1], *shape[:-1]).movedim(0, -1)  # not contiguous: read as its values
    np.testing.assert_allclose(kernels.add_layer_norm(strided, None, weight, bias, 1e-5).numpy(),
                               layer_norm_float64(strided, weight, bias, 1e-5), rtol=1e-5, atol=1e-5)


def test_kernel_names_bad_inputs(kernels):
    with pytest.raises(RuntimeError, match="last dimension is a multiple of 16"):
        kernels.add_layer_norm(torch.randn(2, 20), None, torch.ones(20), torch.zeros(20), 1e-5)
    with pytest.raises(RuntimeError, match="y must be float32 of x's shape"):
        kernels.add_layer_norm(torch.randn(2, 16), torch.randn(3, 16), torch.ones(16), torch.zeros(16), 1e-5)
    with pytest.raises(RuntimeError, match="weight and bias must be float32 with 16 values"):
        kernels.add_layer_norm(torch.randn(2, 16), None, torch.ones(8), torch.zeros(16), 1e-5)


@pytest.mark.parametrize("normalize_before", [False, True])
def test_the_copies_sublayers_compute_the_models(kernels, normalize_before, monkeypatch):
    counting = CountingKernels(kernels)
    monkeypatch.setattr(inference_copies, "compiled_kernels", lambda: counting)
    model = tiny_model("plain_transformer", d_model=32, normalize_before=normalize_before)
    engine = prepare_for_inference(model, "int8")  # both copies come from kernel_copy
    blocks = [m for m in engine.model.modules() if isinstance(m, ResidualSublayer)]
    assert blocks and all(type(m) is KernelResidualSublayer for m in blocks)
    own = model.model.decoder.layers[0].self_attn_block
    copied = engine.model.decoder.layers[0].self_attn_block
    assert type(own) is ResidualSublayer and copied.layer_norm.weight is own.layer_norm.weight  # shared, not copied
    residual, output = torch.randn(4, 1, 32), torch.randn(4, 1, 32)
    with torch.no_grad():
        torch.testing.assert_close(copied.enter(residual), own.enter(residual), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(copied.exit(residual, output), own.exit(residual, output), rtol=1e-5, atol=1e-5)
        assert counting.calls["add_layer_norm"] == 1  # pre-norm: in `enter`; post-norm: with the sum, in `exit`
        with torch.enable_grad():  # differentiable: the sub-layer's own torch operations (the kernel has no backward)
            assert copied.exit(residual, output.requires_grad_()).grad_fn is not None
        assert counting.calls["add_layer_norm"] == 1
        copied.train()  # training mode (dropout): the sub-layer's own torch operations
        torch.manual_seed(0)
        trained = copied.exit(residual, output)
        own.train()
        torch.manual_seed(0)
        assert torch.equal(trained, own.exit(residual, output))
