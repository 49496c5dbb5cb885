"""Configs, Auto-class registration, weight tying, initialisation and input validation (saving and loading of every
family is in tests/test_family_contract.py)."""

import math

import pytest
import torch
from helpers import TINY_BACKBONE, tiny_config_overrides
from torch import nn
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

import hf_layerfusion
from hf_layerfusion import GTransConfig, GTransForConditionalGeneration

FAMILIES = sorted(hf_layerfusion.FAMILIES)
GTRANS_SIZES = dict(encoder_layers=3, decoder_layers=3, encoder_group_size=2, decoder_group_size=1)


def family_config(model_type, tiny_backbone, **overrides):
    sizes = GTRANS_SIZES if model_type == "gtrans" else {}
    return AutoConfig.for_model(model_type, **{**tiny_backbone, **sizes, **overrides})


@pytest.mark.parametrize("model_type", FAMILIES)
def test_auto_classes_resolve_family(model_type, tmp_path):
    family = hf_layerfusion.FAMILIES[model_type]
    config = AutoConfig.for_model(model_type, **TINY_BACKBONE, **tiny_config_overrides(model_type))
    assert type(config) is family.config and config.model_type == model_type
    assert type(AutoModel.from_config(config)) is family.model
    model = AutoModelForSeq2SeqLM.from_config(config)
    assert type(model) is family.for_conditional_generation
    model.save_pretrained(tmp_path)
    assert type(AutoConfig.from_pretrained(tmp_path)) is family.config
    assert type(AutoModel.from_pretrained(tmp_path)) is family.model


@pytest.mark.parametrize("model_type", FAMILIES)
def test_tied_weights_keys_cover_shared_embeddings(model_type):
    tied = hf_layerfusion.FAMILIES[model_type].for_conditional_generation._tied_weights_keys
    assert set(tied) == {
        "lm_head.weight",
        "model.encoder.embed_tokens.weight",
        "model.decoder.embed_tokens.weight",
    }
    assert set(tied.values()) == {"model.shared.weight"}


def assert_paper_fusion_init(model):
    encoder_fusion, decoder_fusion = model.model.encoder.readout, model.model.decoder.readout
    for weight in (encoder_fusion.weight, decoder_fusion.layer_weight, decoder_fusion.group_weight):
        assert torch.equal(
            torch.sigmoid(weight), torch.full_like(weight, 0.5)
        )  # every gate starts at 1/2, psi uniform
    assert torch.equal(encoder_fusion.layer_norm.weight, torch.ones(model.config.d_model))
    assert torch.equal(encoder_fusion.layer_norm.bias, torch.zeros(model.config.d_model))
    assert torch.equal(model.final_logits_bias, torch.zeros_like(model.final_logits_bias))


def assert_all_finite(model):
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        assert torch.isfinite(tensor).all(), name


def test_init_weights(tiny_backbone, padded_batch):
    config = family_config("gtrans", tiny_backbone)
    model = AutoModelForSeq2SeqLM.from_config(config)
    assert_all_finite(model)
    assert_paper_fusion_init(model)
    with torch.no_grad():
        assert torch.allclose(
            model(**padded_batch, return_group_log_probs=True).group_weights, torch.full((3,), 1 / 3)
        )

    # the big-model path: parameters allocated empty, then initialised by `init_weights` (`_init_weights`)
    with torch.device("meta"):
        model = GTransForConditionalGeneration(config)
    model.to_empty(device="cpu")
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            tensor.fill_(float("nan"))
    model.init_weights()
    assert_all_finite(model)
    assert_paper_fusion_init(model)
    assert model.lm_head.weight is model.model.shared.weight
    std = model.model.shared.weight.std()
    assert 0.5 * config.init_std < std < 2 * config.init_std


