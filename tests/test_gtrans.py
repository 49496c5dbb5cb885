"""GTrans equations (numbered as in shared/papers/gtrans.txt) against brute-force references written here.

The layer counts are not multiples of the group sizes, so the last group of each stack is short:
encoder 7 layers, T_e = 3 -> groups end at layers alpha = (3, 6, 7); decoder 5 layers, T_d = 2 -> groups
{1, 2}, {3, 4}, {5}.
"""

import math

import pytest
import torch
from helpers import (
    assert_every_parameter_gets_a_gradient,
    float64_default,
    pre_norm_readout_states,
    randomize_layer_norms,
    seeded_decoder_inputs,
    source_of,
)

from hf_layerfusion import GTransConfig, GTransForConditionalGeneration

ENCODER_LAYERS, T_E = 7, 3
DECODER_LAYERS, T_D = 5, 2
DECODER_GROUPS = [[1, 2], [3, 4], [5]]  # 1-based layers of each decoder group


def build_gtrans(tiny_backbone, **overrides) -> GTransForConditionalGeneration:
    """A GTrans with random fusion weights (the paper starts them at 0, which would hide ordering mistakes), random
    fusion LayerNorm and logits bias, and a 0.5-std init so that the group distributions differ visibly."""
    config = GTransConfig(
        **{
            **tiny_backbone,
            "encoder_layers": ENCODER_LAYERS,
            "decoder_layers": DECODER_LAYERS,
            "encoder_group_size": T_E,
            "decoder_group_size": T_D,
            "init_std": 0.5,
            **overrides,
        }
    )
    model = GTransForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "readout" in name:
                param.copy_(
                    torch.randn(param.shape, generator=generator)
                    + (1.0 if name.endswith("layer_norm.weight") else 0.0)
                )
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=generator))
    return model


# ------------------------------------------------------------------------------------------- references
@torch.no_grad()
def reference_memory(model, encoder_states):
    """Eq. 2: LN(1/M sum_i sigma(w_i) h_{alpha_i}), alpha_i = min(i T_e, L_e); encoder_states[0] is the embedding."""
    fusion = model.model.encoder.readout
    num_groups = math.ceil(ENCODER_LAYERS / T_E)
    fused = (
        sum(
            torch.sigmoid(fusion.weight[i - 1]) * encoder_states[min(i * T_E, ENCODER_LAYERS)]
            for i in range(1, num_groups + 1)
        )
        / num_groups
    )
    mean = fused.mean(-1, keepdim=True)
    var = fused.var(-1, unbiased=False, keepdim=True)
    normed = (fused - mean) / torch.sqrt(var + model.config.layer_norm_eps)
    return normed * fusion.layer_norm.weight + fusion.layer_norm.bias


@torch.no_grad()
def reference_group_log_probs(model, decoder_states, groups):
    """Eq. 4-5: h_k = sum_{i in group k} sigma(w^dr_i) h_i; log P_k = log softmax(h_k W_o^T + b), in float64."""
    layer_weight = model.model.decoder.readout.layer_weight
    log_probs = []
    for k in groups:
        feature = sum(torch.sigmoid(layer_weight[i - 1]) * decoder_states[i] for i in DECODER_GROUPS[k - 1])
        scores = (feature @ model.lm_head.weight.T + model.final_logits_bias).double()
        log_probs.append(torch.log(torch.exp(scores) / torch.exp(scores).sum(-1, keepdim=True)))
    return torch.stack(log_probs)


@torch.no_grad()
def reference_psi(model, groups, temperature=None):
    """Eq. 6: psi = softmax(w^dp / tau) over the mixed groups, tau = sqrt(d_model)."""
    temperature = temperature or math.sqrt(model.config.d_model)
    scaled = model.model.decoder.readout.group_weight[[k - 1 for k in groups]].double() / temperature
    return torch.exp(scaled) / torch.exp(scaled).sum()


