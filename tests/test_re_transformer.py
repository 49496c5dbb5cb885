"""Re-Transformer (shared/papers/re-transformer.txt) against references written independently here: the paper's
Table 2 layouts spelled out sub-layer by sub-layer, the encoder computed by hand from its weights, the plain
backbone and MarianMTModel for the baseline layout, and the Marian sub-layer mapping written out key by key."""

import pytest
import torch
from helpers import (
    FIRST_TOKEN_ID,
    assert_cached_search_is_uncached_search,
    assert_eager_equals_sdpa,
    assert_generate_matches_references,
    assert_gradient_checkpointing_same_gradients,
    assert_incremental_decoding_matches_full_forward,
    assert_save_load_round_trip,
    assert_trainer_step_is_hand_computed,
    copy_task_rows,
    embed,
    float64_default,
    padded_source,
    padding_allowed,
    plain_attend,
    randomize_layer_norms,
    reference_encoder_decoder_logits,
    reference_stack,
    source_of,
    tiny_marian,
)

import hf_layerfusion
from hf_layerfusion import (
    PlainTransformerConfig,
    PlainTransformerForConditionalGeneration,
    ReTransformerConfig,
    ReTransformerForConditionalGeneration,
)

# paper Table 2, each layout with its layers and the sub-layer modules each layer must hold, written out by hand
TABLE_2 = {
    "sf-sf-sf-sf-sf-sf": ["sf", "sf", "sf", "sf", "sf", "sf"],
    "s-sf-s-sf-s-sf": ["s", "sf", "s", "sf", "s", "sf"],
    "s-s-sf-sf-sf": ["s", "s", "sf", "sf", "sf"],
    "s-s-s-s-sf-sff": ["s", "s", "s", "s", "sf", "sff"],
    "s-s-s-sf-sf-sff": ["s", "s", "s", "sf", "sf", "sff"],
}
MODULES = {
    "s": ["self_attn", "self_attn_block"],
    "sf": ["self_attn", "self_attn_block", "ffn", "ffn_block"],
    "sff": ["self_attn", "self_attn_block", "ffn", "ffn_block", "ffn_2", "ffn_2_block"],
}


def tiny(tiny_backbone, **overrides) -> dict:
    """The tiny sizes without layer counts (they follow the layouts), 0.3-std init so that every weight matters."""
    sizes = {k: v for k, v in tiny_backbone.items() if k not in ("encoder_layers", "decoder_layers")}
    return {**sizes, "init_std": 0.3, **overrides}


def build(tiny_backbone, **overrides) -> ReTransformerForConditionalGeneration:
    model = ReTransformerForConditionalGeneration(ReTransformerConfig(**tiny(tiny_backbone, **overrides))).eval()
    with torch.no_grad():
        model.final_logits_bias.normal_(generator=torch.Generator().manual_seed(2))
    return model


# ------------------------------------------------------------------------------------------- layouts
@pytest.mark.parametrize("layout", sorted(TABLE_2))
def test_table_2_layouts_parse_build_and_run(layout, tiny_backbone, padded_batch):
    expected_layers = TABLE_2[layout]
    model = build(tiny_backbone, encoder_layout=layout)
    config = model.config
    assert config.encoder_layer_layouts == expected_layers
    assert config.encoder_layers == len(expected_layers)
    assert config.decoder_layer_layouts == ["scf"] * 2 and config.decoder_layers == 2  # Re-Transformer-2's decoder
    layers = model.model.encoder.layers
    assert len(layers) == len(expected_layers)
    for layer, sublayers in zip(layers, expected_layers):
        assert [name for name, _ in layer.named_children()] == MODULES[sublayers]

    # parameters: per-sub-layer arithmetic (attention 4 (d^2 + d), FFN 2 d F + F + d, 2 d per LayerNorm)
    d, ffn_dim = config.d_model, config.encoder_ffn_dim
    attention, ffn, layer_norm = 4 * (d * d + d), 2 * d * ffn_dim + ffn_dim + d, 2 * d
    expected_encoder = sum(
        (attention + layer_norm) * sub.count("s") + (ffn + layer_norm) * sub.count("f") for sub in expected_layers
    )
    assert sum(p.numel() for p in layers.parameters()) == expected_encoder

    loss = model.train()(**padded_batch).loss
    assert torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in layers.parameters())


