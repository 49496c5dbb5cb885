"""Layer-wise coordination (He et al. 2018): Eq. 3 mask and mixed attention against brute force, the separated
attention of Table 3's "w/o mixed attention" against a whole decoder computed by hand, resettable positions, the
source/target and position embedding switches, layer sharing and the Sec. 4.2 / Table 3 parameter arithmetic, decoder
layer i reading encoder state s_{i-1} (pre-norm too), gradients of every parameter, the start token, the whole paper
model written out in both norms, and the family contract (tests/helpers.py) on every ablation: cache, beam search,
save/load (old config.json files too), eager/SDPA; Trainer, Marian."""

import json
import math

import pytest
import torch
from helpers import (
    BOS,
    EOS,
    FIRST_TOKEN_ID,
    PAD,
    assert_cached_search_is_uncached_search,
    assert_eager_equals_sdpa,
    assert_generate_matches_references,
    assert_incremental_decoding_matches_full_forward,
    assert_save_load_round_trip,
    assert_trainer_step_is_hand_computed,
    attention,
    causal_allowed,
    copy_task_rows,
    embed,
    feed_forward,
    float64_default,
    layer_norm,
    output_logits,
    padding_allowed,
    plain_attend,
    randomize_layer_norms,
    reference_stack,
    seeded_decoder_inputs,
    source_of,
)
from safetensors.torch import load_file
from transformers import AutoModelForSeq2SeqLM, MarianConfig, MarianMTModel

import hf_layerfusion
from hf_layerfusion import (
    LayerwiseCoordinationConfig,
    LayerwiseCoordinationForConditionalGeneration,
    PlainTransformerConfig,
    PlainTransformerForConditionalGeneration,
)
from hf_layerfusion.compat import output_cache
from hf_layerfusion.models.layerwise_coordination import mixed_attention_mask

ABLATIONS = {
    "paper": {},
    "no_sharing": dict(share_layer_parameters=False),
    "no_mixed_attention": dict(mixed_attention=False),
    "unshared_cross_attention": dict(mixed_attention=False, unshared_cross_attention=True),
    "no_position_embeddings": dict(position_embeddings=False),
    "pre_norm": dict(normalize_before=True),
}


def build(tiny_backbone, attn_implementation="eager", **overrides):
    config = LayerwiseCoordinationConfig(**{**tiny_backbone, "init_std": 0.3, **overrides})
    config._attn_implementation = attn_implementation
    return LayerwiseCoordinationForConditionalGeneration(config).eval()


def decoder_inputs(config, batch_size=3, length=6):
    ids = torch.randint(FIRST_TOKEN_ID, config.vocab_size, (batch_size, length))
    ids[:, 0] = config.decoder_start_token_id
    return ids


# ------------------------------------------------------------------------------------------------ Eq. 3 mask
def test_eq3_mask_explicit_matrix():
    """n = 3 source tokens (the last one padding in batch row 1), m = 3 target tokens: M(t, j) = 0 iff j < n (and
    j is not padding) or j <= t + n; written out by hand."""
    allowed_row0 = torch.tensor(
        [
            [1, 1, 1, 1, 0, 0],
            [1, 1, 1, 1, 1, 0],
            [1, 1, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    allowed_row1 = allowed_row0.clone()
    allowed_row1[:, 2] = False
    source_padding = torch.tensor([[True, True, True], [True, True, False]])[:, None, None, :].expand(2, 1, 3, 3)

    for additive in (False, True):
        source_part = source_padding if not additive else torch.zeros(2, 1, 3, 3).masked_fill(~source_padding, -1e30)
        mask = mixed_attention_mask(source_part, None, 2, 3, 3, 3, torch.float32, torch.device("cpu"), additive)
        allowed = mask if not additive else mask == 0
        assert allowed.shape == (2, 1, 3, 6)
        assert torch.equal(allowed[0, 0], allowed_row0) and torch.equal(allowed[1, 0], allowed_row1)
        if additive:  # masked entries carry the dtype's minimum, as transformers' eager masks do
            assert mask[0, 0, 0, 5] == torch.finfo(torch.float32).min

    # incremental step: one query (target position 2, two cached target tokens) sees every source token and all
    # three target tokens; no source padding materialises as all-visible
    step = mixed_attention_mask(None, None, 2, 1, 3, 3, torch.float32, torch.device("cpu"), additive=False)
    assert step.shape == (2, 1, 1, 6) and bool(step.all())
    # middle of a chunk: queries are target positions 1..2 of 3
    chunk = mixed_attention_mask(None, None, 1, 2, 2, 3, torch.float32, torch.device("cpu"), additive=False)
    assert torch.equal(chunk[0, 0], torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]], dtype=torch.bool))


