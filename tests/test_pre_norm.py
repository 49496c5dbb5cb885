"""Pre-norm (`normalize_before=True`) of the backbone against independent references.

- The plain backbone against transformers' `MBartForConditionalGeneration`, a pre-norm encoder-decoder with a final
  LayerNorm per stack: MBart always normalises the embeddings (`layernorm_embedding`) and learns its positions, so the
  backbone runs with its own embedding LayerNorm and MBart's position table holds the sinusoidal one. Logits and beam
  search must agree.
- The plain backbone without the embedding LayerNorm (the setting every family uses), both norms, against the
  encoder-decoder written out from the definitions in tests/helpers.py: `x + f(LN(x))` per sub-layer and a final
  LayerNorm per stack.

Each family's pre-norm option is checked in its own test file against its paper formula computed on top of that
reference (`helpers.pre_norm_readout_states`), with the backbone's documented pre-norm choices: the readouts see s_0
(the embeddings) as it is and s_1..s_L through the stack's final LayerNorm (GTrans Eq. 2 and Eq. 4, RTAL's tree);
layer-wise coordination's mixed attention normalises the source part with the block's LayerNorm and the decoder reads
encoder state s_{i-1} before the final LayerNorm; deep representations and Re-Transformer in both norms.

Models are float64 where the reference is hand-written, so that tolerances can be 1e-10: a LayerNorm in the wrong
place changes the logits by O(1).
"""

import pytest
import torch
from helpers import (
    MARIAN_EOS,
    MARIAN_PAD,
    MARIAN_VOCAB,
    TINY_BACKBONE,
    assert_same_logits_and_beam_search,
    float64_default,
    padded_source,
    randomize_layer_norms,
    reference_encoder_decoder_logits,
    seeded_decoder_inputs,
    sinusoidal_table,
    source_of,
)
from transformers import MBartConfig, MBartForConditionalGeneration

from hf_layerfusion import PlainTransformerConfig, PlainTransformerForConditionalGeneration
from hf_layerfusion.modeling.conversion import _rename_marian_key, build_with_weights

MAX_POSITIONS = 64
# the tiny sizes (MBartConfig has every backbone size key) with the special ids of `helpers.tiny_marian`
TINY_MBART = dict(
    TINY_BACKBONE,
    vocab_size=MARIAN_VOCAB,
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
@pytest.mark.parametrize("layernorm_embedding", [False, True])
@pytest.mark.parametrize("normalize_before", [True, False])
def test_plain_backbone_matches_hand_written_reference(normalize_before, layernorm_embedding, tiny_backbone, padded_batch):
    config = PlainTransformerConfig(
        **tiny_backbone, init_std=0.3, normalize_before=normalize_before, layernorm_embedding=layernorm_embedding
    )
    with float64_default():
        model = PlainTransformerForConditionalGeneration(config).eval()
    randomize_layer_norms(model)
    targets = seeded_decoder_inputs(model)
    with torch.no_grad():
        logits = model(**source_of(padded_batch), decoder_input_ids=targets).logits
        expected = reference_encoder_decoder_logits(
            model, padded_batch["input_ids"], padded_batch["attention_mask"], targets, ["sf"] * 2, ["scf"] * 2,
            pre_norm=normalize_before, layernorm_embedding=layernorm_embedding,
        )
    assert expected.abs().max() > 1.0
    torch.testing.assert_close(logits, expected, atol=1e-10, rtol=0)
