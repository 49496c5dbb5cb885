"""The GTrans study knobs (docs/gtrans_study.md): initial fusion weights, dropout on fused states, and fusion weights
kept out of weight decay. References are written out here (parameter names, sigmoid scaling, dropout masks)."""

import math

import pytest
import torch
from transformers import Seq2SeqTrainingArguments
from transformers.trainer import Trainer

from hf_layerfusion import (
    GTransConfig,
    GTransForConditionalGeneration,
    PlainTransformerConfig,
    PlainTransformerForConditionalGeneration,
)
from hf_layerfusion.training.trainer import LayerFusionSeq2SeqTrainer

# encoder 3 layers / T_e = 2 -> 2 groups; decoder 3 layers / T_d = 2 -> groups {1, 2}, {3}
SHAPE = dict(encoder_layers=3, decoder_layers=3, encoder_group_size=2, decoder_group_size=2)
GTRANS_FUSION_WEIGHTS = {  # every fusion weight of this GTrans, by the name named_parameters() gives it
    "model.encoder.readout.weight",  # w^e (Eq. 2)
    "model.decoder.readout.layer_weight",  # w^{dr} (Eq. 4)
    "model.decoder.readout.group_weight",  # w^{dp} (Eq. 6)
}


def gtrans(tiny_backbone, **overrides) -> GTransForConditionalGeneration:
    return GTransForConditionalGeneration(GTransConfig(**{**tiny_backbone, **SHAPE, **overrides}))


def optimizer_groups(model, tmp_path, weight_decay=0.1) -> tuple[set[str], set[str]]:
    """Names of the parameters in the optimizer's decayed group and in its undecayed group."""
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), weight_decay=weight_decay, report_to="none", use_cpu=True)
    optimizer = LayerFusionSeq2SeqTrainer(model=model, args=args).create_optimizer()
    names = {id(p): n for n, p in model.named_parameters()}
    by_decay = {group["weight_decay"]: {names[id(p)] for p in group["params"]} for group in optimizer.param_groups}
    return by_decay[weight_decay], by_decay[0.0]


def stock_decayed(model) -> set[str]:
    """What `Seq2SeqTrainer` decays (its list also names the tied aliases of the embedding, which the optimizer
    sees once, under the name `named_parameters()` gives)."""
    return set(Trainer.get_decay_parameter_names(None, model)) & dict(model.named_parameters()).keys()


# ----------------------------------------------------------------------------------------- weight decay
def test_fusion_weights_are_exactly_the_readout_gates(tiny_backbone):
    assert set(gtrans(tiny_backbone).fusion_parameter_names()) == GTRANS_FUSION_WEIGHTS
    plain = PlainTransformerForConditionalGeneration(PlainTransformerConfig(**tiny_backbone))
    assert plain.fusion_parameter_names() == []


def test_fusion_weights_are_not_decayed_by_default(tmp_path, tiny_backbone):
    model = gtrans(tiny_backbone)
    decayed, undecayed = optimizer_groups(model, tmp_path)
    assert GTRANS_FUSION_WEIGHTS <= undecayed and not GTRANS_FUSION_WEIGHTS & decayed
    # everything else is as transformers decides: the no-decay group gains exactly the fusion weights
    stock = stock_decayed(model)
    assert stock - decayed == GTRANS_FUSION_WEIGHTS
    assert decayed <= stock and "model.encoder.layers.0.self_attn.q_proj.weight" in decayed


def test_decay_fusion_weights_puts_them_back(tmp_path, tiny_backbone):
    model = gtrans(tiny_backbone, decay_fusion_weights=True)
    decayed, _ = optimizer_groups(model, tmp_path)
    assert GTRANS_FUSION_WEIGHTS <= decayed
    assert decayed == stock_decayed(model)


def test_fusion_weights_keep_their_value_under_weight_decay(tmp_path, tiny_backbone):
    """One AdamW step with a zero loss: only decay moves parameters, so the gates stay unless they are decayed."""
    for decay_fusion_weights, moved in ((False, False), (True, True)):
        model = gtrans(tiny_backbone, fusion_weight_init=2.0, decay_fusion_weights=decay_fusion_weights)
        args = Seq2SeqTrainingArguments(
            output_dir=str(tmp_path), weight_decay=0.5, learning_rate=0.1, report_to="none", use_cpu=True
        )
        optimizer = LayerFusionSeq2SeqTrainer(model=model, args=args).create_optimizer()
        for param in model.parameters():
            param.grad = torch.zeros_like(param)
        optimizer.step()
        gate = model.model.decoder.readout.layer_weight
        expected = 2.0 * (1 - 0.1 * 0.5) if moved else 2.0  # AdamW: w <- w - lr * wd * w
        torch.testing.assert_close(gate.detach(), torch.full_like(gate, expected))


