"""Pre-norm (`normalize_before=True`) against independent references.

- The plain backbone against transformers' `MBartForConditionalGeneration`, a pre-norm encoder-decoder with a final
  LayerNorm per stack: MBart always normalises the embeddings (`layernorm_embedding`) and learns its positions, so the
  backbone runs with its own embedding LayerNorm and MBart's position table holds the sinusoidal one. Logits and beam
  search must agree.
- The plain backbone without the embedding LayerNorm (the setting every family uses), both norms, against the
  encoder-decoder written out from the definitions in tests/helpers.py: `x + f(LN(x))` per sub-layer and a final
  LayerNorm per stack.
- Each family's pre-norm option against its paper formula computed on top of that reference, with the backbone's
  documented pre-norm choices: the readouts see s_0 (the embeddings) as it is and s_1..s_L through the stack's final
  LayerNorm (GTrans Eq. 2 and Eq. 4, RTAL's tree); layer-wise coordination's mixed attention normalises the source
  part with the block's LayerNorm and the decoder reads encoder state s_{i-1} before the final LayerNorm. Deep
  representations and Re-Transformer are checked in both norms in their own test files.

Models are float64 where the reference is hand-written, so that tolerances can be 1e-10: a LayerNorm in the wrong
place changes the logits by O(1).
"""

import pytest
import torch
from conftest import TINY_BACKBONE
from helpers import (
    assert_same_logits_and_beam_search,
    attention,
    causal_allowed,
    embed,
    float64_default,
    layer_norm,
    output_logits,
    padding_allowed,
    plain_attend,
    randomize_layer_norms,
    reference_encoder_decoder_logits,
    reference_stack,
    sinusoidal_table,
)
from test_backbone_marian import MARIAN_EOS, MARIAN_PAD, VOCAB, padded_source
from test_gtrans import build_gtrans, reference_group_log_probs, reference_memory, reference_psi
from test_rtal import FUNCTIONS, build_rtal, reference_tree
from transformers import MBartConfig, MBartForConditionalGeneration

from hf_layerfusion import (
    LayerwiseCoordinationConfig,
    LayerwiseCoordinationForConditionalGeneration,
    PlainTransformerConfig,
    PlainTransformerForConditionalGeneration,
)
from hf_layerfusion.modeling.conversion import _rename_marian_key, build_with_weights

MAX_POSITIONS = 64
# the tiny sizes (MBartConfig has every backbone size key) with Marian's special ids of test_backbone_marian.py
TINY_MBART = dict(
    TINY_BACKBONE,
    vocab_size=VOCAB,
    max_position_embeddings=MAX_POSITIONS,
    activation_function="relu",
    scale_embedding=True,
    pad_token_id=MARIAN_PAD,
    decoder_start_token_id=MARIAN_PAD,
    eos_token_id=MARIAN_EOS,
    bos_token_id=MARIAN_EOS,
)


# --------------------------------------------------------------------------------------------- MBart
def tiny_mbart(attn_implementation: str) -> MBartForConditionalGeneration:
    """A random tiny MBart (relu, scaled embeddings, no dropout) whose learned position table is the sinusoidal one;
    0.5-std weights and LayerNorms around 1 so that every weight and every LayerNorm matters."""
    config = MBartConfig(
        **TINY_MBART,
        forced_eos_token_id=MARIAN_EOS,
        attn_implementation=attn_implementation,
    )
    model = MBartForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "embed_positions" in name:
                # MBart's positions are rows offset + pos of a learned table (offset 2)
                param.zero_()
                param[param.shape[0] - MAX_POSITIONS :] = sinusoidal_table(MAX_POSITIONS, 16)
            else:
                is_gain = name.endswith(("layer_norm.weight", "layernorm_embedding.weight"))
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5 + (1.0 if is_gain else 0.0))
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=generator))
    return model