def test_default_is_re_transformer_2():
    """Without a preset or layer counts the config is the paper's best model, Re-Transformer-2 (Table 3)."""
    default, preset = ReTransformerConfig(), ReTransformerConfig.from_preset("re_transformer_2")
    assert default.to_dict() == preset.to_dict()
    assert (default.encoder_layout, default.decoder_layout) == ("s-sf-s-sf-s-sf", "scf-scf")
    # a given decoder depth or layout still decides
    assert ReTransformerConfig(decoder_layers=4).decoder_layout == "scf-scf-scf-scf"
    assert ReTransformerConfig(decoder_layout="scf").decoder_layers == 1


def test_presets():
    for name, decoder_layers in (("re_transformer_2", 2), ("re_transformer_4", 4)):
        config = ReTransformerConfig.from_preset(name)
        assert config.encoder_layout == "s-sf-s-sf-s-sf" and config.encoder_layers == 6
        assert config.decoder_layers == decoder_layers
        assert config.decoder_layer_layouts == ["scf"] * decoder_layers
        assert config.decoder_cache_layers == decoder_layers
        # generation sizes its caches from the decoder view of the config, and DynamicCache asks that view again
        view = config.get_text_config(decoder=True)
        assert view.num_hidden_layers == view.get_text_config(decoder=True).num_hidden_layers == decoder_layers
        assert (config.d_model, config.encoder_ffn_dim, config.encoder_attention_heads) == (512, 2048, 8)
    multi30k = ReTransformerConfig.from_preset(
        "re_transformer_2", d_model=256, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
        encoder_attention_heads=4, decoder_attention_heads=4,
    )
    assert (multi30k.d_model, multi30k.decoder_layers, multi30k.encoder_layout) == (256, 2, "s-sf-s-sf-s-sf")
    assert ReTransformerConfig.from_preset("multi30k").d_model == 256  # backbone sizes still found
    with pytest.raises(ValueError, match="'re_transformer_3'.*re_transformer_2"):
        ReTransformerConfig.from_preset("re_transformer_3")
    # other families do not see the Re-Transformer presets
    with pytest.raises(ValueError, match="'re_transformer_2'"):
        PlainTransformerConfig.from_preset("re_transformer_2")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(encoder_layout="sx-sf"), r"encoder_layout.*'sx-sf'.*character 'x' at position 1"),
        (dict(encoder_layout="sf-sf-Sf"), r"character 'S' at position 6"),
        (dict(encoder_layout="sf--sf"), r"'sf--sf'.*'-' at position 3 leaves an empty layer"),
        (dict(encoder_layout="-sf"), r"'-' at position 0 leaves an empty layer"),
        (dict(encoder_layout="sf-"), r"'-' at position 2 leaves an empty layer"),
        (dict(encoder_layout="sc-sf"), r"character 'c' at position 1 is not a sub-layer"),
        (dict(encoder_layout="sf sf"), r"character ' ' at position 2"),
        (dict(encoder_layout=""), r"encoder_layout.*non-empty.*''"),
        (dict(encoder_layout="f-f"), r"`encoder_layout` 'f-f' has no self-attention sub-layer"),
        (dict(encoder_layout="ff"), r"`encoder_layout` 'ff' has no self-attention sub-layer"),
        (dict(decoder_layers="2"), r"`decoder_layers` must be of type int \| None, got '2'"),
        (dict(decoder_layout="scf-scx"), r"decoder_layout.*character 'x' at position 6"),
        (dict(decoder_layout="scf-"), r"decoder_layout.*'-' at position 3"),
        (dict(decoder_layout="sf-sf"), r"decoder_layout.*'sf-sf'.*no cross-attention"),
        (dict(decoder_layout="cf-cf"), r"decoder_layout.*'cf-cf'.*no self-attention"),
        (dict(encoder_layers=4), r"`encoder_layers` \(4\) contradicts `encoder_layout` 's-sf-s-sf-s-sf'.*6 layers"),
        (dict(encoder_layout="s-sf", encoder_layers=3), r"`encoder_layers` \(3\).*'s-sf'.*2 layers"),
        (dict(decoder_layout="scf-scf", decoder_layers=3), r"`decoder_layers` \(3\).*'scf-scf'.*2 layers"),
        (dict(num_hidden_layers=2), r"`encoder_layers` \(2\)"),  # the HF alias of encoder_layers
        (dict(d_model=17), r"d_model.*17"),  # backbone validation still runs
    ],
)
def test_bad_config_raises(overrides, message, tiny_backbone):
    with pytest.raises(ValueError, match=message):
        ReTransformerConfig(**tiny(tiny_backbone, **overrides))