@pytest.mark.parametrize("embedding_init", ["init_std", "rsqrt_d_model"])
@pytest.mark.parametrize(
    "model_type, overrides",
    [(model_type, {}) for model_type in FAMILIES]
    + [("plain_transformer", dict(position_embedding_type="learned"))],
)
def test_embedding_init_statistics_of_a_fresh_model(model_type, overrides, embedding_init, tiny_backbone):
    """Every embedding table of a fresh model (tokens, learned positions, layer-wise coordination's language
    embeddings) is N(0, init_std) by default and N(0, d_model^-1/2) with `embedding_init="rsqrt_d_model"` (fairseq,
    THUMT), its padding row zero; the output projection is the token table. The sample standard deviation of n values
    lies within 5 of its own standard errors (1 / sqrt(2 n), relative) of the expected one; linear weights stay
    N(0, init_std)."""
    d, init_std = 64, 0.05
    config_class, _, model_class = hf_layerfusion.FAMILIES[model_type]
    sizes = dict(vocab_size=400, d_model=d, encoder_ffn_dim=64, decoder_ffn_dim=64, init_std=init_std)
    config = config_class(
        **{**tiny_backbone, **sizes, **tiny_config_overrides(model_type), **overrides},
        embedding_init=embedding_init,
    )
    model = model_class(config)
    expected = d**-0.5 if embedding_init == "rsqrt_d_model" else init_std

    def assert_std(values, expected, name):
        tolerance = 5 / math.sqrt(2 * values.numel())
        assert abs(values.std().item() / expected - 1) < tolerance, (name, values.std().item(), expected)

    embeddings = {name: module for name, module in model.named_modules() if isinstance(module, nn.Embedding)}
    assert "model.shared" in embeddings and model.lm_head.weight is model.model.shared.weight
    if model_type == "layerwise_coordination":
        assert {"model.encoder.connection.language_embedding", "model.decoder.connection.language_embedding"} <= set(
            embeddings
        )
    if overrides:
        assert "model.encoder.embeddings.embed_positions" in embeddings
    for name, module in embeddings.items():
        weight = module.weight.detach()
        if module.padding_idx is not None:
            assert not weight[module.padding_idx].any(), name
            weight = torch.cat([weight[: module.padding_idx], weight[module.padding_idx + 1 :]])
        assert_std(weight, expected, name)
    linear = torch.cat(
        [module.weight.detach().flatten() for name, module in model.named_modules()
         if isinstance(module, nn.Linear) and name != "lm_head"]
    )
    assert_std(linear, init_std, "linear weights")


def test_fusion_weights_initialised_when_loading_plain_checkpoint(tiny_backbone, tmp_path):
    plain = AutoModelForSeq2SeqLM.from_config(
        family_config("plain_transformer", tiny_backbone, encoder_layers=3, decoder_layers=3)
    )
    plain.save_pretrained(tmp_path)
    gtrans = GTransForConditionalGeneration.from_pretrained(tmp_path, **GTRANS_SIZES)
    assert_all_finite(gtrans)
    assert_paper_fusion_init(gtrans)
    assert torch.equal(gtrans.model.encoder.layers[2].ffn.fc2.weight, plain.model.encoder.layers[2].ffn.fc2.weight)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(encoder_group_size=0), "encoder_group_size.*got 0"),
        (dict(encoder_group_size=4), "encoder_group_size.*got 4"),
        (dict(decoder_group_size=0), "decoder_group_size.*got 0"),
        (dict(decoder_group_size=4), "decoder_group_size.*got 4"),
        (dict(d_model=17), r"d_model.*17.*encoder_attention_heads"),
        (dict(decoder_attention_heads=3), r"d_model.*decoder_attention_heads.*3"),
        (dict(activation_function="swiglu"), "activation_function.*swiglu"),
        (dict(position_embedding_type="rotary"), "position_embedding_type.*rotary"),
        (dict(tie_word_embeddings=False), "tie_word_embeddings"),
        (dict(probability_temperature=0.0), "probability_temperature.*0.0"),
        (dict(dropout=1.0), "dropout.*1.0"),
        (dict(pad_token_id=24), "pad_token_id.*24"),
        (dict(is_encoder_decoder=False), "is_encoder_decoder.*encoder-decoder.*got False"),
    ],
)
def test_bad_config_raises(overrides, message, tiny_backbone):
    with pytest.raises(ValueError, match=message):
        GTransConfig(**{**tiny_backbone, **GTRANS_SIZES, **overrides})


