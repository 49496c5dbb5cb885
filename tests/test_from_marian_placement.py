"""`from_marian` never drops a Marian weight silently (issue 37 item 5): for every family and every layout option,
each weight of a tiny MarianMTModel is either in the converted model (the same tensor) or named by the refusal and,
with `allow_dropped_weights=True`, listed in `conversion_report["not_loaded"]`."""

import itertools

import pytest
import torch

import hf_layerfusion
from hf_layerfusion.modeling.conversion import _rename_marian_key

from helpers import tiny_marian

LAYERWISE = [
    dict(share_layer_parameters=share, mixed_attention=mixed, unshared_cross_attention=unshared,
         layerwise_memory=memory)
    for share, mixed, unshared, memory in itertools.product([True, False], repeat=4)
    if not (mixed and (unshared or not memory))  # the config refuses these (cross-attention options without one)
]
CASES = [
    ("plain_transformer", {}),
    ("plain_transformer", dict(normalize_before=True)),
    ("gtrans", dict(encoder_group_size=1, decoder_group_size=1)),
    ("gtrans", dict(encoder_fusion=False, decoder_fusion=False)),
    ("rtal", {}),
    ("rtal", dict(encoder_aggregation=False, decoder_aggregation=False)),
    *[("deep_representations", dict(encoder_aggregation=s, decoder_aggregation=s))
      for s in ("dense", "linear", "iterative", "hierarchical")],
    ("re_transformer", dict(encoder_layout="sf-sf")),
    ("re_transformer", dict(encoder_layout="s-sff", decoder_layers=1)),
    ("re_transformer", dict(encoder_layout="sf-sf", decoder_layout="scf-sf")),
    *[("layerwise_coordination", options) for options in LAYERWISE],
]


@pytest.fixture(scope="module")
def marian():
    return tiny_marian("eager")


@pytest.mark.parametrize(("model_type", "options"), CASES, ids=[f"{t}-{o}" for t, o in CASES])
def test_every_marian_weight_is_placed_or_reported(marian, model_type, options):
    model = hf_layerfusion.from_marian(marian, model_type=model_type, allow_dropped_weights=True, **options)
    own = model.state_dict()
    lost = set()
    for key, value in marian.state_dict().items():
        new_key = _rename_marian_key(key)
        if new_key is None or new_key.startswith("lm_head"):  # computed position tables; the tied projection
            continue
        if new_key not in own or not torch.equal(own[new_key], value):
            lost.add(new_key)
    assert set(model.conversion_report["not_loaded"]) == lost
    if not lost:
        hf_layerfusion.from_marian(marian, model_type=model_type, **options)  # nothing to refuse
        return
    with pytest.raises(ValueError, match=rf"{len(lost)} weights of Marian checkpoint .* would be dropped") as raised:
        hf_layerfusion.from_marian(marian, model_type=model_type, **options)
    message = str(raised.value)
    assert "allow_dropped_weights=True" in message
    if model_type == "layerwise_coordination":
        assert "unshared_cross_attention=True" in message and "share_layer_parameters=False" in message


def test_a_tied_parameter_keeps_its_source_weights(marian):
    """Shared layers: decoder layer i computes with encoder layer i's parameters, which hold the Marian encoder's
    tensors (not the decoder's, as before, which overwrote them)."""
    model = hf_layerfusion.from_marian(
        marian, model_type="layerwise_coordination", mixed_attention=False, unshared_cross_attention=True,
        allow_dropped_weights=True,
    )
    ours, theirs = model.model, marian.model
    assert torch.equal(ours.encoder.layers[0].self_attn.q_proj.weight, theirs.encoder.layers[0].self_attn.q_proj.weight)
    assert ours.decoder.layers[0].self_attn.q_proj.weight is ours.encoder.layers[0].self_attn.q_proj.weight
    assert torch.equal(ours.decoder.layers[1].encoder_attn.k_proj.weight,
                       theirs.decoder.layers[1].encoder_attn.k_proj.weight)