def test_contradiction_set_after_construction_is_caught_at_build(tiny_backbone):
    config = ReTransformerConfig(**tiny(tiny_backbone, encoder_layout="s-sf"))
    config.encoder_layout = "s-sf-sf"
    with pytest.raises(ValueError, match=r"`encoder_layers` \(2\).*'s-sf-sf'.*3 layers"):
        ReTransformerForConditionalGeneration(config)


# ------------------------------------------------------------------------------------------- references
def reference_encoder(model, input_ids, attention_mask, layout):
    """The post-norm encoder of the layout string, sub-layer by sub-layer (tests/helpers.py): `s` is
    x <- LN(x + SelfAttn(x)), `f` is x <- LN(x + FFN(x)); repeated `f` in a layer uses that layer's second FFN.
    `reference_encoder_decoder_logits` extends it to the decoder and to pre-norm."""
    allowed = padding_allowed(attention_mask, input_ids.shape[1])
    states = reference_stack(
        model.model.encoder.layers, layout.split("-"), embed(model, input_ids), False,
        lambda l, below: plain_attend(model.config.encoder_attention_heads, allowed),
    )
    return states[-1]


@pytest.mark.parametrize("layout", ["s-sf-s-sf-s-sf", "s-s-s-s-sf-sff"])
def test_encoder_equals_hand_written_layout(layout, tiny_backbone, padded_batch):
    model = build(tiny_backbone, encoder_layout=layout)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "layer_norm" in name:  # LayerNorm gains and biases away from 1 / 0, so that they matter
                param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(len(name))) * 0.3)
        expected = reference_encoder(model, padded_batch["input_ids"], padded_batch["attention_mask"], layout)
        actual = model.get_encoder()(
            input_ids=padded_batch["input_ids"], attention_mask=padded_batch["attention_mask"]
        ).last_hidden_state
    real = padded_batch["attention_mask"].bool()
    torch.testing.assert_close(actual[real], expected[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("decoder_layout", ["scf-scf", "sscf-cf", "s-csff-scf", "fcs-sc"])
def test_decoder_layouts_equal_hand_written_model(decoder_layout, normalize_before, tiny_backbone, padded_batch):
    """The whole model, both stacks laid out as their layout strings say, in both norms, against the encoder-decoder
    written out sub-layer by sub-layer (tests/helpers.py): decoder `s` is causal self-attention, `c` attention over
    the encoder memory, `f` the feed-forward network (a repeated `f` the layer's second one), in the layout's order."""
    with float64_default():
        model = build(tiny_backbone, encoder_layout="s-sff", decoder_layout=decoder_layout,
                      normalize_before=normalize_before)
    randomize_layer_norms(model)
    targets = torch.randint(FIRST_TOKEN_ID, model.config.vocab_size, (3, 5), generator=torch.Generator().manual_seed(6))
    targets[:, 0] = model.config.decoder_start_token_id
    with torch.no_grad():
        logits = model(
            input_ids=padded_batch["input_ids"], attention_mask=padded_batch["attention_mask"], decoder_input_ids=targets
        ).logits
        expected = reference_encoder_decoder_logits(
            model, padded_batch["input_ids"], padded_batch["attention_mask"], targets, ["s", "sff"],
            decoder_layout.split("-"), pre_norm=normalize_before,
        )
    assert expected.abs().max() > 1.0
    torch.testing.assert_close(logits, expected, atol=1e-10, rtol=0)


def test_baseline_layout_is_the_plain_backbone(tiny_backbone, padded_batch):
    plain = PlainTransformerForConditionalGeneration(
        PlainTransformerConfig(**{**tiny_backbone, "init_std": 0.3})
    ).eval()
    with torch.no_grad():
        plain.final_logits_bias.normal_(generator=torch.Generator().manual_seed(4))
    re_transformer = build(tiny_backbone, encoder_layout="sf-sf", decoder_layout="scf-scf")
    assert set(re_transformer.state_dict()) == set(plain.state_dict())  # the same modules under the same names
    re_transformer.load_state_dict(plain.state_dict())
    with torch.no_grad():
        expected, actual = plain(**padded_batch), re_transformer(**padded_batch)
    assert torch.equal(actual.logits, expected.logits)
    assert torch.equal(actual.loss, expected.loss)
    # the Re-Transformer layout with the weights it shares computes something else (the test can tell layouts apart)
    reordered = build(tiny_backbone, encoder_layout="sf-s", decoder_layout="scf-scf")
    reordered.load_state_dict(
        {k: v for k, v in plain.state_dict().items() if not k.startswith("model.encoder.layers.1.ffn")}, strict=False
    )
    with torch.no_grad():
        assert not torch.allclose(reordered(**padded_batch).logits, expected.logits, atol=1e-3)


# ------------------------------------------------------------------------------------------- from_marian
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_from_marian_baseline_layout_matches_marian(attn_implementation):
    marian = tiny_marian(attn_implementation)
    model = hf_layerfusion.from_marian(
        marian, model_type="re_transformer", encoder_layout="sf-sf", attn_implementation=attn_implementation
    ).eval()
    assert type(model) is ReTransformerForConditionalGeneration
    assert model.conversion_report["not_loaded"] == []
    assert set(model.conversion_report["freshly_initialised"]) <= {
        "lm_head.weight",
        "model.encoder.embeddings.embed_positions.weight",
        "model.decoder.embeddings.embed_positions.weight",
    }
    batch = padded_source()
    with torch.no_grad():
        expected, logits = marian(**batch).logits, model(**batch).logits
    assert expected.abs().max() > 1.0
    torch.testing.assert_close(logits, expected, atol=1e-4, rtol=0)
    generate_kwargs = dict(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=4, max_length=10,
        output_scores=True, return_dict_in_generate=True,
    )
    expected, generated = marian.generate(**generate_kwargs), model.generate(**generate_kwargs)
    assert generated.sequences.tolist() == expected.sequences.tolist()
    torch.testing.assert_close(generated.sequences_scores, expected.sequences_scores, atol=1e-4, rtol=0)


def test_from_marian_maps_layer_by_layer():
    """Layout `s-sff` from a 2+2-layer Marian, decoder cut to one layer: each sub-layer written out."""
    marian = tiny_marian("eager")
    model = hf_layerfusion.from_marian(
        marian, model_type="re_transformer", encoder_layout="s-sff", decoder_layers=1, allow_dropped_weights=True
    )
    assert (model.config.encoder_layers, model.config.decoder_layers) == (2, 1)
    ours, theirs = model.model, marian.model
    pairs = {  # ours <- Marian
        "encoder.layers.0.self_attn.q_proj.weight": "encoder.layers.0.self_attn.q_proj.weight",
        "encoder.layers.0.self_attn_block.layer_norm.weight": "encoder.layers.0.self_attn_layer_norm.weight",
        "encoder.layers.1.self_attn.out_proj.bias": "encoder.layers.1.self_attn.out_proj.bias",
        "encoder.layers.1.ffn.fc1.weight": "encoder.layers.1.fc1.weight",
        "encoder.layers.1.ffn_block.layer_norm.bias": "encoder.layers.1.final_layer_norm.bias",
        "decoder.layers.0.encoder_attn.k_proj.weight": "decoder.layers.0.encoder_attn.k_proj.weight",
        "decoder.layers.0.ffn.fc2.weight": "decoder.layers.0.fc2.weight",
    }
    our_state, their_state = ours.state_dict(), theirs.state_dict()
    for our_key, their_key in pairs.items():
        assert torch.equal(our_state[our_key], their_state[their_key]), our_key
    # the second FFN of `sff` has no Marian source: freshly initialised, and reported
    fresh = model.conversion_report["freshly_initialised"]
    ffn_2 = sorted(k for k in model.state_dict() if k.startswith("model.encoder.layers.1.ffn_2"))
    assert len(ffn_2) == 6 and set(ffn_2) <= set(fresh)
    assert not torch.equal(our_state["encoder.layers.1.ffn_2.fc1.weight"], their_state["encoder.layers.1.fc1.weight"])
    # Marian's layer-0 FFN (layer 0 is `s`) and its whole decoder layer 1 have no place: reported as not loaded
    layer_0_ffn = [
        f"model.encoder.layers.0.{name}"
        for name in ("ffn.fc1.weight", "ffn.fc1.bias", "ffn.fc2.weight", "ffn.fc2.bias",
                     "ffn_block.layer_norm.weight", "ffn_block.layer_norm.bias")
    ]
    decoder_layer_1 = [k.replace("model.decoder.layers.0.", "model.decoder.layers.1.") for k in model.state_dict()
                       if k.startswith("model.decoder.layers.0.")]
    assert model.conversion_report["not_loaded"] == sorted(layer_0_ffn + decoder_layer_1)


def test_from_marian_layout_and_layer_count_must_agree():
    marian = tiny_marian("eager")  # 2 encoder layers; the family default layout has 6
    with pytest.raises(ValueError, match=r"`encoder_layers` \(2\) contradicts `encoder_layout` 's-sf-s-sf-s-sf'"):
        hf_layerfusion.from_marian(marian, model_type="re_transformer")
    with pytest.raises(ValueError, match=r"`encoder_layers` \(3\) contradicts `encoder_layout` 's-sf'"):
        hf_layerfusion.from_marian(marian, model_type="re_transformer", encoder_layout="s-sf", encoder_layers=3)


# ------------------------------------------------------------------------------------------- cache and generation
DECODER_LAYOUTS = ["scf-scf", "sscf-cf", "s-csff-scf"]


@pytest.mark.parametrize("decoder_layout", DECODER_LAYOUTS)
def test_incremental_decoding_matches_full_forward(decoder_layout, tiny_backbone, padded_batch):
    model = build(tiny_backbone, encoder_layout="s-sf", decoder_layout=decoder_layout)
    layouts = decoder_layout.split("-")
    expected_slots = max(sum(l.count("s") for l in layouts), sum(l.count("c") for l in layouts))
    assert model.config.decoder_cache_layers == expected_slots
    source = source_of(padded_batch)
    decoder_input_ids = torch.randint(FIRST_TOKEN_ID, model.config.vocab_size, (3, 6))
    decoder_input_ids[:, 0] = model.config.decoder_start_token_id
    cache = assert_incremental_decoding_matches_full_forward(model, source, decoder_input_ids)
    # every self-attention slot grew with the steps (a layer reading another layer's slot would not)
    assert [layer.keys.shape[-2] for layer in cache.self_attention_cache.layers[:expected_slots]] == [
        6
    ] * sum(l.count("s") for l in layouts)

    assert_cached_search_is_uncached_search(model, source, num_beams=4)


@pytest.mark.parametrize("decoder_layout", ["scf", "s-csff-scf"])
def test_greedy_beam_and_sampling_generate(decoder_layout, tiny_backbone, padded_batch):
    """Greedy, beam search and sampling (2 samples per source, no top-k) against step-by-step decoding over full
    forward passes (tests/helpers.py); greedy with and without the cache agree."""
    model = build(tiny_backbone, encoder_layout="s-sf", decoder_layout=decoder_layout)
    source = source_of(padded_batch)
    greedy = [model.generate(**source, max_new_tokens=6, use_cache=c) for c in (True, False)]
    assert torch.equal(greedy[0], greedy[1])
    assert_generate_matches_references(model, source, max_new_tokens=6, top_k=0, num_return_sequences=2)


# ------------------------------------------------------------------------------------------- HF integration
def test_save_load_round_trip_and_auto_classes(tiny_backbone, padded_batch, tmp_path):
    """The family contract's round trip (tests/helpers.py) with layouts of the paper's kinds; they come back as they were
    saved, and so do the layer counts that follow them."""
    model = build(tiny_backbone, encoder_layout="s-s-sff", decoder_layout="s-scf")
    loaded = assert_save_load_round_trip(model, padded_batch, tmp_path)
    assert (loaded.config.encoder_layout, loaded.config.decoder_layout) == ("s-s-sff", "s-scf")
    assert (loaded.config.encoder_layers, loaded.config.decoder_layers) == (3, 2)


def test_eager_equals_sdpa(tiny_backbone, padded_batch):
    assert_eager_equals_sdpa(build(tiny_backbone, encoder_layout="s-sf-sff", decoder_layout="scf-sscf"), padded_batch)


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_gradient_checkpointing_same_gradients(use_reentrant, tiny_backbone, padded_batch):
    """Layers of the paper's kinds (self-attention only, two feed-forward blocks, two self-attentions) checkpoint like
    the others: the family contract's check (tests/helpers.py), every parameter getting a gradient."""
    model = build(tiny_backbone, encoder_layout="s-sf-sff", decoder_layout="scf-sscf")
    gradients = assert_gradient_checkpointing_same_gradients(model, padded_batch, use_reentrant)
    assert len(gradients) == len(list(model.parameters()))


def test_trainer_one_step(tiny_backbone, tmp_path):
    """One Trainer step is the SGD step computed by hand from the model's loss; the Re-Transformer-specific sub-layers
    (a self-attention-only layer, a second feed-forward block) take part in it."""
    model = build(tiny_backbone, encoder_layout="s-sff", decoder_layout="scf").train()
    _, gradients = assert_trainer_step_is_hand_computed(model, copy_task_rows(model.config.vocab_size), tmp_path)
    for name in ("model.encoder.layers.0.self_attn.q_proj.weight", "model.encoder.layers.1.ffn_2.fc1.weight"):
        assert gradients[name].abs().sum() > 0, name
