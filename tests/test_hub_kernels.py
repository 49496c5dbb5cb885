"""transformers 5.25's default kernelization (`from_pretrained(use_kernels=None)` kernelizes every model with the `kernels`
package, unless `USE_HUB_KERNELS` is off) and the families.

What it touches: the modules whose class transformers decorated with `use_kernel_forward_from_hub` (a
`kernel_layer_name`). In these models those are the feed-forward activations alone, and only the GELU and SiLU ones
(`activation_function` "gelu", "gelu_new", "silu"); ReLU (the default), tanh and "swish" (`torch.nn.SiLU`) are torch modules it leaves
alone. On the CPU transformers maps no Hub kernel for any of them, so kernelization puts the class's own forward back
on each such module: the outputs are unchanged. On a GPU (CUDA, ROCm, XPU), in inference mode only, it would fetch
`kernels-community/activation`'s layers from the Hub for those activations (`test_what_kernelization_maps_on_a_gpu`
reads transformers' own mapping). The package does not opt out: what changes is transformers' activation modules,
exactly as for Marian, and the fast CPU path (which computes the activations in its own kernels) never reads them.
docs/testing.md ("transformers 5.25's kernelization") says the same.
"""

import importlib.metadata

import pytest
import torch
from helpers import tiny_model, tiny_sources
from packaging.version import Version
from transformers import AutoModelForSeq2SeqLM
from transformers.utils import is_kernels_available

import hf_layerfusion
from hf_layerfusion.inference import fast_generate
from hf_layerfusion.modeling.configuration import ACTIVATIONS

KERNELIZING_RELEASE = Version("5.25.0")
pytestmark = pytest.mark.skipif(
    Version(importlib.metadata.version("transformers")) < KERNELIZING_RELEASE,
    reason="transformers before 5.25 does not kernelize models in from_pretrained",
)
# the `kernel_layer_name` of each activation's module, and the devices transformers maps a Hub kernel for (inference)
KERNEL_LAYERS = {
    "relu": {},
    "tanh": {},
    "gelu": {"GeLU": {"cuda", "rocm", "xpu"}},
    "gelu_new": {"NewGELU": {"cuda", "rocm", "xpu"}},
    "silu": {"SiLU": {"cuda", "rocm", "xpu"}},
    "swish": {},  # torch.nn.SiLU, not transformers' SiLUActivation
}
SEARCHES = {"greedy": dict(num_beams=1, max_new_tokens=8), "beam": dict(num_beams=3, max_new_tokens=8)}


def kernel_layer_modules(model) -> dict[str, list[torch.nn.Module]]:
    layers: dict[str, list[torch.nn.Module]] = {}
    for module in model.modules():
        name = getattr(type(module), "kernel_layer_name", None)
        if name is not None:
            layers.setdefault(name, []).append(module)
    return layers


def test_kernels_is_installed_as_transformers_requires():
    """The suite runs what users get: transformers 5.25 with `kernels`, kernelization on (USE_HUB_KERNELS unset or
    true)."""
    assert is_kernels_available()


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
@pytest.mark.parametrize("model_type", sorted(hf_layerfusion.FAMILIES))
def test_from_pretrained_kernelizes_without_changing_a_familys_outputs(model_type, activation, tmp_path, monkeypatch):
    monkeypatch.delenv("USE_HUB_KERNELS", raising=False)
    model = tiny_model(model_type, activation_function=activation)
    source = tiny_sources()
    decoder_input_ids = torch.full((source["input_ids"].shape[0], 4), model.config.decoder_start_token_id)
    with torch.no_grad():
        logits = model(**source, decoder_input_ids=decoder_input_ids).logits
        tokens = {name: model.generate(**source, **search) for name, search in SEARCHES.items()}
    model.save_pretrained(tmp_path)
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()

    assert loaded.use_kernels, "transformers 5.25 kernelizes every model it loads by default"
    layers = kernel_layer_modules(loaded)
    assert set(layers) == set(KERNEL_LAYERS[activation])
    for modules in layers.values():  # on the CPU: the class's own forward, put back by kernelize
        for module in modules:
            assert module.forward.__func__ is type(module).forward
    with torch.no_grad():
        assert torch.equal(loaded(**source, decoder_input_ids=decoder_input_ids).logits, logits)
        for name, search in SEARCHES.items():
            assert torch.equal(loaded.generate(**source, **search), tokens[name]), name
            assert torch.equal(fast_generate(loaded, **source, fallback=False, **search), tokens[name]), name


def test_what_kernelization_maps_on_a_gpu():
    """Read from transformers' own mapping: which of the families' layers get a Hub kernel, on which devices. A
    release that maps more (a LayerNorm, an attention) fails here: then write it down and check it."""
    from transformers.integrations.hub_kernels import get_kernel_mapping_transformers

    mapping = get_kernel_mapping_transformers()
    assert set(ACTIVATIONS) == set(KERNEL_LAYERS)
    for model_type in sorted(hf_layerfusion.FAMILIES):
        for activation in ACTIVATIONS:
            layers = kernel_layer_modules(tiny_model(model_type, activation_function=activation))
            mapped = {name: {str(device) for device in mapping.get(name, {})} for name in layers}
            assert mapped == KERNEL_LAYERS[activation], (model_type, activation, mapped)
