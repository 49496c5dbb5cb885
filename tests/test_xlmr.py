"""`from_xlmr`: the initialised encoder computes what `XLMRobertaModel` computes, layer by layer."""

import pytest
import torch
from transformers import (
    BertConfig,
    BertModel,
    XLMRobertaConfig,
    XLMRobertaForMaskedLM,
    XLMRobertaModel,
    XLMRobertaTokenizer,
)

import hf_layerfusion
from hf_layerfusion import GTransConfig
from hf_layerfusion.modeling.presets import BACKBONE_PRESETS
from hf_layerfusion.modeling.xlmr import backbone_config_from_xlmr, from_xlmr, load_xlmr_tokenizer

TINY_XLMR = dict(
    vocab_size=40,
    hidden_size=32,
    num_hidden_layers=4,
    num_attention_heads=4,
    intermediate_size=48,
    max_position_embeddings=24,  # 24 - pad 1 - 1 = 22 backbone positions
    type_vocab_size=1,
    layer_norm_eps=1e-5,
    hidden_act="gelu",
)
# GTrans defaults need >= 3 encoder / >= 2 decoder layers; the tiny XLM-R has 4, so the decoder defaults to 2
SMALL_FAMILY = dict(encoder_group_size=2, decoder_group_size=1)


def _randomised_xlmr(**overrides) -> XLMRobertaModel:
    """A tiny XLM-R whose every parameter (LayerNorms and biases included) is random, so a mis-mapped tensor shows."""
    model = XLMRobertaModel(XLMRobertaConfig(**{**TINY_XLMR, **overrides})).eval()
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    return model


@pytest.fixture(scope="module")
def xlmr_dir(tmp_path_factory):
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny_xlmr")
    _randomised_xlmr().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def xlmr(xlmr_dir):
    return XLMRobertaModel.from_pretrained(xlmr_dir).eval()


@pytest.fixture
def padded_source():
    """Two sentences with <s> ... </s>, the second right-padded (pad id 1)."""
    input_ids = torch.tensor([[0, 5, 17, 9, 33, 12, 2], [0, 21, 8, 2, 1, 1, 1]])
    return input_ids, input_ids.ne(1).long()


def _assert_hidden_states_equal(model, xlmr, input_ids, attention_mask):
    ours = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    reference = xlmr(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True)
    assert len(ours.hidden_states) == len(reference.hidden_states) == TINY_XLMR["num_hidden_layers"] + 1
    for layer, (mine, theirs) in enumerate(zip(ours.hidden_states, reference.hidden_states)):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0, msg=f"hidden state {layer} differs")
    return ours, reference


@pytest.mark.parametrize("model_type", ["gtrans", "plain_transformer"])
def test_encoder_equals_xlmr_at_every_layer(xlmr_dir, xlmr, padded_source, model_type):
    overrides = dict(SMALL_FAMILY, encoder_fusion=False) if model_type == "gtrans" else {}
    model = from_xlmr(str(xlmr_dir), model_type=model_type, **overrides).eval()
    ours, reference = _assert_hidden_states_equal(model, xlmr, *padded_source)
    # fusion off: the cross-attention memory is XLM-R's top layer
    torch.testing.assert_close(ours.last_hidden_state, reference.last_hidden_state, atol=1e-5, rtol=0)


def test_masked_lm_checkpoint_and_instance(tmp_path, padded_source):
    """The Hub's XLM-R checkpoints are `XLMRobertaForMaskedLM` ("roberta." prefix, MLM head): both the saved
    checkpoint and the instance give the encoder of its `.roberta`."""
    mlm = XLMRobertaForMaskedLM(XLMRobertaConfig(**TINY_XLMR)).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in mlm.roberta.parameters():
            param.copy_(torch.randn(param.shape, generator=generator) * 0.3)
    mlm.save_pretrained(tmp_path)
    for source in (str(tmp_path), mlm):
        model = from_xlmr(source, model_type="plain_transformer").eval()
        _assert_hidden_states_equal(model, mlm.roberta, *padded_source)