def backbone_from_mbart(mbart: MBartForConditionalGeneration) -> PlainTransformerForConditionalGeneration:
    """The plain backbone (pre-norm, embedding LayerNorm) carrying MBart's weights, renamed as `from_marian` renames
    Marian's; MBart's embedding LayerNorm goes to the backbone's."""
    state_dict = {}
    for key, value in mbart.state_dict().items():
        new_key = _rename_marian_key(key)
        if new_key is None or new_key.startswith("lm_head"):
            continue
        state_dict[new_key.replace(".layernorm_embedding.", ".embeddings.layernorm_embedding.")] = value
    config = dict(
        TINY_MBART, normalize_before=True, layernorm_embedding=True, attn_implementation=mbart.config._attn_implementation
    )
    model = build_with_weights("plain_transformer", config, state_dict, "MBart (in memory)").eval()
    # every MBart weight has its place: only the tied projection and the computed position tables are not loaded
    assert set(model.conversion_report["freshly_initialised"]) <= {"lm_head.weight"}
    model.generation_config = mbart.generation_config
    return model


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_plain_pre_norm_matches_mbart(attn_implementation):
    mbart = tiny_mbart(attn_implementation)
    model = backbone_from_mbart(mbart)
    assert model.model.encoder.layer_norm is not None and model.model.decoder.layer_norm is not None
    assert_same_logits_and_beam_search(mbart, model, padded_source(), atol=1e-5)


# --------------------------------------------------------------------------------------------- hand-written plain
def source_of(batch):
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def decoder_input_ids(model, batch_size=3, length=5):
    ids = torch.randint(4, model.config.vocab_size, (batch_size, length), generator=torch.Generator().manual_seed(9))
    ids[:, 0] = model.config.decoder_start_token_id
    return ids


@pytest.mark.parametrize("layernorm_embedding", [False, True])
@pytest.mark.parametrize("normalize_before", [True, False])
def test_plain_backbone_matches_hand_written_reference(normalize_before, layernorm_embedding, tiny_backbone, padded_batch):
    config = PlainTransformerConfig(
        **tiny_backbone, init_std=0.3, normalize_before=normalize_before, layernorm_embedding=layernorm_embedding
    )
    with float64_default():
        model = PlainTransformerForConditionalGeneration(config).eval()
    randomize_layer_norms(model)
    targets = decoder_input_ids(model)
    with torch.no_grad():
        logits = model(**source_of(padded_batch), decoder_input_ids=targets).logits
        expected = reference_encoder_decoder_logits(
            model, padded_batch["input_ids"], padded_batch["attention_mask"], targets, ["sf"] * 2, ["scf"] * 2,
            pre_norm=normalize_before, layernorm_embedding=layernorm_embedding,
        )
    assert expected.abs().max() > 1.0
    torch.testing.assert_close(logits, expected, atol=1e-10, rtol=0)


# --------------------------------------------------------------------------------------------- families
def pre_norm_readout_states(model, batch, targets, memory_from):
    """The hand-written pre-norm encoder and decoder states as readouts see them: s_0 as it is, s_1..s_L through the
    stack's final LayerNorm. `memory_from(encoder states)` is the memory every cross-attention reads. Returns the
    memory and the decoder states."""
    config, encoder, decoder = model.config, model.model.encoder, model.model.decoder
    source_mask = batch["attention_mask"]

    def readout_states(stack, ids, attend, layout):
        states = reference_stack(stack.layers, [layout] * len(stack.layers), embed(model, ids), True, lambda l, below: attend)
        return states[:1] + [layer_norm(state, stack.layer_norm) for state in states[1:]]

    encoder_attend = plain_attend(config.encoder_attention_heads, padding_allowed(source_mask, source_mask.shape[1]))
    memory = memory_from(readout_states(encoder, batch["input_ids"], encoder_attend, "sf"))
    decoder_attend = plain_attend(
        config.decoder_attention_heads, causal_allowed(*targets.shape), memory,
        padding_allowed(source_mask, targets.shape[1]),
    )
    return memory, readout_states(decoder, targets, decoder_attend, "scf")