def test_from_preset():
    config = GTransConfig.from_preset("opus100")
    assert type(config) is GTransConfig
    assert (config.encoder_layers, config.decoder_layers) == (12, 6)
    assert config.d_model == 768
    assert config.encoder_ffn_dim == config.decoder_ffn_dim == 3072
    assert config.encoder_attention_heads == config.decoder_attention_heads == 12
    assert (config.encoder_group_size, config.decoder_group_size) == (3, 2)
    assert (config.num_encoder_groups, config.num_decoder_groups) == (4, 3)
    assert GTransConfig.from_preset("opus100", decoder_group_size=3).num_decoder_groups == 2
    with pytest.raises(ValueError, match="'wmt99'"):
        GTransConfig.from_preset("wmt99")


@pytest.mark.parametrize("groups", [[0], [4], [1, 4], []])
def test_decoder_groups_out_of_range(groups, tiny_backbone, padded_batch):
    model = GTransForConditionalGeneration(family_config("gtrans", tiny_backbone)).eval()
    assert model.config.num_decoder_groups == 3
    with pytest.raises(ValueError, match="decoder_groups"):
        model(**padded_batch, decoder_groups=groups)
    with pytest.raises(ValueError, match="decoder_groups"):
        model.generate(padded_batch["input_ids"], decoder_groups=groups, max_new_tokens=2)


@pytest.mark.parametrize("position_embedding_type", ["sinusoidal", "learned"])
def test_too_long_inputs_raise(position_embedding_type, tiny_backbone):
    config = family_config("plain_transformer", tiny_backbone, position_embedding_type=position_embedding_type)
    model = AutoModelForSeq2SeqLM.from_config(config).eval()
    limit = config.max_position_embeddings
    fits = torch.full((1, limit), 5)
    too_long = torch.full((1, limit + 1), 5)
    with torch.no_grad():
        model(input_ids=fits, decoder_input_ids=fits)
        with pytest.raises(ValueError, match=f"{limit + 1}.*max_position_embeddings={limit}"):
            model(input_ids=too_long, decoder_input_ids=fits)
        with pytest.raises(ValueError, match=f"{limit + 1}.*max_position_embeddings={limit}"):
            model(input_ids=fits, decoder_input_ids=too_long)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"scale_embedding": False},
        {"layernorm_embedding": True},
        {"position_embedding_type": "learned"},
        {"position_embedding_type": "learned", "layernorm_embedding": True},
        {"dtype": torch.bfloat16},
    ],
)
def test_the_embeddings_decoding_step_is_forward_at_one_position(overrides, tiny_backbone):
    """`TokenAndPositionEmbedding.decoding_step` (the fast loop's step) gives `forward`'s numbers bit for bit at every
    position up to the table's end, where it raises as `forward` does; it declines (None) where positions depend on
    the tokens (learned positions) and in training mode (dropout)."""
    dtype = overrides.pop("dtype", torch.float32)
    config = family_config("plain_transformer", tiny_backbone, **overrides)
    embeddings = AutoModelForSeq2SeqLM.from_config(config).to(dtype).eval().get_decoder().embeddings
    if config.layernorm_embedding:  # not the identity LayerNorm of a fresh model
        torch.nn.init.normal_(embeddings.layernorm_embedding.weight)
        torch.nn.init.normal_(embeddings.layernorm_embedding.bias)
    input_ids = torch.tensor([[5], [config.pad_token_id], [9]])
    token_embeddings = torch.randn(3, 1, config.d_model, dtype=dtype)
    limit = config.max_position_embeddings
    for position in range(limit):
        step = embeddings.decoding_step(token_embeddings, position)
        if config.position_embedding_type == "learned":
            assert step is None
            break
        assert step.dtype == dtype
        assert torch.equal(step, embeddings(input_ids, token_embeddings, position))
    if config.position_embedding_type != "learned":
        with pytest.raises(ValueError, match=f"{limit + 1}.*max_position_embeddings={limit}"):
            embeddings.decoding_step(token_embeddings, limit)
    assert embeddings.train().decoding_step(token_embeddings, 0) is None
    for bad in (-1, 1.0, True):
        with pytest.raises(ValueError, match=f"past_length must be an int >= 0 .*got {bad!r}"):
            embeddings.decoding_step(token_embeddings, bad)
    with pytest.raises(ValueError, match=rf"one position per row.*shape \(3, 2, {config.d_model}\)"):
        embeddings.decoding_step(token_embeddings.expand(3, 2, config.d_model), 0)