def reference_mixed_attention(module, queries_from, source, target, source_keep, num_heads):
    """Eq. 1 + 3 by hand (`helpers.attention`, Eq. 1 with `module`'s projections): one softmax over [source ; target]
    keys, source padding and future targets masked."""
    batch, m = queries_from.shape[:2]
    n = source.shape[1]
    allowed = torch.zeros(batch, m, n + m, dtype=torch.bool)
    for b in range(batch):
        for t in range(m):
            for j in range(n + m):
                allowed[b, t, j] = bool(source_keep[b, j]) if j < n else j <= t + n
    return attention(module, queries_from, torch.cat([source, target], dim=1), allowed, num_heads)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("normalize_before", [False, True])
def test_mixed_attention_equals_brute_force_and_reads_encoder_layer_inputs(
    attn_implementation, normalize_before, tiny_backbone, padded_batch
):
    """Decoder layer i's mixed attention = the hand-computed Eq. 3 attention over [what encoder layer i's
    self-attention read ; the decoder layer's own normalised input]: post-norm s_{i-1}, pre-norm LN_i(s_{i-1}) with the
    shared block's LayerNorm."""
    model = build(tiny_backbone, attn_implementation, normalize_before=normalize_before, encoder_layers=3, decoder_layers=3)
    encoder_inputs, decoder_io = {}, {}
    hooks = []
    for i, layer in enumerate(model.model.encoder.layers):
        hooks.append(layer.self_attn.register_forward_pre_hook(lambda m, args, i=i: encoder_inputs.__setitem__(i, args[0])))
    for i, layer in enumerate(model.model.decoder.layers):
        hooks.append(
            layer.self_attn.register_forward_hook(lambda m, args, out, i=i: decoder_io.__setitem__(i, (args[0], out[0])))
        )
    decoder_input_ids = decoder_inputs(model.config)
    with torch.no_grad():
        model(**source_of(padded_batch), decoder_input_ids=decoder_input_ids)
    for hook in hooks:
        hook.remove()
    for i, layer in enumerate(model.model.decoder.layers):
        queries_from, output = decoder_io[i]
        expected = reference_mixed_attention(
            layer.self_attn, queries_from, encoder_inputs[i], queries_from, padded_batch["attention_mask"], 2
        )
        # padded source positions are never attended to, so compare every query position
        torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5, msg=f"decoder layer {i}")


def reference_separated_decoder_layer(shared, x, source, source_keep, pre_norm, num_heads):
    """Table 3's "w/o mixed attention" decoder layer i from its definition: the mixed attention separated "into
    self-attention and source-target attention as usual" inside the shared layer `shared` (= encoder layer i):
    causal self-attention over the target, then source-target attention over encoder state s_{i-1} (`source`, source
    padding masked), then the FFN, each a residual block; both attentions use the layer's one set of attention
    parameters and its attention block's LayerNorm (pre-norm: which also normalises s_{i-1}, as for the encoder's
    self-attention), so the model has no parameter the full model lacks."""
    shared_attention, attention_norm = shared.self_attn, shared.self_attn_block.layer_norm
    ffn, ffn_norm = shared.ffn, shared.ffn_block.layer_norm
    batch, m = x.shape[:2]
    causal = causal_allowed(batch, m)
    source_allowed = padding_allowed(source_keep, m)

    def residual_block(h, sublayer, norm):
        return h + sublayer(layer_norm(h, norm)) if pre_norm else layer_norm(h + sublayer(h), norm)

    memory = layer_norm(source, attention_norm) if pre_norm else source
    h = residual_block(x, lambda y: attention(shared_attention, y, y, causal, num_heads), attention_norm)
    h = residual_block(
        h, lambda y: attention(shared_attention, y, memory, source_allowed, num_heads), attention_norm
    )
    return residual_block(h, lambda y: feed_forward(y, ffn), ffn_norm)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