def test_gtrans_pre_norm_eq2_eq4_eq5_on_normalised_states(tiny_backbone, padded_batch):
    """Eq. 2's memory fuses the final-LayerNorm'd encoder group outputs; Eq. 4's group features fuse the
    final-LayerNorm'd decoder layers; the logits are log of the Eq. 5 mixture."""
    with float64_default():
        model = build_gtrans(tiny_backbone, normalize_before=True)
    randomize_layer_norms(model)
    targets = decoder_input_ids(model)
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


@pytest.mark.parametrize("function_name", FUNCTIONS)
def test_rtal_pre_norm_tree_on_normalised_states(function_name, tiny_backbone, padded_batch):
    """The trees of both stacks over the final-LayerNorm'd layer outputs: encoder leaves 3..6 (residual of the first
    node: s_2 normalised), decoder leaves 1..4 (residual of the first node: s_0, the embeddings, as they are)."""
    with float64_default():
        model = build_rtal(tiny_backbone, aggregation_function=function_name, normalize_before=True)
    randomize_layer_norms(model)
    encoder, decoder = model.model.encoder, model.model.decoder
    targets = decoder_input_ids(model)
    with torch.no_grad():
        memory, decoder_states = pre_norm_readout_states(
            model, padded_batch, targets,
            lambda states: reference_tree(encoder.readout, function_name, "block_input", states, 3, 6),
        )
        root = reference_tree(decoder.readout, function_name, "block_input", decoder_states, 1, 4)
        out = model(**source_of(padded_batch), decoder_input_ids=targets)
    torch.testing.assert_close(out.encoder_last_hidden_state, memory, atol=1e-10, rtol=0)
    torch.testing.assert_close(out.logits, output_logits(model, root), atol=1e-10, rtol=0)


@pytest.mark.parametrize("normalize_before", [True, False])
def test_layerwise_coordination_matches_hand_written_model(normalize_before, tiny_backbone, padded_batch):
    """The paper's model (shared layers, mixed attention, language embeddings) written out: decoder layer i's one
    attention reads [encoder state s_{i-1} ; the decoder layer's input], both through the block's input normalisation
    (pre-norm: its LayerNorm), with source padding and future targets masked (Eq. 3); the decoder reads the encoder
    states before the encoder's final LayerNorm and ends in its own."""
    with float64_default():
        config = LayerwiseCoordinationConfig(
            **{**tiny_backbone, "encoder_layers": 3, "decoder_layers": 3}, init_std=0.3,
            normalize_before=normalize_before, attn_implementation="eager",
        )
        model = LayerwiseCoordinationForConditionalGeneration(config).eval()
    randomize_layer_norms(model)
    config, encoder, decoder = model.config, model.model.encoder, model.model.decoder
    source_mask = padded_batch["attention_mask"]
    source_allowed = padding_allowed(source_mask, source_mask.shape[1])
    targets = decoder_input_ids(model)
    with torch.no_grad():
        source_0 = embed(model, padded_batch["input_ids"]) + encoder.connection.language_embedding.weight[0]
        encoder_states = reference_stack(
            encoder.layers, ["sf"] * 3, source_0, normalize_before,
            lambda l, below: plain_attend(config.encoder_attention_heads, source_allowed),
        )
        mixed_allowed = torch.cat([padding_allowed(source_mask, targets.shape[1]), causal_allowed(*targets.shape)], -1)

        def mixed_attend(layer_index):
            def attend(kind, module, x, normalize):
                assert kind == "s"
                keys_from = torch.cat([normalize(encoder_states[layer_index - 1]), x], dim=1)
                return attention(module, x, keys_from, mixed_allowed, config.decoder_attention_heads)

            return attend

        target_0 = embed(model, targets) + decoder.connection.language_embedding.weight[0]
        decoder_states = reference_stack(
            decoder.layers, ["sf"] * 3, target_0, normalize_before, lambda l, below: mixed_attend(l)
        )
        top = layer_norm(decoder_states[-1], decoder.layer_norm) if normalize_before else decoder_states[-1]
        expected = output_logits(model, top)
        logits = model(**source_of(padded_batch), decoder_input_ids=targets).logits
    assert expected.abs().max() > 1.0
    torch.testing.assert_close(logits, expected, atol=1e-10, rtol=0)

