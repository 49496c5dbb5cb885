"""The shared backbone with no fusion computes what `transformers.MarianMTModel` computes, weight for weight."""

import pytest
import torch
from helpers import MARIAN_EOS, MARIAN_PAD, assert_every_parameter_gets_a_gradient, padded_source, tiny_marian

import hf_layerfusion
from hf_layerfusion import GTransConfig, PlainTransformerConfig

CONVERSIONS = {
    "plain_transformer": dict(model_type="plain_transformer"),
    "gtrans_fusion_off": dict(model_type="gtrans", encoder_fusion=False, decoder_fusion=False),
}


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("conversion", sorted(CONVERSIONS))
def test_converted_model_matches_marian(attn_implementation, conversion):
    marian = tiny_marian(attn_implementation)
    model = hf_layerfusion.from_marian(
        marian, attn_implementation=attn_implementation, **CONVERSIONS[conversion]
    ).eval()
    assert model.config._attn_implementation == attn_implementation
    assert model.config.model_type == CONVERSIONS[conversion]["model_type"]
    # only tensors that are not Marian weights stay unloaded: the tied output projection and the computed tables
    assert set(model.conversion_report["freshly_initialised"]) <= {
        "lm_head.weight",
        "model.encoder.embeddings.embed_positions.weight",
        "model.decoder.embeddings.embed_positions.weight",
    }
    batch = padded_source()

    with torch.no_grad():
        expected = marian(**batch).logits
        logits = model(**batch).logits
    assert expected.abs().max() > 1.0  # the comparison is not between near-zero tensors
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)

    generate_kwargs = dict(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        num_beams=4,
        max_length=12,
        output_scores=True,
        return_dict_in_generate=True,
    )
    expected = marian.generate(**generate_kwargs)
    generated = model.generate(**generate_kwargs)
    assert generated.sequences.tolist() == expected.sequences.tolist()
    torch.testing.assert_close(generated.sequences_scores, expected.sequences_scores, atol=1e-4, rtol=0)


def test_from_marian_directory_and_position_tables(tmp_path):
    marian = tiny_marian("eager", scale_embedding=False)
    marian.save_pretrained(tmp_path)
    model = hf_layerfusion.from_marian(str(tmp_path), model_type="plain_transformer").eval()
    assert model.config.scale_embedding is False
    for ours, theirs in (
        (model.model.encoder.embeddings.embed_positions, marian.model.encoder.embed_positions),
        (model.model.decoder.embeddings.embed_positions, marian.model.decoder.embed_positions),
    ):
        assert ours.weight.shape == theirs.weight.shape == (64, 16)
        torch.testing.assert_close(ours.weight, theirs.weight, atol=1e-6, rtol=0)
        assert not ours.weight.requires_grad
    # the Marian generation settings travel with the weights
    assert model.generation_config.forced_eos_token_id == MARIAN_EOS
    assert model.generation_config.decoder_start_token_id == MARIAN_PAD
    batch = padded_source()
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, marian(**batch).logits, atol=1e-4, rtol=0)


@pytest.mark.filterwarnings("ignore:.*quantiz")  # torch.ao's eager-mode quantization: deprecated, still what users call
def test_dynamically_quantized_model_computes_what_the_dynamically_quantized_marian_computes():
    """`torch.ao.quantization.quantize_dynamic(model, {nn.Linear})`, the CPU int8 recipe users apply to MarianMTModel,
    swaps every linear layer, the output projection included, for a quantized module: the converted model then
    computes the quantized Marian's logits and translations, not the float ones (the projection is called as a
    module, never read as a weight)."""
    marian = tiny_marian("sdpa")
    model = hf_layerfusion.from_marian(marian, attn_implementation="sdpa", model_type="plain_transformer").eval()
    quantized_marian, quantized = (
        torch.ao.quantization.quantize_dynamic(m, {torch.nn.Linear}, dtype=torch.qint8) for m in (marian, model)
    )
    assert type(quantized.lm_head) is type(quantized_marian.lm_head) is not torch.nn.Linear
    batch = padded_source()
    with torch.no_grad():
        expected, logits, unquantized = quantized_marian(**batch).logits, quantized(**batch).logits, marian(**batch).logits
    assert (expected - unquantized).abs().max() > 0.05  # quantization changed the numbers the comparison is about
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)
    for num_beams in (1, 4):
        settings = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=num_beams,
                        max_length=12)
        assert quantized.generate(**settings).tolist() == quantized_marian.generate(**settings).tolist()


@pytest.mark.parametrize("config_class", [PlainTransformerConfig, GTransConfig])
def test_pre_norm_forward_backward(config_class, tiny_backbone, padded_batch):
    extra = dict(encoder_group_size=1, decoder_group_size=1) if config_class is GTransConfig else {}
    config = config_class(**tiny_backbone, normalize_before=True, **extra)
    model = hf_layerfusion.FAMILIES[config.model_type].for_conditional_generation(config)
    assert model.model.encoder.layer_norm is not None and model.model.decoder.layer_norm is not None
    assert_every_parameter_gets_a_gradient(model, padded_batch)


def test_attentions_and_hidden_states_match_marian():
    """With eager attention, every returned attention map and hidden state equals Marian's."""
    marian = tiny_marian("eager")
    model = hf_layerfusion.from_marian(marian, model_type="plain_transformer").eval()
    batch = padded_source()
    with torch.no_grad():
        expected = marian(**batch, output_attentions=True, output_hidden_states=True)
        outputs = model(**batch, output_attentions=True, output_hidden_states=True)
    for name in (
        "encoder_attentions",
        "decoder_attentions",
        "cross_attentions",
        "encoder_hidden_states",
        "decoder_hidden_states",
    ):
        ours, theirs = getattr(outputs, name), getattr(expected, name)
        assert len(ours) == len(theirs), name
        for layer, (a, b) in enumerate(zip(ours, theirs)):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=0, msg=f"{name}[{layer}]")


def test_output_attentions_needs_eager():
    model = hf_layerfusion.from_marian(tiny_marian("sdpa"), model_type="plain_transformer").eval()
    with pytest.raises(ValueError, match="attn_implementation='eager'"):
        model(**padded_source(), output_attentions=True)