def test_gtrans_with_encoder_fusion_loads(xlmr, padded_source):
    model = from_xlmr(xlmr, model_type="gtrans", **SMALL_FAMILY).eval()
    assert model.config.encoder_fusion
    ours, reference = _assert_hidden_states_equal(model, xlmr, *padded_source)
    # Eq. 1-2 with the paper's initial w = 0: LN(1/M sum_i sigma(0) h_{alpha_i}), groups end at layers 2 and 4
    states = reference.hidden_states
    expected = torch.nn.functional.layer_norm((0.5 * states[2] + 0.5 * states[4]) / 2, (32,), eps=1e-5)
    torch.testing.assert_close(ours.last_hidden_state, expected, atol=1e-5, rtol=0)
    fresh = model.conversion_report["freshly_initialised"]
    assert {"model.encoder.readout.weight", "model.encoder.readout.layer_norm.weight"} <= set(fresh)


def test_embeddings_and_report(xlmr):
    model = from_xlmr(xlmr, model_type="gtrans", **SMALL_FAMILY)
    source = xlmr.state_dict()
    words = source["embeddings.word_embeddings.weight"]
    folded = source["embeddings.position_embeddings.weight"] + source["embeddings.token_type_embeddings.weight"][0]
    assert model.config.max_position_embeddings == TINY_XLMR["max_position_embeddings"] - 2
    assert not model.config.scale_embedding and model.config.layernorm_embedding
    assert model.config.activation_function == "gelu" and model.config.layer_norm_eps == 1e-5
    assert model.config.dropout == xlmr.config.hidden_dropout_prob
    for tied in (model.model.shared, model.model.encoder.embed_tokens, model.model.decoder.embed_tokens, model.lm_head):
        assert torch.equal(tied.weight, words)
    for stack in (model.model.encoder, model.model.decoder):
        assert torch.equal(stack.embeddings.embed_positions.weight, folded)
        assert torch.equal(stack.embeddings.layernorm_embedding.weight, source["embeddings.LayerNorm.weight"])
        assert torch.equal(stack.embeddings.layernorm_embedding.bias, source["embeddings.LayerNorm.bias"])

    report = model.conversion_report
    tied_copies = {"lm_head.weight", "model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"}
    all_keys = set(model.state_dict()) - tied_copies
    assert set(report["loaded"]) | set(report["freshly_initialised"]) == all_keys
    assert not set(report["loaded"]) & set(report["freshly_initialised"])
    # without init_decoder: every decoder layer, the fusion weights and the logits bias are fresh
    expected_fresh = {
        key
        for key in all_keys
        if key.startswith("model.decoder.layers.") or ".readout." in key or key == "final_logits_bias"
    }
    assert set(report["freshly_initialised"]) == expected_fresh


def test_init_decoder_copies_bottom_layers(xlmr):
    model = from_xlmr(xlmr, model_type="gtrans", init_decoder=True, **SMALL_FAMILY)
    assert model.config.decoder_layers == 2  # half of XLM-R's 4 layers by default
    source = xlmr.state_dict()
    pairs = {
        "self_attn.q_proj": "attention.self.query",
        "self_attn.k_proj": "attention.self.key",
        "self_attn.v_proj": "attention.self.value",
        "self_attn.out_proj": "attention.output.dense",
        "self_attn_block.layer_norm": "attention.output.LayerNorm",
        "ffn.fc1": "intermediate.dense",
        "ffn.fc2": "output.dense",
        "ffn_block.layer_norm": "output.LayerNorm",
    }
    ours = model.state_dict()
    for layer in range(2):
        for mine, theirs in pairs.items():
            for param in ("weight", "bias"):
                assert torch.equal(
                    ours[f"model.decoder.layers.{layer}.{mine}.{param}"],
                    source[f"encoder.layer.{layer}.{theirs}.{param}"],
                ), (layer, mine, param)
    fresh = set(model.conversion_report["freshly_initialised"])
    decoder_fresh = {key for key in fresh if key.startswith("model.decoder.layers.")}
    assert decoder_fresh == {key for key in ours if key.startswith("model.decoder.layers.") and ".encoder_attn" in key}
    assert len(decoder_fresh) == 2 * 10  # q/k/v/out weight+bias and the LayerNorm weight+bias, per layer