def reference_cross_entropy(log_probs, labels, label_smoothing):
    """Token-mean cross entropy over non-pad labels; smoothing puts eps/V on every class (HF LabelSmoother)."""
    keep = labels != -100
    token_log_probs = log_probs[keep]
    gold = labels[keep]
    nll = -token_log_probs[torch.arange(len(gold)), gold]
    uniform = -token_log_probs.mean(-1)
    return ((1 - label_smoothing) * nll + label_smoothing * uniform).mean()


@torch.no_grad()
def reference_outputs(model, batch, groups, label_smoothing):
    states = model(**batch, output_hidden_states=True, decoder_groups=groups)
    group_log_probs = reference_group_log_probs(model, states.decoder_hidden_states, groups)
    psi = reference_psi(model, groups)
    mixture = torch.log((psi[:, None, None, None] * group_log_probs.exp()).sum(0))  # Eq. 5
    loss = sum(
        psi[i] * reference_cross_entropy(group_log_probs[i], batch["labels"], label_smoothing)
        for i in range(len(groups))
    )
    return states, group_log_probs, psi, mixture, loss  # loss: Eq. 7


# ------------------------------------------------------------------------------------------- tests
def test_encoder_fusion_eq2_feeds_cross_attention(tiny_backbone, padded_batch):
    model = build_gtrans(tiny_backbone)
    with torch.no_grad():
        out = model(**padded_batch, output_hidden_states=True)
        assert len(out.encoder_hidden_states) == ENCODER_LAYERS + 1
        assert len(out.decoder_hidden_states) == DECODER_LAYERS + 1
        # hidden_states[0] is the embedding output sqrt(d) E[x] + P[pos] (the table is checked against Marian's)
        positions = model.model.encoder.embeddings.embed_positions.weight[: padded_batch["input_ids"].shape[1]]
        embedded = math.sqrt(model.config.d_model) * model.model.shared.weight[padded_batch["input_ids"]] + positions
        torch.testing.assert_close(out.encoder_hidden_states[0], embedded, atol=1e-5, rtol=0)
        memory = reference_memory(model, out.encoder_hidden_states)
        torch.testing.assert_close(out.encoder_last_hidden_state, memory, atol=1e-5, rtol=0)
        # every cross-attention reads the fused memory: a decoder fed the reference memory reproduces the states
        decoder = model.model.decoder(
            input_ids=model.prepare_decoder_input_ids_from_labels(padded_batch["labels"]),
            encoder_hidden_states=memory,
            encoder_attention_mask=padded_batch["attention_mask"],
            output_hidden_states=True,
        )
    for ours, reference in zip(out.decoder_hidden_states, decoder.hidden_states, strict=True):
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=0)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_decoder_fusion_mixture_and_loss_eq4_to_eq7(tiny_backbone, padded_batch, label_smoothing):
    model = build_gtrans(tiny_backbone, label_smoothing=label_smoothing)
    groups = [1, 2, 3]
    states, group_log_probs, psi, mixture, loss = reference_outputs(model, padded_batch, groups, label_smoothing)
    # the groups really disagree, so a wrong mixture would show
    assert (group_log_probs[0] - group_log_probs[1]).abs().max() > 0.5

    torch.testing.assert_close(states.logits.double(), mixture, atol=1e-5, rtol=0)
    torch.testing.assert_close(states.loss.double(), loss, atol=1e-5, rtol=0)
    assert states.group_log_probs is None and states.group_weights is None  # only on request

    with torch.no_grad():
        requested = model(**padded_batch, return_group_log_probs=True)
    torch.testing.assert_close(requested.group_log_probs.double(), group_log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(requested.group_weights.double(), psi, atol=1e-6, rtol=0)
    torch.testing.assert_close(requested.loss.double(), loss, atol=1e-5, rtol=0)

    # training mode takes the fused memory-aware path: same Eq. 7 value
    model.train()
    trained = model(**padded_batch)
    assert trained.logits is None
    torch.testing.assert_close(trained.loss.double(), loss, atol=1e-5, rtol=0)
    trained.loss.backward()
    assert model.model.decoder.readout.group_weight.grad.abs().min() > 0

    # the Trainer's token count replaces the per-batch mean: sum over tokens / num_items_in_batch
    tokens = int((padded_batch["labels"] != -100).sum())
    with torch.no_grad():
        scaled = model(**padded_batch, num_items_in_batch=torch.tensor(3 * tokens))
    torch.testing.assert_close(scaled.loss.double(), loss / 3, atol=1e-5, rtol=0)


def test_probability_temperature(tiny_backbone, padded_batch):
    model = build_gtrans(tiny_backbone, probability_temperature=0.5)
    with torch.no_grad():
        out = model(**padded_batch, return_group_log_probs=True)
    torch.testing.assert_close(
        out.group_weights.double(), reference_psi(model, [1, 2, 3], temperature=0.5), atol=1e-6, rtol=0
    )


def count_decoder_layer_calls(model):
    calls = [0] * len(model.model.decoder.layers)

    def hook(index):
        def count(*_):
            calls[index] += 1

        return count

    handles = [layer.register_forward_hook(hook(i)) for i, layer in enumerate(model.model.decoder.layers)]
    return calls, handles


@pytest.mark.parametrize(
    "groups, layers_run",
    [([1, 2], [1, 1, 1, 1, 0]), ([1], [1, 1, 0, 0, 0]), ([2, 3], [1, 1, 1, 1, 1]), ([3], [1, 1, 1, 1, 1])],
)
def test_decoder_group_subset(tiny_backbone, padded_batch, groups, layers_run):
    model = build_gtrans(tiny_backbone, label_smoothing=0.1)
    _, group_log_probs, psi, mixture, loss = reference_outputs(model, padded_batch, groups, 0.1)
    assert abs(float(psi.sum()) - 1.0) < 1e-9  # psi renormalised over the subset

    calls, handles = count_decoder_layer_calls(model)
    with torch.no_grad():
        out = model(**padded_batch, decoder_groups=groups, return_group_log_probs=True)
    for handle in handles:
        handle.remove()
    assert calls == layers_run  # layers above the highest kept group are not computed

    # a single group's logits are plain vocabulary scores: compare them as distributions
    torch.testing.assert_close(torch.log_softmax(out.logits.double(), -1), mixture, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.loss.double(), loss, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.group_log_probs.double(), group_log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.group_weights.double(), psi, atol=1e-6, rtol=0)

    model.train()
    torch.testing.assert_close(model(**padded_batch, decoder_groups=groups).loss.double(), loss, atol=1e-5, rtol=0)


def test_encoder_fusion_off_reads_top_layer(tiny_backbone, padded_batch):
    model = build_gtrans(tiny_backbone, encoder_fusion=False)
    assert not any(name.startswith("model.encoder.readout") for name, _ in model.named_parameters())
    with torch.no_grad():
        out = model(**padded_batch, output_hidden_states=True)
        torch.testing.assert_close(out.encoder_last_hidden_state, out.encoder_hidden_states[-1], atol=0, rtol=0)
        decoder = model.model.decoder(
            input_ids=model.prepare_decoder_input_ids_from_labels(padded_batch["labels"]),
            encoder_hidden_states=out.encoder_hidden_states[-1],
            encoder_attention_mask=padded_batch["attention_mask"],
            output_hidden_states=True,
        )
    torch.testing.assert_close(out.decoder_hidden_states[-1], decoder.hidden_states[-1], atol=1e-6, rtol=0)
    # decoder fusion stays on: the output is still the Eq. 5 mixture
    _, _, _, mixture, _ = reference_outputs(model, padded_batch, [1, 2, 3], 0.0)
    torch.testing.assert_close(out.logits.double(), mixture, atol=1e-5, rtol=0)


def test_decoder_fusion_off_single_softmax_from_top_layer(tiny_backbone, padded_batch):
    model = build_gtrans(tiny_backbone, decoder_fusion=False, label_smoothing=0.1)
    assert model.config.num_decoder_groups == 1
    assert not any(name.startswith("model.decoder.readout") for name, _ in model.named_parameters())
    with torch.no_grad():
        out = model(**padded_batch, output_hidden_states=True)
    top = out.decoder_hidden_states[-1]
    scores = (top @ model.lm_head.weight.T + model.final_logits_bias).double()
    log_probs = scores - scores.logsumexp(-1, keepdim=True)
    torch.testing.assert_close(torch.log_softmax(out.logits.double(), -1), log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(
        out.loss.double(), reference_cross_entropy(log_probs, padded_batch["labels"], 0.1), atol=1e-5, rtol=0
    )
    # the encoder is still fused (Eq. 2)
    torch.testing.assert_close(
        out.encoder_last_hidden_state, reference_memory(model, out.encoder_hidden_states), atol=1e-5, rtol=0
    )
    with pytest.raises(ValueError, match=r"decoder_groups.*\[2\]"):
        model(**padded_batch, decoder_groups=[2])


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_gtrans_training_gradients_equal_unfused_path(tiny_backbone, padded_batch, label_smoothing):
    """Every parameter's gradient from the fused training path equals the one from the unfused Eq. 5-7 path
    (taken in the same training-mode forward when group log-probabilities are requested)."""
    model = build_gtrans(tiny_backbone, label_smoothing=label_smoothing).train()

    def gradients(**kwargs):
        model.zero_grad(set_to_none=True)
        output = model(**padded_batch, num_items_in_batch=torch.tensor(20), **kwargs)
        output.loss.backward()
        return output, {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    fused_output, fused = gradients()
    assert fused_output.logits is None  # the fused path ran
    unfused_output, unfused = gradients(return_group_log_probs=True)
    assert unfused_output.logits is not None
    torch.testing.assert_close(fused_output.loss, unfused_output.loss, atol=1e-5, rtol=1e-5)
    assert fused.keys() == unfused.keys()
    for name in unfused:
        torch.testing.assert_close(fused[name], unfused[name], atol=1e-5, rtol=1e-4, msg=lambda m: f"{name}: {m}")


def test_gradients_reach_every_parameter(tiny_backbone, padded_batch):
    model = build_gtrans(tiny_backbone, label_smoothing=0.1)
    gradients = assert_every_parameter_gets_a_gradient(model, padded_batch)
    fusion = [name for name in gradients if "readout" in name]
    assert sorted(fusion) == [
        "model.decoder.readout.group_weight",
        "model.decoder.readout.layer_weight",
        "model.encoder.readout.layer_norm.bias",
        "model.encoder.readout.layer_norm.weight",
        "model.encoder.readout.weight",
    ]
    for name in fusion:
        if "layer_norm" not in name:
            assert (gradients[name] != 0).all(), f"some fusion weight of {name} gets no gradient: {gradients[name]}"


# ------------------------------------------------------------------------------------------- pre-norm
def test_gtrans_pre_norm_eq2_eq4_eq5_on_normalised_states(tiny_backbone, padded_batch):
    """Eq. 2's memory fuses the final-LayerNorm'd encoder group outputs; Eq. 4's group features fuse the
    final-LayerNorm'd decoder layers; the logits are log of the Eq. 5 mixture."""
    with float64_default():
        model = build_gtrans(tiny_backbone, normalize_before=True)
    randomize_layer_norms(model)
    targets = seeded_decoder_inputs(model)
    with torch.no_grad():
        memory, decoder_states = pre_norm_readout_states(
            model, padded_batch, targets, lambda states: reference_memory(model, states)  # Eq. 2
        )
        groups = [1, 2, 3]
        group_log_probs = reference_group_log_probs(model, decoder_states, groups)  # Eq. 4
        psi = reference_psi(model, groups)
        mixture = torch.log((psi[:, None, None, None] * group_log_probs.exp()).sum(0))  # Eq. 5
        out = model(**source_of(padded_batch), decoder_input_ids=targets)
    assert (group_log_probs[0] - group_log_probs[1]).abs().max() > 0.5  # the groups disagree
    torch.testing.assert_close(out.encoder_last_hidden_state, memory, atol=1e-10, rtol=0)
    # GTrans mixes the group softmaxes in float32 whatever the model's dtype
    torch.testing.assert_close(out.logits.double(), mixture, atol=1e-5, rtol=0)