# --------------------------------------------------------------------------------------- initial weights
@pytest.mark.parametrize("initial", [0.0, 1.0, -0.75])
def test_fusion_weight_init_reaches_every_fusion_weight(tmp_path, tiny_backbone, initial):
    model = gtrans(tiny_backbone, fusion_weight_init=initial)
    for name, param in model.named_parameters():
        if name in GTRANS_FUSION_WEIGHTS:
            assert torch.equal(param.detach(), torch.full_like(param, initial)), name
    model.save_pretrained(tmp_path)
    assert GTransForConditionalGeneration.from_pretrained(tmp_path).config.fusion_weight_init == initial


@torch.no_grad()
def test_fusion_weight_init_scales_decoder_groups_but_not_the_normalised_memory(tiny_backbone, padded_batch):
    """Eq. 4 has no LayerNorm: sigma(w) scales each group feature. Eq. 2 normalises: equal gates (and 1/M) cancel."""
    torch.manual_seed(3)
    reference = gtrans(tiny_backbone).eval()
    shifted = gtrans(tiny_backbone, fusion_weight_init=1.0).eval()
    weights = {k: v for k, v in reference.state_dict().items() if k not in GTRANS_FUSION_WEIGHTS}
    shifted.load_state_dict(weights, strict=False)  # same network, only the fusion weights differ
    inputs = dict(input_ids=padded_batch["input_ids"], attention_mask=padded_batch["attention_mask"])
    memory_0 = reference.get_encoder()(**inputs).last_hidden_state
    memory_1 = shifted.get_encoder()(**inputs).last_hidden_state
    torch.testing.assert_close(memory_1, memory_0, atol=1e-4, rtol=1e-4)  # LayerNorm eps is the only difference

    decoder_input_ids = reference.prepare_decoder_input_ids_from_labels(padded_batch["labels"])
    out = reference(**inputs, decoder_input_ids=decoder_input_ids, output_hidden_states=True)
    states = list(out.decoder_hidden_states)  # [s_0 (embeddings), s_1, s_2, s_3]: post-norm, no connection
    assert len(states) == 4
    for model, w in ((reference, 0.0), (shifted, 1.0)):
        features = model.model.decoder.readout.group_features(states, [1, 2])
        sigma = 1 / (1 + math.exp(-w))
        torch.testing.assert_close(features[0], sigma * (states[1] + states[2]))
        torch.testing.assert_close(features[1], sigma * states[3])


# ------------------------------------------------------------------------------------- fused-state dropout
def test_fused_state_dropout_is_off_by_default_and_in_eval(tiny_backbone, padded_batch):
    inputs = dict(input_ids=padded_batch["input_ids"], attention_mask=padded_batch["attention_mask"])
    model = gtrans(tiny_backbone)  # tiny backbone: every other dropout is 0
    train_memory = model.train().get_encoder()(**inputs).last_hidden_state
    eval_memory = model.eval().get_encoder()(**inputs).last_hidden_state
    torch.testing.assert_close(train_memory, eval_memory)
    with_dropout = gtrans(tiny_backbone, fused_state_dropout=0.5)
    with_dropout.load_state_dict(model.state_dict())
    torch.testing.assert_close(with_dropout.eval().get_encoder()(**inputs).last_hidden_state, eval_memory)


@torch.no_grad()
def test_fused_state_dropout_drops_memory_and_group_features(tiny_backbone, padded_batch):
    p = 0.5
    model = gtrans(tiny_backbone, d_model=64, encoder_attention_heads=2, decoder_attention_heads=2, fused_state_dropout=p)
    inputs = dict(input_ids=padded_batch["input_ids"], attention_mask=padded_batch["attention_mask"])
    clean = model.eval().get_encoder()(**inputs).last_hidden_state
    dropped = model.train().get_encoder()(**inputs).last_hidden_state
    kept = dropped != 0
    assert 0.35 < 1 - kept.float().mean().item() < 0.65  # about p of the entries are zeroed
    torch.testing.assert_close(dropped[kept], clean[kept] / (1 - p))  # the rest rescaled by 1 / (1 - p)

    states = [torch.randn(3, 4, 64) for _ in range(4)]
    readout = model.model.decoder.readout
    clean_features = readout.eval().group_features(states, [1, 2])
    for feature, clean_feature in zip(readout.train().group_features(states, [1, 2]), clean_features):
        kept = feature != 0
        assert 0.35 < 1 - kept.float().mean().item() < 0.65
        torch.testing.assert_close(feature[kept], clean_feature[kept] / (1 - p))


# ---------------------------------------------------------------------------------------------- validation
@pytest.mark.parametrize(
    "key, value",
    [("fusion_weight_init", math.nan), ("fusion_weight_init", math.inf), ("fused_state_dropout", 1.0),
     ("fused_state_dropout", -0.1)],
)
def test_bad_knob_values_are_refused_by_name(tiny_backbone, key, value):
    with pytest.raises(ValueError, match=key):
        GTransConfig(**{**tiny_backbone, **SHAPE, key: value})