def test_xlmr_base_gives_the_opus100_preset():
    # config mapping only (no 278M-parameter model): XLM-R base's config.json values
    base = XLMRobertaConfig(vocab_size=250002, max_position_embeddings=514, type_vocab_size=1, layer_norm_eps=1e-5)
    backbone = backbone_config_from_xlmr(base)
    for key, value in BACKBONE_PRESETS["opus100"].items():
        assert backbone[key] == value, key
    # the preset may therefore be passed as overrides: every dictated key agrees
    config = GTransConfig(**{**backbone, **BACKBONE_PRESETS["opus100"]})
    assert (config.encoder_group_size, config.decoder_group_size) == (3, 2)


def test_save_and_reload_keeps_the_xlmr_encoder(tmp_path, xlmr, padded_source):
    model = from_xlmr(xlmr, model_type="gtrans", encoder_fusion=False, **SMALL_FAMILY)
    model.save_pretrained(tmp_path)
    reloaded = hf_layerfusion.GTransForConditionalGeneration.from_pretrained(tmp_path).eval()
    _assert_hidden_states_equal(reloaded, xlmr, *padded_source)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(d_model=64), "d_model"),
        (dict(max_position_embeddings=512), "max_position_embeddings"),
        (dict(position_embedding_type="sinusoidal"), "position_embedding_type"),
        (dict(activation_function="relu"), "activation_function"),
        (dict(scale_embedding=True), "scale_embedding"),
        (dict(init_decoder=True, decoder_layers=5), "decoder_layers=5"),
        (dict(init_decoder=True, decoder_ffn_dim=16), "decoder_ffn_dim"),
    ],
)
def test_mismatched_overrides_are_refused(xlmr, overrides, message):
    with pytest.raises(ValueError, match=message):
        from_xlmr(xlmr, model_type="gtrans", **SMALL_FAMILY, **overrides)


def test_free_overrides_are_accepted(xlmr):
    model = from_xlmr(xlmr, model_type="plain_transformer", dropout=0.3, decoder_layers=3, decoder_ffn_dim=16)
    assert (model.config.dropout, model.config.decoder_layers, model.config.decoder_ffn_dim) == (0.3, 3, 16)
    # the dictated keys may be repeated with XLM-R's value
    from_xlmr(xlmr, model_type="plain_transformer", d_model=32, max_position_embeddings=22)


def test_relative_positions_are_refused(tmp_path):
    model = _randomised_xlmr()
    model.config.position_embedding_type = "relative_key"  # older XLM-R configs carry this key
    model.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="relative_key"):
        from_xlmr(str(tmp_path))


def test_causal_xlmr_is_refused():
    with pytest.raises(ValueError, match="is_decoder"):
        from_xlmr(XLMRobertaModel(XLMRobertaConfig(**TINY_XLMR, is_decoder=True)))


def test_non_xlmr_models_are_refused(tmp_path):
    bert = BertModel(
        BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=48)
    )
    with pytest.raises(ValueError, match="'bert'"):
        from_xlmr(bert)
    bert.save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'bert'"):
        from_xlmr(str(tmp_path))
    with pytest.raises(TypeError, match="dict"):
        from_xlmr({"not": "a model"})


def _tiny_xlmr_tokenizer(special_first=("<s>", "<pad>", "</s>", "<unk>")) -> XLMRobertaTokenizer:
    pieces = [(token, 0.0) for token in special_first]
    pieces += [(f"▁{word}", -float(i + 1)) for i, word in enumerate(["hello", "world", "hallo", "welt"])]
    return XLMRobertaTokenizer(vocab=pieces + [("<mask>", 0.0)])


def test_tokenizer_helper_checks_special_ids(tmp_path, xlmr):
    good = tmp_path / "good"
    _tiny_xlmr_tokenizer().save_pretrained(good)
    model = from_xlmr(xlmr, model_type="plain_transformer")
    tokenizer = load_xlmr_tokenizer(good, config=model.config)
    assert tokenizer("hello world")["input_ids"] == [0, 4, 5, 2]

    bad = tmp_path / "bad"
    _tiny_xlmr_tokenizer(special_first=("<pad>", "<s>", "</s>", "<unk>")).save_pretrained(bad)
    with pytest.raises(ValueError, match="pad_token_id"):
        load_xlmr_tokenizer(bad)