@pytest.mark.parametrize("model_type", sorted(hf_layerfusion.FAMILIES))
def test_several_end_tokens_start_the_decoder_with_the_first_unless_a_start_is_set(model_type):
    """`eos_token_id=[2, 5]` (as generation configs allow) without `decoder_start_token_id`: a family that starts
    with its end token starts with the first of them (the list itself was taken, and refused as not an int); an
    explicit start token, or a family starting with another token (layer-wise coordination's bos), is unchanged. A
    model built so generates, stopping at either end token."""
    config_class = hf_layerfusion.FAMILIES[model_type].config
    backbone = {**TINY_BACKBONE, **tiny_config_overrides(model_type), "eos_token_id": [2, 5]}
    config = config_class(**backbone)
    start = config.bos_token_id if config_class.decoder_start_token == "bos_token_id" else 2
    assert config.decoder_start_token_id == start
    assert config_class(**backbone, decoder_start_token_id=7).decoder_start_token_id == 7
    model = AutoModelForSeq2SeqLM.from_config(config).eval()
    sequences = model.generate(torch.tensor([[6, 7, 8, 2]]), max_new_tokens=4, num_beams=2)
    assert int(sequences[0, 0]) == start


@pytest.mark.parametrize("model_type", sorted(hf_layerfusion.FAMILIES))
def test_a_config_that_asks_for_tuples_gets_the_same_numbers_as_tuples(model_type, padded_batch):
    """`config.return_dict=False` (transformers' switch for tuple outputs): every forward returns the tuple of the
    output a `return_dict=True` model returns (the stacks' outputs are read by name inside, whatever the switch says;
    before, the model read `.last_hidden_state` of the encoder's tuple), and generation gives the same tokens."""
    torch.manual_seed(0)
    config = family_config(model_type, {**TINY_BACKBONE, **tiny_config_overrides(model_type)})
    model = AutoModelForSeq2SeqLM.from_config(config).eval()
    as_tuples = AutoModelForSeq2SeqLM.from_config(family_config(
        model_type, {**TINY_BACKBONE, **tiny_config_overrides(model_type)}, return_dict=False)).eval()
    as_tuples.load_state_dict(model.state_dict())
    inputs = dict(input_ids=padded_batch["input_ids"], attention_mask=padded_batch["attention_mask"],
                  labels=padded_batch["labels"])
    with torch.no_grad():
        expected, got = model(**inputs).to_tuple(), as_tuples(**inputs)
    assert isinstance(got, tuple) and len(got) == len(expected)
    for want, have in zip(expected, got):
        if isinstance(want, torch.Tensor):
            torch.testing.assert_close(have, want)
    generated = dict(input_ids=padded_batch["input_ids"], attention_mask=padded_batch["attention_mask"],
                     max_new_tokens=4, num_beams=2)
    assert torch.equal(as_tuples.generate(**generated), model.generate(**generated))