@pytest.mark.parametrize("normalize_before", [False, True])
def test_separated_attention_decoder_equals_reference(
    attn_implementation, normalize_before, tiny_backbone, padded_batch
):
    """`mixed_attention=False`: the logits equal a decoder computed by hand layer by layer from the definitions
    above, every parameter taken from the shared (encoder) layers, the final LayerNorm (pre-norm) the encoder's and
    the output projection the shared embeddings; inputs are the decoder's embeddings and each encoder layer's input
    s_{i-1}, recorded by hooks."""
    model = build(
        tiny_backbone, attn_implementation, mixed_attention=False, normalize_before=normalize_before,
        encoder_layers=3, decoder_layers=3,
    )
    with torch.no_grad():  # LayerNorms away from their identity init, so that using the wrong one shows
        for name, parameter in model.named_parameters():
            if "layer_norm" in name:
                parameter.copy_(torch.randn_like(parameter) * 0.5 + (1.0 if name.endswith("weight") else 0.0))
    encoder_inputs, decoder_input = {}, {}
    hooks = [
        layer.register_forward_pre_hook(lambda m, args, i=i: encoder_inputs.__setitem__(i, args[0]))
        for i, layer in enumerate(model.model.encoder.layers)
    ]
    hooks.append(
        model.model.decoder.layers[0].register_forward_pre_hook(lambda m, args: decoder_input.__setitem__(0, args[0]))
    )
    decoder_input_ids = decoder_inputs(model.config)
    with torch.no_grad():
        logits = model(**source_of(padded_batch), decoder_input_ids=decoder_input_ids).logits
    for hook in hooks:
        hook.remove()

    with torch.no_grad():
        h = decoder_input[0]
        for i, shared in enumerate(model.model.encoder.layers):
            h = reference_separated_decoder_layer(
                shared, h, encoder_inputs[i], padded_batch["attention_mask"], normalize_before, num_heads=2
            )
        if normalize_before:
            h = layer_norm(h, model.model.encoder.layer_norm)
        expected = h @ model.model.shared.weight.T + model.final_logits_bias
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("position_embeddings", [True, False])
def test_resettable_positions_and_language_embeddings(position_embeddings, tiny_backbone, padded_batch):
    """s_0 = sqrt(d) E[x] + P[pos] + e_lang with positions 0..n-1 in the source and 0..m-1 again in the target;
    P is the sinusoidal table (Marian layout: sin in the first half, cos in the second), written out here. Table 3
    "w/o position embedding" (`position_embeddings=False`): s_0 = sqrt(d) E[x] + e_lang."""
    model = build(tiny_backbone, position_embeddings=position_embeddings)
    d = model.config.d_model
    inputs = {}
    hooks = [
        stack.layers[0].register_forward_pre_hook(lambda m, args, name=name: inputs.__setitem__(name, args[0]))
        for name, stack in (("encoder", model.model.encoder), ("decoder", model.model.decoder))
    ]
    decoder_input_ids = decoder_inputs(model.config, length=4)
    with torch.no_grad():
        model(**source_of(padded_batch), decoder_input_ids=decoder_input_ids)
    for hook in hooks:
        hook.remove()

    def table(length):
        rows = []
        for pos in range(length):
            freqs = [pos / 10000 ** (2 * i / d) for i in range(d // 2)]
            rows.append([math.sin(f) for f in freqs] + [math.cos(f) for f in freqs])
        return torch.tensor(rows)

    embed = model.model.shared.weight
    for name, ids in (("encoder", padded_batch["input_ids"]), ("decoder", decoder_input_ids)):
        language = getattr(model.model, name).connection.language_embedding.weight[0]
        expected = math.sqrt(d) * embed[ids] + language + (table(ids.shape[1]) if position_embeddings else 0)
        torch.testing.assert_close(inputs[name], expected, atol=1e-5, rtol=1e-5, msg=name)
    assert not torch.equal(
        model.model.encoder.connection.language_embedding.weight, model.model.decoder.connection.language_embedding.weight
    )

    no_language = build(tiny_backbone, language_embeddings=False)
    assert no_language.model.encoder.connection is None and no_language.model.decoder.connection is None


# ------------------------------------------------------------------------------------------------ sharing
def layer_parameters(d, ffn, cross_attention=False):
    """One post-norm layer: attention 4 (d^2 + d), FFN 2 d ffn + ffn + d, a LayerNorm (2 d) per residual block."""
    attention = 4 * (d * d + d)
    blocks = 2 + cross_attention
    return attention * (1 + cross_attention) + 2 * d * ffn + ffn + d + blocks * 2 * d


def count(model):
    return sum(p.numel() for p in model.parameters())  # each shared tensor counted once


def test_sharing_same_parameter_objects_and_table3_arithmetic(tiny_backbone):
    d, ffn, vocab = tiny_backbone["d_model"], tiny_backbone["encoder_ffn_dim"], tiny_backbone["vocab_size"]
    model = build(tiny_backbone, encoder_layers=4, decoder_layers=4)
    for encoder_layer, decoder_layer in zip(model.model.encoder.layers, model.model.decoder.layers):
        for name, parameter in encoder_layer.named_parameters():
            assert decoder_layer.get_parameter(name) is parameter, name
        assert dict(decoder_layer.named_parameters()).keys() == dict(encoder_layer.named_parameters()).keys()
    language = 2 * d
    # sharing on: one stack of 4 layers (the paper's 14 shared layers ~ a 6 + 6 Transformer, Sec. 4.2)
    assert count(model) == vocab * d + 4 * layer_parameters(d, ffn) + language
    # Table 3: every ablation row has the full model's parameter count (19.07M in the paper); "w/o weight sharing"
    # with half the layers, "w/o mixed attention" computing both attentions with the layer's own parameters
    unshared = build(tiny_backbone, encoder_layers=2, decoder_layers=2, share_layer_parameters=False)
    separated = build(tiny_backbone, encoder_layers=4, decoder_layers=4, mixed_attention=False)
    no_positions = build(tiny_backbone, encoder_layers=4, decoder_layers=4, position_embeddings=False)
    assert count(unshared) == count(separated) == count(no_positions) == count(model)
    for encoder_layer, decoder_layer in zip(unshared.model.encoder.layers, unshared.model.decoder.layers):
        assert all(decoder_layer.get_parameter(n) is not p for n, p in encoder_layer.named_parameters())
    for encoder_layer, decoder_layer in zip(separated.model.encoder.layers, separated.model.decoder.layers):
        for name, parameter in encoder_layer.self_attn.named_parameters():
            assert decoder_layer.encoder_attn.get_parameter(name) is parameter
            assert decoder_layer.self_attn.get_parameter(name) is parameter
        assert decoder_layer.encoder_attn_block.layer_norm.weight is encoder_layer.self_attn_block.layer_norm.weight
    # "w/o source/target embedding" drops the two language vectors (2 d; 512 of the paper's 19.07M)
    no_language = build(tiny_backbone, encoder_layers=4, decoder_layers=4, language_embeddings=False)
    assert count(no_language) == count(model) - language
    # sharing and mixed attention off, an unshared cross-attention, no language embeddings: the plain model's count
    plain_like = build(
        tiny_backbone, share_layer_parameters=False, mixed_attention=False, unshared_cross_attention=True,
        language_embeddings=False,
    )
    plain = PlainTransformerForConditionalGeneration(PlainTransformerConfig(**tiny_backbone))
    expected_plain = vocab * d + 2 * layer_parameters(d, ffn) + 2 * layer_parameters(d, ffn, cross_attention=True)
    assert count(plain_like) == count(plain) == expected_plain
    # an unshared cross-attention with sharing: self-attention and FFN shared, cross-attention (and its block) per
    # decoder layer
    separate = build(tiny_backbone, mixed_attention=False, unshared_cross_attention=True)
    cross = 4 * (d * d + d) + 2 * d
    assert count(separate) == vocab * d + 2 * layer_parameters(d, ffn) + 2 * cross + language


def test_paper_small_preset_matches_the_6_plus_6_transformer():
    """Sec. 4.2: 14 shared layers at d 256, FFN 1024, 4 heads have about the parameters of the 6 + 6 Transformer of
    that size: they differ by the 6 decoder cross-attentions (6 (4 d^2 + 4 d + 2 d)) less 2 layers, plus the
    language embeddings (2 d), 2048 parameters."""
    config = LayerwiseCoordinationConfig.from_preset("layerwise_paper_small", vocab_size=100)
    paper = dict(d_model=256, encoder_ffn_dim=1024, decoder_ffn_dim=1024, encoder_attention_heads=4,
                 decoder_attention_heads=4, encoder_layers=14, decoder_layers=14)
    assert {key: getattr(config, key) for key in paper} == paper
    assert config.share_layer_parameters and config.mixed_attention and config.decoder_start_token_id == BOS
    with torch.device("meta"):
        model = LayerwiseCoordinationForConditionalGeneration(config)
        plain = PlainTransformerForConditionalGeneration(PlainTransformerConfig.from_preset("multi30k", vocab_size=100))
    d, ffn = 256, 1024
    assert count(model) == 100 * d + 14 * layer_parameters(d, ffn) + 2 * d
    assert count(plain) - count(model) == 6 * (4 * d * d + 6 * d) - 2 * layer_parameters(d, ffn) - 2 * d == 2048


def test_gradients_from_both_stacks_reach_shared_layers(tiny_backbone, padded_batch):
    """A shared layer collects gradient from its encoder use and its decoder use."""
    model = build(tiny_backbone).train()
    model(**padded_batch).loss.backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, name
    weight = model.model.encoder.layers[0].ffn.fc1.weight
    total = weight.grad.clone()
    model.zero_grad()
    # the decoder alone (encoder states detached) gives only part of it
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(**source_of(padded_batch))
    model(encoder_outputs=encoder_outputs, attention_mask=padded_batch["attention_mask"], labels=padded_batch["labels"]).loss.backward()
    assert weight.grad.abs().sum() > 0 and not torch.allclose(weight.grad, total)


@pytest.mark.parametrize(
    "ablation", ["paper", "no_mixed_attention", "unshared_cross_attention", "no_position_embeddings"]
)
def test_pre_norm_every_parameter_gets_a_gradient(ablation, tiny_backbone, padded_batch):
    """Pre-norm with sharing: the encoder's final LayerNorm is the decoder's (nothing reads the encoder's top output),
    so no parameter is left without a gradient."""
    model = build(tiny_backbone, normalize_before=True, **ABLATIONS[ablation]).train()
    model(**padded_batch).loss.backward()
    without = [name for name, p in model.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert without == []
    assert model.model.decoder.layer_norm.weight is model.model.encoder.layer_norm.weight


@pytest.mark.parametrize("normalize_before", [False, True])
def test_without_sharing_only_the_unread_top_encoder_layer_gets_no_gradient(
    normalize_before, tiny_backbone, padded_batch
):
    """Sharing off: decoder layer i reads s_{i-1}, so the top encoder layer (and, pre-norm, the encoder's final
    LayerNorm) is read by nothing; every other parameter gets a gradient."""
    model = build(tiny_backbone, normalize_before=normalize_before, share_layer_parameters=False).train()
    model(**padded_batch).loss.backward()
    without = {name for name, p in model.named_parameters() if p.grad is None}
    top = len(model.model.encoder.layers) - 1
    expected = {f"model.encoder.layers.{top}.{name}" for name, _ in model.model.encoder.layers[top].named_parameters()}
    if normalize_before:
        expected |= {"model.encoder.layer_norm.weight", "model.encoder.layer_norm.bias"}
    assert without == expected


# ------------------------------------------------------------------------------------------------ cache, beam
@pytest.mark.parametrize("ablation", sorted(ABLATIONS))
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_incremental_decoding_and_beam_search(ablation, attn_implementation, tiny_backbone, padded_batch):
    model = build(tiny_backbone, attn_implementation, **ABLATIONS[ablation])
    source = source_of(padded_batch)
    assert_incremental_decoding_matches_full_forward(model, source, decoder_inputs(model.config))
    assert_cached_search_is_uncached_search(model, source, num_beams=4)


def test_source_keys_cached_once_target_keys_grow(tiny_backbone, padded_batch):
    model = build(tiny_backbone)
    source = source_of(padded_batch)
    with torch.no_grad():
        out = model(**source, decoder_input_ids=torch.full((3, 1), BOS), use_cache=True)
        cache = output_cache(out)
        source_keys = [layer.keys.clone() for layer in cache.cross_attention_cache.layers]
        out = model(
            encoder_outputs=(out.encoder_last_hidden_state,),
            attention_mask=source["attention_mask"],
            decoder_input_ids=torch.full((3, 1), FIRST_TOKEN_ID),
            cache=cache,
            use_cache=True,
        )
    for i, layer in enumerate(cache.cross_attention_cache.layers):
        assert layer.keys.shape[2] == source["input_ids"].shape[1]  # the whole source, computed once
        torch.testing.assert_close(layer.keys, source_keys[i])
        assert cache.self_attention_cache.layers[i].keys.shape[2] == 2


def test_generate_greedy_beam_sampling_and_start_token(tiny_backbone, padded_batch):
    model = build(tiny_backbone)
    assert model.config.decoder_start_token_id == model.config.bos_token_id == BOS  # source ... EOS, then SOS
    # the start token is the family's, whatever the bos id; an explicit id still wins
    assert LayerwiseCoordinationConfig(**tiny_backbone, bos_token_id=5).decoder_start_token_id == 5
    assert LayerwiseCoordinationConfig(**tiny_backbone, decoder_start_token_id=EOS).decoder_start_token_id == EOS
    assert PlainTransformerConfig(**tiny_backbone, eos_token_id=7).decoder_start_token_id == 7
    # greedy, beam search and sampling against step-by-step decoding over full forward passes (tests/helpers.py)
    for sequences in assert_generate_matches_references(model, source_of(padded_batch)):
        assert bool((sequences[:, 0] == BOS).all())
    # the decoder needs the source (mixed attention); alone it refuses by name
    with pytest.raises(ValueError, match="mixed attention"):
        model.get_decoder()(input_ids=torch.full((1, 2), BOS))


# ------------------------------------------------------------------------------------------------ io, impls
@pytest.mark.parametrize("ablation", ["paper", "no_mixed_attention", "unshared_cross_attention", "pre_norm"])
def test_save_load_round_trip(ablation, tiny_backbone, padded_batch, tmp_path):
    """The family contract's round trip (tests/helpers.py) of each ablation, and how its shared layers are stored and
    tied back."""
    model = build(tiny_backbone, **ABLATIONS[ablation])
    loaded = assert_save_load_round_trip(model, padded_batch, tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    # every tied tensor is stored once, under its source's name: with sharing a decoder layer stores nothing but an
    # unshared cross-attention, and the decoder's final LayerNorm (pre-norm) is the encoder's
    decoder_sublayers = {key.split(".")[4] for key in stored if key.startswith("model.decoder.layers.")}
    own = {"encoder_attn", "encoder_attn_block"} if model.config.unshared_cross_attention else set()
    assert decoder_sublayers == own
    assert not any(key.startswith("model.decoder.layer_norm.") for key in stored)
    assert "model.encoder.connection.language_embedding.weight" in stored
    loaded_encoder, loaded_decoder = loaded.model.encoder, loaded.model.decoder
    assert loaded_decoder.layers[1].ffn.fc2.weight is loaded_encoder.layers[1].ffn.fc2.weight
    assert loaded_decoder.layers[1].self_attn.q_proj.weight is loaded_encoder.layers[1].self_attn.q_proj.weight
    if not model.config.mixed_attention and not model.config.unshared_cross_attention:
        assert loaded_decoder.layers[1].encoder_attn.q_proj.weight is loaded_encoder.layers[1].self_attn.q_proj.weight
    if model.config.normalize_before:
        assert loaded_decoder.layer_norm.weight is loaded_encoder.layer_norm.weight


def test_config_saved_before_the_new_switches_loads_as_it_was_trained(tiny_backbone, padded_batch, tmp_path):
    """A config.json written before `unshared_cross_attention`, `position_embeddings` and `embedding_init` existed:
    `mixed_attention=False` then meant a cross-attention of its own, so the checkpoint loads with
    `unshared_cross_attention=True` and its own logits; the other keys take their defaults (the old behaviour)."""
    model = build(tiny_backbone, **ABLATIONS["unshared_cross_attention"])
    model.save_pretrained(tmp_path)
    config_file = tmp_path / "config.json"
    saved = json.loads(config_file.read_text())
    for key in ("unshared_cross_attention", "position_embeddings", "embedding_init"):
        del saved[key]
    config_file.write_text(json.dumps(saved))
    loaded = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, attn_implementation="eager").eval()
    assert loaded.config.unshared_cross_attention and loaded.config.position_embeddings
    assert loaded.config.embedding_init == "init_std"
    with torch.no_grad():
        torch.testing.assert_close(loaded(**padded_batch).logits, model(**padded_batch).logits, atol=0, rtol=0)
    # a saved mixed-attention model is unaffected, and so is a dict that is not a saved config of this family
    saved.update(mixed_attention=True)
    assert not LayerwiseCoordinationConfig.from_dict(saved).unshared_cross_attention
    unsaved = {key: value for key, value in saved.items() if key != "model_type"} | {"mixed_attention": False}
    assert not LayerwiseCoordinationConfig.from_dict(unsaved).unshared_cross_attention


@pytest.mark.parametrize("ablation", ["paper", "no_mixed_attention", "unshared_cross_attention"])
def test_eager_equals_sdpa(ablation, tiny_backbone, padded_batch):
    assert_eager_equals_sdpa(build(tiny_backbone, **ABLATIONS[ablation]), padded_batch, rtol=1e-5)


def test_flash_attention_refused(tiny_backbone):
    config = LayerwiseCoordinationConfig(**tiny_backbone)
    with pytest.raises(ValueError, match="[Ff]lash"):
        LayerwiseCoordinationForConditionalGeneration._from_config(config, attn_implementation="flash_attention_2")


def test_trainer_one_step(tmp_path, tiny_backbone):
    """One Trainer step is the SGD step computed by hand from the model's loss: a shared layer moves by the gradient
    of both its uses, once, and stays shared."""
    model = build(tiny_backbone).train()
    _, gradients = assert_trainer_step_is_hand_computed(model, copy_task_rows(tiny_backbone["vocab_size"]), tmp_path)
    assert gradients["model.encoder.layers.0.ffn.fc1.weight"].abs().sum() > 0
    assert model.model.decoder.layers[0].ffn.fc1.weight is model.model.encoder.layers[0].ffn.fc1.weight


# ------------------------------------------------------------------------------------------------ config, Marian
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (dict(encoder_layers=3, decoder_layers=2), r"`encoder_layers` \(3\) must equal `decoder_layers` \(2\)"),
        (dict(decoder_attention_heads=4), r"`encoder_attention_heads` \(2\) must equal `decoder_attention_heads` \(4\)"),
        (dict(decoder_ffn_dim=8), r"`encoder_ffn_dim` \(32\) must equal `decoder_ffn_dim` \(8\)"),
        (dict(layerwise_memory=False), "layerwise_memory=False"),
        (dict(unshared_cross_attention=True), "unshared_cross_attention=True.*mixed_attention=True"),
        (dict(position_embeddings="no"), r"`position_embeddings` is a switch and must be True or False, got 'no'"),
    ],
)
def test_config_validation(overrides, message, tiny_backbone):
    with pytest.raises(ValueError, match=message):
        LayerwiseCoordinationConfig(**{**tiny_backbone, **overrides})


def test_config_allows_unshared_sizes_and_top_memory_ablation(tiny_backbone):
    config = LayerwiseCoordinationConfig(
        **{**tiny_backbone, "decoder_ffn_dim": 8}, share_layer_parameters=False, mixed_attention=False, layerwise_memory=False
    )
    assert config.decoder_layer_layouts == ["scf", "scf"]
    assert LayerwiseCoordinationConfig(**tiny_backbone).decoder_layer_layouts == ["sf", "sf"]
    assert hf_layerfusion.FAMILIES["layerwise_coordination"][0] is LayerwiseCoordinationConfig


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_from_marian_plain_configuration_matches_marian(attn_implementation, padded_batch):
    """Sharing, mixed attention, layer-wise memory and language embeddings off, the cross-attention unshared = the
    plain Transformer."""
    marian = MarianMTModel(
        MarianConfig(
            vocab_size=24, d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
            pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD, scale_embedding=True, dropout=0.0,
            attn_implementation=attn_implementation,
        )
    ).eval()
    model = hf_layerfusion.from_marian(
        marian,
        model_type="layerwise_coordination",
        attn_implementation=attn_implementation,
        share_layer_parameters=False,
        mixed_attention=False,
        unshared_cross_attention=True,
        layerwise_memory=False,
        language_embeddings=False,
    ).eval()
    decoder_input_ids = decoder_inputs(model.config)
    with torch.no_grad():
        expected = marian(**source_of(padded_batch), decoder_input_ids=decoder_input_ids).logits
        actual = model(**source_of(padded_batch), decoder_input_ids=decoder_input_ids).logits
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


# ------------------------------------------------------------------------------------------- pre-norm
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
    targets = seeded_decoder_inputs(model)
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
