"""The fast decoding loop (`hf_layerfusion.inference`) against `generate()`, the reference: the same tokens for
every family, greedy and beam search, with and without GTrans `decoder_groups`, on the model itself (torch
operations) and on its float32 inference copy (the compiled kernels); rows leaving the batch; the fallback to
`generate()`; when the copies are made; the int8 copy."""

import copy

import pytest
import torch
from helpers import (EOS, FIRST_TOKEN_ID, PAD, SOURCES, TINY_BACKBONE, CountingKernels, one_call_applies, tiny_model,
                     tiny_sources, varied_gtrans)
from transformers import GenerationConfig
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

import hf_layerfusion
from hf_layerfusion.inference import (
    UnsupportedFastGeneration,
    decoding,
    decoding_attention,
    encoding,
    fast_decoding_loop,
    fast_generate,
    fast_generation,
    inference_copies,
    prepare_for_inference,
    search,
)
from hf_layerfusion.compat import CACHE_NAME, LEGACY_CACHE_NAME
from hf_layerfusion.inference.decoding import DecoderSteps
from hf_layerfusion.inference.inference_copies import Float32Linear, Int8Linear, float32_kernel_available
from hf_layerfusion.modeling.model import LayerFusionForConditionalGeneration

FAMILIES = sorted(hf_layerfusion.FAMILIES)

SEARCHES = {
    "greedy": dict(num_beams=1, max_new_tokens=10),
    "beam": dict(num_beams=3, max_new_tokens=10),
}


@pytest.fixture(autouse=True)
def every_length_its_own_encoder_group(monkeypatch):
    """Every test below runs `fast_generate`'s encoder in groups of one source length each (at these tiny sizes one
    group covers the batch best): the tokens are checked with the grouped encoder."""
    monkeypatch.setattr(encoding, "CALL_COST_POSITIONS", 0)


@pytest.fixture
def source() -> dict:
    return tiny_sources()


def reference(model, source, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        return model.generate(**source, **kwargs)


def assert_same_tokens(model, source, **kwargs):
    """The fast loop on the model itself (torch operations: what runs without the compiled kernels, and in the
    Trainer's evaluation) and `fast_generate` (the model's float32 copy, where the kernels run) give generate()'s
    tokens."""
    expected = reference(model, source, **kwargs)
    with torch.no_grad():
        own_layers = model.generate(**source, custom_generate=fast_decoding_loop(fallback=False), **kwargs)
    actual = fast_generate(model, **source, fallback=False, **kwargs)
    for tokens in (own_layers, actual):
        assert tokens.shape == expected.shape and torch.equal(tokens, expected), (kwargs, expected, tokens)
    return actual


@pytest.mark.parametrize("search", sorted(SEARCHES))
@pytest.mark.parametrize("model_type", FAMILIES)
def test_every_family_generates_the_tokens_of_generate(model_type, search, source):
    for seed in range(2):
        model = tiny_model(model_type, seed)
        assert_same_tokens(model, source, **SEARCHES[search])
        groups = model.config.num_decoder_groups
        if groups > 1:
            for subset in ([groups], [1]):
                assert_same_tokens(model, source, decoder_groups=subset, **SEARCHES[search])


# family settings that change what the decoder's attention reads or keeps (cache slots, per-layer memories, mixed
# attention, trees, layouts) and the backbone's variants (pre-norm, learned positions, eager attention)
VARIANTS = {
    "deep_representations multi-layer attention, pre-norm": (
        "deep_representations",
        dict(encoder_aggregation="multi_layer_attention", decoder_aggregation="multi_layer_attention",
             encoder_layers=4, decoder_layers=4, normalize_before=True),
    ),
    "deep_representations iterative": (
        "deep_representations", dict(encoder_aggregation="iterative", decoder_aggregation="iterative")
    ),
    "deep_representations dense + linear": (
        "deep_representations", dict(encoder_aggregation="dense", decoder_aggregation="linear")
    ),
    "layerwise_coordination without mixed attention": ("layerwise_coordination", dict(mixed_attention=False)),
    "layerwise_coordination pre-norm": ("layerwise_coordination", dict(normalize_before=True)),
    "rtal concat, children residual": ("rtal", dict(aggregation_function="concat_ffn", tree_residual="children")),
    "re_transformer sff encoder, scf-sfc decoder": (
        "re_transformer", dict(encoder_layout="s-sff", decoder_layout="scf-sfc")
    ),
    "gtrans learned positions": (
        "gtrans",
        dict(encoder_group_size=1, decoder_group_size=1, position_embedding_type="learned", layernorm_embedding=True),
    ),
}


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_family_variants_generate_the_tokens_of_generate(variant, attention, source):
    model_type, overrides = VARIANTS[variant]
    config_class, _, model_class = hf_layerfusion.FAMILIES[model_type]
    torch.manual_seed(1)
    model = model_class(config_class(**{**TINY_BACKBONE, **overrides})).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape) * 0.5)
    model.set_attn_implementation(attention)
    for search_options in SEARCHES.values():
        assert_same_tokens(model, source, **search_options)


@pytest.mark.parametrize(
    "settings",
    [
        dict(num_beams=4, num_return_sequences=2),
        dict(num_beams=3, early_stopping=True),
        dict(num_beams=3, early_stopping="never", length_penalty=0.3),
        dict(num_beams=3, length_penalty=-0.5),
        dict(num_beams=1, min_new_tokens=6),
        dict(num_beams=4, min_new_tokens=3, no_repeat_ngram_size=2, repetition_penalty=1.3),
        dict(num_beams=1, bad_words_ids=[[5], [6, 7]], forced_eos_token_id=EOS),
        # two end tokens (11: both tiny models generate it within 9 tokens, so rows end at different steps)
        dict(num_beams=1, eos_token_id=[EOS, 11]),
        dict(num_beams=3, eos_token_id=[EOS, 11]),
    ],
    ids=lambda settings: ",".join(f"{key}={value}" for key, value in settings.items()),
)
def test_search_settings_are_those_of_generate(settings, source):
    for model_type in ("gtrans", "plain_transformer"):
        assert_same_tokens(tiny_model(model_type), source, max_new_tokens=9, **settings)


def test_finished_rows_leave_the_batch_without_changing_tokens(source, monkeypatch):
    """Sentences that end early stop being computed (greedy: finished rows; beam: items whose beams are final);
    this model is biased towards EOS so that its translations end at different steps (one thread, as conftest sets
    it: the bias is near a tipping point)."""
    model = tiny_model("plain_transformer", seed=5)
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = 4.0
    kept_rows = []
    select = DecoderSteps.select

    def recording_select(self, index, rows_dropped):
        if rows_dropped:
            kept_rows.append(index.shape[0])
        select(self, index, rows_dropped)

    monkeypatch.setattr(DecoderSteps, "select", recording_select)
    for settings in (dict(num_beams=1), dict(num_beams=2), dict(num_beams=2, early_stopping=True)):
        kept_rows.clear()
        assert_same_tokens(model, source, max_new_tokens=12, **settings)
        assert kept_rows, f"no row left the batch with {settings}"


def test_greedy_rows_leave_at_once_where_leaving_copies_nothing(source, kernels, monkeypatch):
    """Where rows leave the batch without copying the caches (the compiled layers read them through `key_rows` and
    `memory_rows`: `DecoderSteps.drops_rows_without_copies`), every greedy step computes exactly the sentences that
    have not ended; on the model itself (whose caches are copied) finished rows wait until they are
    `COMPACTION_SHARE` of the rows. The sentences are made to end at chosen steps: the decoder's logits, followed
    through rows leaving the batch, give EOS to sentence i at step `ends[i]`."""
    ends = [3, 1, 6, 2, 8]
    logits, select = DecoderSteps.logits, DecoderSteps.select
    rows, without_copies = [], []

    def ending_logits(self, tokens):
        sentences = getattr(self, "sentences", torch.arange(tokens.shape[0]))
        self.sentences = sentences
        rows.append(tokens.shape[0])
        without_copies.append(self.drops_rows_without_copies())
        scores = logits(self, tokens)
        for row, sentence in enumerate(sentences.tolist()):
            if self.position - 1 == ends[sentence]:
                scores[row] = -1e4
                scores[row, EOS] = 0.0
        return scores

    def following_select(self, index, rows_dropped):
        if rows_dropped:
            self.sentences = self.sentences[index]
        select(self, index, rows_dropped)

    monkeypatch.setattr(DecoderSteps, "logits", ending_logits)
    monkeypatch.setattr(DecoderSteps, "select", following_select)
    model = tiny_model("plain_transformer", d_model=32)  # head_dim 16: the compiled layers' smallest
    tokens = fast_generate(model, **source, num_beams=1, max_new_tokens=12, fallback=False)
    assert [(row == EOS).nonzero()[0].item() for row in tokens[:, 1:]] == ends, tokens
    not_ended = [sum(end >= step for end in ends) for step in range(max(ends) + 1)]  # [5, 4, 3, 3, 2, 2, 2, 1, 1]
    assert rows == not_ended, (rows, without_copies, tokens)
    assert without_copies[1:] == [True] * (len(rows) - 1)  # from the second step on (the first fills the caches)
    rows.clear(), without_copies.clear()
    with torch.no_grad():
        own_layers = model.generate(**source, num_beams=1, max_new_tokens=12,
                                    custom_generate=fast_decoding_loop(fallback=False))
    assert torch.equal(own_layers, tokens) and not any(without_copies)
    # rows leave once max(1, COMPACTION_SHARE x rows) have finished: two of five (after step 2), then one of three
    # and one of two
    assert search.COMPACTION_SHARE == 0.25 and rows == [5, 5, 5, 3, 2, 2, 2, 1, 1], rows


@pytest.mark.parametrize(
    "settings",
    [dict(num_beams=3), dict(num_beams=4, num_return_sequences=2), dict(num_beams=2, early_stopping=True),
     dict(num_beams=3, early_stopping="never", length_penalty=0.3)],
    ids=lambda settings: ",".join(f"{key}={value}" for key, value in settings.items()),
)
def test_beam_search_widens_its_sequences_as_they_grow_without_changing_tokens(settings, source, monkeypatch):
    """Beam search's sequence tensors start `SEQUENCE_WIDTH_STEP` positions past the prompt and widen when a step
    would write past them (the last time only up to `max_length`): with a step of 2 they widen every other step, on a
    model whose sentences end at different steps (so items leave the batch in between), and the tokens stay
    generate()'s."""
    monkeypatch.setattr(search, "SEQUENCE_WIDTH_STEP", 2)
    widenings = []
    widened = search.widened

    def recording_widened(tensor, columns, fill_value):
        widenings.append(columns)
        return widened(tensor, columns, fill_value)

    monkeypatch.setattr(search, "widened", recording_widened)
    model = tiny_model("plain_transformer", seed=5)
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = 2.0
    for max_new_tokens in (9, 12):
        widenings.clear()
        assert_same_tokens(model, source, max_new_tokens=max_new_tokens, **settings)
        assert widenings, settings


def test_settings_outside_the_loop_fall_back_to_generate(source, caplog):
    model = tiny_model("gtrans")
    torch.manual_seed(3)
    sampled = fast_generate(model, **source, do_sample=True, max_new_tokens=6)
    torch.manual_seed(3)
    assert torch.equal(sampled, reference(model, source, do_sample=True, max_new_tokens=6))
    scores = fast_generate(model, **source, num_beams=2, max_new_tokens=4, output_scores=True, return_dict_in_generate=True)
    assert torch.equal(scores.sequences, reference(model, source, num_beams=2, max_new_tokens=4))
    with pytest.raises(UnsupportedFastGeneration, match="generation mode sample"):
        fast_generate(model, **source, do_sample=True, max_new_tokens=6, fallback=False)
    with pytest.raises(UnsupportedFastGeneration, match="streamer"):
        fast_generate(model, **source, max_new_tokens=6, streamer=object(), fallback=False)
    with pytest.raises(UnsupportedFastGeneration, match="training mode"):
        fast_generate(model.train(), **source, max_new_tokens=6, fallback=False)


@pytest.mark.parametrize("num_beams", [2, 4])
def test_lower_precision_and_autocast_run_generate(num_beams):
    """Fault round: in bfloat16 (the model's weights, or autocast as `Seq2SeqTrainer(bf16=True)` evaluates), the loop's
    rows leaving the batch change the products' shapes and rounding, and beam search chose otherwise than generate();
    under autocast the float32 copy's kernel refused its bfloat16 input. Both now run generate() itself."""
    model, tokenizer, sources = varied_gtrans()
    batch = tokenizer(sources, padding=True, return_tensors="pt")
    settings = dict(num_beams=num_beams, max_new_tokens=12)
    half = copy.deepcopy(model).to(torch.bfloat16)
    assert torch.equal(fast_generate(half, **batch, **settings), reference(half, batch, **settings))
    with pytest.raises(UnsupportedFastGeneration, match="torch.bfloat16 model"):
        fast_generate(half, **batch, fallback=False, **settings)
    with pytest.raises(UnsupportedFastGeneration, match="torch.bfloat16 model"):  # the loop as a generate() hook
        half.generate(**batch, custom_generate=fast_decoding_loop(fallback=False), **settings)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = reference(model, batch, **settings)
        assert torch.equal(fast_generate(model, **batch, **settings), expected)
        assert torch.equal(model.generate(**batch, custom_generate=fast_decoding_loop(), **settings), expected)
        with pytest.raises(UnsupportedFastGeneration, match="autocast"):
            fast_generate(model, **batch, fallback=False, **settings)
        with pytest.raises(UnsupportedFastGeneration, match="autocast"):
            model.generate(**batch, custom_generate=fast_decoding_loop(fallback=False), **settings)


def test_generate_is_handed_an_empty_cache_a_fallback_fills_as_its_own(source):
    """`fast_generate` hands `generate()` an empty cache (which the loop never fills: it keeps its own), sparing
    `generate()` the making of its own from the model's config, except where the caller gives one (under either
    name), turns the cache off or asks for another kind; a fallback inside the loop (the int8 copy's: its own
    `generate()`) fills it as `generate()` fills its own, greedy and beam."""
    model = tiny_model("plain_transformer")
    (handed,) = fast_generation.empty_cache_for_generate(model, {}).values()
    assert type(handed) is EncoderDecoderCache and handed.get_seq_length() == 0
    assert fast_generation.empty_cache_for_generate(model, {}) != {CACHE_NAME: handed}  # a new one per call
    for kwargs in (
        {CACHE_NAME: EncoderDecoderCache(DynamicCache(), DynamicCache())},
        {LEGACY_CACHE_NAME: EncoderDecoderCache(DynamicCache(), DynamicCache())},
        {"use_cache": False},
        {"generation_config": GenerationConfig(use_cache=False)},
        {"cache_implementation": "static"},
    ):
        assert fast_generation.empty_cache_for_generate(model, kwargs) == {}, kwargs
    engine = prepare_for_inference(model, "int8")
    for num_beams in (1, 2):
        settings = dict(num_beams=num_beams, max_new_tokens=5, return_dict_in_generate=True, output_scores=True)
        output = fast_generate(model, **source, quantization="int8", **settings)
        with torch.no_grad():
            expected = engine.generate(**source, **settings)
        assert torch.equal(output.sequences, expected.sequences), num_beams
        assert all(torch.equal(got, want) for got, want in zip(output.scores, expected.scores, strict=True))


def mixes_through_the_declared_hook(model) -> bool:
    """Whether the family's output head mixes its groups through the backbone's `mix_output_groups` (which the
    copies run as the compiled `mixture_kernel`), not an override of its own."""
    return type(model).mix_output_groups is LayerFusionForConditionalGeneration.mix_output_groups


needs_float32_kernel = pytest.mark.skipif(
    not float32_kernel_available(), reason="the float32 copy needs the compiled kernels and AVX-512 or AVX2 with FMA"
)


@needs_float32_kernel
@pytest.mark.parametrize("model_type", FAMILIES)
def test_the_float32_copy_runs_the_kernels_at_every_step_and_generates_the_tokens_of_generate(model_type, kernels, monkeypatch):
    """Every family with head_dim 16 (the attention kernel's smallest): `fast_generate` runs the float32 copy, whose
    every linear layer and decoding-step attention is a compiled kernel (most of them inside the compiled sub-layer
    steps), and gives generate()'s tokens."""
    model = tiny_model(model_type, d_model=32)
    source = tiny_sources()
    engine = prepare_for_inference(model)
    assert engine is not model and engine.prepared_for_inference == "float32"
    assert not [m for m in engine.model.modules() if type(m) is torch.nn.Linear]
    assert isinstance(engine.output_projection, Float32Linear) and model.output_projection is None
    assert type(model.model.decoder.layers[0].ffn.fc1) is torch.nn.Linear  # the model itself is untouched
    assert engine.model.shared.weight is model.model.shared.weight and engine.generation_config is model.generation_config
    counting = CountingKernels(kernels)
    monkeypatch.setattr(decoding_attention, "compiled_kernels", lambda: counting)
    monkeypatch.setattr(inference_copies, "compiled_kernels", lambda: counting)
    monkeypatch.setattr(search, "compiled_kernels", lambda: counting)
    monkeypatch.setattr(decoding, "compiled_kernels", lambda: counting)
    float32_forward = Float32Linear.forward

    def counted_forward(layer, hidden_states, out=None):  # a `KernelLinear` call (float32_linear) from Python
        counting.calls["Float32Linear"] += 1
        return float32_forward(layer, hidden_states, out)

    monkeypatch.setattr(Float32Linear, "forward", counted_forward)
    layer_states = inference_copies.CompiledDecoderLayers.states

    def counted_states(layers, *args):  # every layer of a step in one compiled call (`DecoderLayerSteps`)
        states = layer_states(layers, *args)
        counting.calls["DecoderLayerSteps"] += states is not None
        return states

    monkeypatch.setattr(inference_copies.CompiledDecoderLayers, "states", counted_states)
    select_key_rows = decoding._SelfAttentionCache.select_key_rows

    def counted_select(cache, index):  # a beam reorder or rows leaving: `key_rows` changed instead of rows moved
        selected = select_key_rows(cache, index)
        counting.calls["key_rows selects"] += selected
        return selected

    monkeypatch.setattr(decoding._SelfAttentionCache, "select_key_rows", counted_select)
    for settings in ({"num_beams": 1}, {"num_beams": 3}):
        expected = reference(model, source, max_new_tokens=8, **settings)
        counting.calls.clear()
        assert torch.equal(fast_generate(model, **source, max_new_tokens=8, fallback=False, **settings), expected)
        # the decoder's sub-layers at decoding steps: the compiled steps (their kernels called from C++), one call per
        # sub-layer or, for stacks without a connection between their layers, one per step for all layers (the first
        # included where the attention's first step is the backbone's); the first step of the others and the output
        # projection: from Python
        steps = sum(counting.calls[name] for name in ("self_attention_step", "cross_attention_step", "feed_forward_step",
                                                      "DecoderLayerSteps"))
        assert steps >= 8 and counting.calls["Float32Linear"] >= 8, counting.calls
        compiled = one_call_applies(engine)
        if compiled:  # every step, or every step after the first (layer-wise coordination's source prefix)
            first_step_in_call = model_type != "layerwise_coordination"
            assert counting.calls["DecoderLayerSteps"] >= 7 + first_step_in_call, counting.calls
        assert counting.calls["decode_attention"] >= 1, counting.calls
        assert counting.calls["add_layer_norm"] >= 8, counting.calls
        if model.config.num_decoder_groups > 1 and mixes_through_the_declared_hook(model):  # GTrans' Eq. 5
            assert counting.calls["mixture_log_probs"] >= 8, counting.calls
        if settings["num_beams"] == 1:  # greedy search's choice and the rest of its step
            assert counting.calls["greedy_choice"] >= 8, counting.calls
        else:  # beam search's candidates and cache reorders: through `key_rows` where every step is compiled
            assert counting.calls["beam_top_k_continuations"] >= 8, counting.calls
            if compiled:
                assert counting.calls["key_rows selects"] >= 1 and counting.calls["move_rows"] == 0, counting.calls
            else:
                assert counting.calls["move_rows"] >= 1 and counting.calls["key_rows selects"] == 0, counting.calls


@needs_float32_kernel
def test_the_float32_copy_is_made_once_where_it_applies_and_falls_back_to_the_model_itself(source, monkeypatch):
    model = tiny_model("gtrans", d_model=32)
    engine = prepare_for_inference(model)
    assert prepare_for_inference(model) is engine and prepare_for_inference(engine) is engine
    int8 = prepare_for_inference(model, "int8")
    assert prepare_for_inference(int8) is int8 and int8.prepared_for_inference == "int8"
    with pytest.raises(ValueError, match="already the float32 inference copy of a model; prepare the original"):
        prepare_for_inference(engine, "int8")
    model.generation_config.num_beams = 2  # a later change to the model's generation config reaches the copy
    assert engine.generation_config.num_beams == 2
    with torch.no_grad():
        model.model.shared.weight.mul_(1.0)  # an in-place change: the copy is rebuilt
    rebuilt = prepare_for_inference(model)
    assert rebuilt is not engine and prepare_for_inference(model) is rebuilt
    # a weight replaced by another tensor, deep in a submodule (the fingerprint reads every module's own tables)
    fc1 = model.model.decoder.layers[-1].ffn.fc1
    fc1.weight = torch.nn.Parameter(fc1.weight.detach().clone())
    assert prepare_for_inference(model) is not rebuilt
    # the model itself where the copy does not apply: training mode, not float32, no kernel
    assert prepare_for_inference(model.train()) is model
    assert prepare_for_inference(model.eval().double()) is model
    model.float()
    monkeypatch.setattr(inference_copies, "float32_kernel_available", lambda: False)
    assert prepare_for_inference(model) is model
    assert torch.equal(fast_generate(model, **source, max_new_tokens=6), reference(model, source, max_new_tokens=6))


@needs_float32_kernel
def test_a_generation_config_assigned_after_the_copy_was_made_is_the_one_the_copy_decodes_with(source):
    """`model.generation_config = GenerationConfig(...)` replaces the object the copies share: the kept float32 and
    int8 copies decode with the new one (before, they kept the old object, and the fast loop gave other tokens than
    generate() without a word)."""
    model = tiny_model("plain_transformer", d_model=32, seed=3)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(3)  # sharper distributions: repeated tokens, which the new setting forbids
    settings = dict(max_new_tokens=8)
    fast_generate(model, **source, **settings)
    fast_generate(model, **source, **settings, quantization="int8")
    replaced = GenerationConfig(**{**model.generation_config.to_dict(), "no_repeat_ngram_size": 1})
    model.generation_config = replaced
    expected = reference(model, source, **settings)
    assert not torch.equal(expected, reference(model, source, **settings, no_repeat_ngram_size=0))  # it matters
    assert torch.equal(fast_generate(model, **source, **settings), expected)
    assert prepare_for_inference(model).generation_config is replaced
    fast_generate(model, **source, **settings, quantization="int8")
    assert prepare_for_inference(model, "int8").generation_config is replaced


@needs_float32_kernel
def test_a_fallback_of_the_float32_copy_is_generate_of_the_model_itself(source):
    """What the fast loop does not cover runs the model's own generate(), not the copy's: eager attention weights
    are returned (the copy's attention, like SDPA, returns none)."""
    model = tiny_model("plain_transformer", d_model=32)
    model.set_attn_implementation("eager")
    settings = dict(max_new_tokens=4, output_attentions=True, return_dict_in_generate=True)
    output = fast_generate(model, **source, **settings)
    expected = reference(model, source, **settings)
    assert torch.equal(output.sequences, expected.sequences)
    assert output.cross_attentions is not None and output.cross_attentions[0][0] is not None
    torch.testing.assert_close(output.cross_attentions[0][0], expected.cross_attentions[0][0], rtol=0, atol=0)


def test_int8_copy_shares_weights_translates_close_to_float_and_follows_weight_changes(source):
    model = tiny_model("gtrans")
    before = reference(model, source, num_beams=3, max_new_tokens=8)
    engine = prepare_for_inference(model, "int8")
    assert prepare_for_inference(model, "int8") is engine
    ffn = engine.model.decoder.layers[0].ffn
    assert isinstance(ffn.fc1, Int8Linear) and isinstance(ffn.fc2, Int8Linear)
    assert ffn.fc1.relu and isinstance(ffn.activation_fn, torch.nn.Identity)  # the ReLU folded into fc1's kernel
    assert isinstance(model.model.decoder.layers[0].ffn.activation_fn, torch.nn.ReLU)
    assert engine.model.shared.weight is model.model.shared.weight  # shared, not copied
    assert type(model.model.decoder.layers[0].ffn.fc1) is torch.nn.Linear  # the float model is untouched
    with torch.no_grad():
        float_logits = model(**source, decoder_input_ids=before).logits
        int8_logits = engine(**source, decoder_input_ids=before).logits
    assert ((int8_logits - float_logits).norm() / float_logits.norm()) < 0.1
    fast_generate(model, **source, num_beams=3, max_new_tokens=8, quantization="int8", fallback=False)
    assert torch.equal(reference(model, source, num_beams=3, max_new_tokens=8), before)
    with torch.no_grad():
        model.model.shared.weight.mul_(1.0)  # an in-place change: the copy is rebuilt
    assert prepare_for_inference(model, "int8") is not engine
    with pytest.raises(ValueError, match="Unknown quantization"):
        prepare_for_inference(model, "int4")


WEIGHT_SCALE = 1.5  # what each update below multiplies the weights by (the optimizer step: its own change)


def update_through_data(model) -> None:
    for parameter in model.parameters():
        parameter.data.mul_(WEIGHT_SCALE)  # what EMA and weight-averaging code does: no version counter sees it


def update_in_place_without_gradients(model) -> None:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(WEIGHT_SCALE)


def update_by_new_data(model) -> None:
    for parameter in model.parameters():
        parameter.data = parameter.data * WEIGHT_SCALE


def update_by_copy(model) -> None:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter * WEIGHT_SCALE)


def update_by_state_dict(model) -> None:
    model.load_state_dict({name: value * WEIGHT_SCALE for name, value in model.state_dict().items()})


def update_by_vector(model) -> None:
    vector = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    torch.nn.utils.vector_to_parameters(vector * WEIGHT_SCALE, model.parameters())


def update_by_optimizer_step(model) -> None:
    """One SGD step on a loss of the model's own greedy output (training mode, then eval again)."""
    source = tiny_sources()
    labels = reference(model, source, max_new_tokens=4)[:, 1:]
    model.train()
    model(**source, labels=labels).loss.backward()
    torch.optim.SGD(model.parameters(), lr=20.0).step()
    model.eval()


WEIGHT_UPDATES = {
    "p.data.mul_": update_through_data,
    "p.mul_ under no_grad": update_in_place_without_gradients,
    "p.data = new tensor": update_by_new_data,
    "p.copy_": update_by_copy,
    "load_state_dict": update_by_state_dict,
    "vector_to_parameters": update_by_vector,
    "optimizer step": update_by_optimizer_step,
}


@needs_float32_kernel
@pytest.mark.parametrize("update", sorted(WEIGHT_UPDATES))
def test_every_kind_of_weight_update_reaches_the_fast_path(update, source, tokenizer):
    """Issue 73: the inference copies kept translating with the old weights after `p.data.mul_()` (a write no version
    counter sees). After every kind of update, `fast_generate` (float32: `generate()` of the updated model; int8: a
    freshly made int8 copy), `translate()` and the pipeline translate with the new weights."""
    from transformers import pipeline

    model = tiny_model("gtrans", d_model=32)
    translator = pipeline(hf_layerfusion.PIPELINE_TASK, model=model, tokenizer=tokenizer)
    search = SEARCHES["beam"]

    def outputs() -> dict:
        return {
            "float32": fast_generate(model, **source, **search, fallback=False).tolist(),
            "int8": fast_generate(model, **source, **search, quantization="int8", fallback=False).tolist(),
            "translate": hf_layerfusion.translate(model, tokenizer, SOURCES, **search),
            "pipeline": [r["translation_text"] for r in translator(SOURCES, **search)],
        }

    before = outputs()  # the copies are made and kept
    WEIGHT_UPDATES[update](model)
    expected = {
        "float32": reference(model, source, **search).tolist(),
        "int8": fast_generate(inference_copies.int8_copy(model), **source, **search, quantization="int8").tolist(),
        "translate": hf_layerfusion.translate(model, tokenizer, SOURCES, fast=False, **search),
        "pipeline": [r["translation_text"] for r in translator(SOURCES, fast=False, **search)],
    }
    for name, output in outputs().items():
        assert before[name] != expected[name], f"{update} leaves the {name} output as it was: it tests nothing"
        assert output == expected[name], (update, name)


@pytest.mark.parametrize("shape", [(16, 32), (512, 3)], ids=["64-bit words", "elements one by one"])
def test_the_content_checksum_sees_weights_scaled_by_a_power_of_two(shape):
    """Doubling a float32 weight adds 2^23 to each element's bit pattern: 512 elements add up to 2^32, which a 32-bit
    sum would not see. Both of `content_checksum`'s ways (64-bit words; an odd last dimension's elements) do: a multiple
    of 512 elements each."""
    weight = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    before = inference_copies.content_checksum(weight)
    weight.data.mul_(2.0)
    assert inference_copies.content_checksum(weight) != before
    weight.data.mul_(0.5)
    assert inference_copies.content_checksum(weight) == before


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_attention_over_keys_shared_by_groups_of_query_rows(attention):
    """`MultiHeadAttention.attend_to` with one key row per group of 3 query rows (the beams of a sentence) equals
    attention over the keys repeated for every query row, masks and weights included."""
    model = tiny_model("plain_transformer")
    model.set_attn_implementation(attention)
    module = model.model.decoder.layers[0].encoder_attn
    generator = torch.Generator().manual_seed(2)
    queries = torch.randn(6, 1, TINY_BACKBONE["d_model"], generator=generator)
    keys, values = (torch.randn(2, 2, 5, 8, generator=generator) for _ in range(2))
    padding = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], dtype=torch.bool)
    if attention == "eager":
        mask = torch.zeros(2, 1, 1, 5).masked_fill(~padding[:, None, None, :], torch.finfo(torch.float32).min)
    else:
        mask = padding[:, None, None, :]
    with torch.no_grad():
        grouped, grouped_weights = module.attend_to(queries, keys, values, mask)
        expected, expected_weights = module.attend_to(
            queries, keys.repeat_interleave(3, 0), values.repeat_interleave(3, 0), mask.repeat_interleave(3, 0)
        )
    torch.testing.assert_close(grouped, expected, rtol=0, atol=1e-6)
    if attention == "eager":
        torch.testing.assert_close(grouped_weights, expected_weights, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------------ users
@pytest.fixture(scope="module")
def tokenizer():
    from test_hub import tiny_tokenizer

    return tiny_tokenizer()


def test_translate_and_the_pipeline_decode_fast_by_default_and_can_fall_back(tokenizer):
    from test_hub import SOURCES
    from transformers import pipeline

    model = tiny_model("gtrans")
    settings = dict(num_beams=3, max_new_tokens=8)
    reference = hf_layerfusion.translate(model, tokenizer, SOURCES, fast=False, **settings)
    assert hf_layerfusion.translate(model, tokenizer, SOURCES, **settings) == reference
    assert len(hf_layerfusion.translate(model, tokenizer, SOURCES, quantization="int8", **settings)) == len(SOURCES)
    for bad in ("fp8", "", False):  # a falsy value is not None: named, not taken for float32
        with pytest.raises(ValueError, match="Unknown quantization"):
            hf_layerfusion.translate(model, tokenizer, SOURCES, quantization=bad)
    translator = pipeline(hf_layerfusion.PIPELINE_TASK, model=model, tokenizer=tokenizer)
    texts = [r["translation_text"] for r in translator(SOURCES, batch_size=len(SOURCES), fast=False, **settings)]
    assert [r["translation_text"] for r in translator(SOURCES, batch_size=len(SOURCES), **settings)] == texts
    assert len(translator(SOURCES, quantization="int8", **settings)) == len(SOURCES)
    for bad in ("fp8", ""):
        with pytest.raises(ValueError, match="Unknown quantization"):
            translator(SOURCES, quantization=bad)


def test_translate_script_fast_generate_and_int8(tokenizer, tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import translate as translate_script

    model_dir, source = tmp_path / "model", tmp_path / "input.en"
    tiny_model("gtrans").save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    source.write_text("ab ba\nabba baab ab\nb\n", encoding="utf-8")
    outputs = {}
    for name, flags in {"fast": [], "generate": ["--generate"], "int8": ["--quantization", "int8"]}.items():
        outputs[name] = tmp_path / f"{name}.de"
        translate_script.main([str(model_dir), f"--input={source}", f"--output={outputs[name]}", "--num_beams=2",
                               "--max_new_tokens=6", "--device=cpu", *flags])
    assert outputs["fast"].read_text() == outputs["generate"].read_text()
    assert len(outputs["int8"].read_text().splitlines()) == 3
    # an existing --output is replaced only when asked
    translate_script.main([str(model_dir), f"--input={source}", f"--output={outputs['int8']}", "--overwrite",
                           "--num_beams=2", "--max_new_tokens=6", "--device=cpu"])
    assert outputs["int8"].read_text() == outputs["fast"].read_text()


@pytest.mark.parametrize("model_type, settings", [
    ("plain_transformer", dict(num_beams=1, max_new_tokens=8)),
    ("gtrans", dict(num_beams=3, max_new_tokens=8)),
    ("gtrans", dict(num_beams=2, max_new_tokens=8, decoder_groups=[2])),
])
def test_trainer_predicts_with_the_fast_loop_the_tokens_of_generate(model_type, settings, source, tmp_path, monkeypatch):
    import datasets
    from transformers import Seq2SeqTrainingArguments

    searches = []
    for name in ("greedy_search", "beam_search"):
        search = getattr(fast_generation, name)
        monkeypatch.setattr(fast_generation, name, lambda *a, _search=search, _name=name, **k: (
            searches.append(_name), _search(*a, **k))[1])
    labels = torch.randint(FIRST_TOKEN_ID, TINY_BACKBONE["vocab_size"], (5, 4), generator=torch.Generator().manual_seed(1))
    dataset = datasets.Dataset.from_dict({**{k: v.tolist() for k, v in source.items()}, "labels": labels.tolist()})
    args = Seq2SeqTrainingArguments(output_dir=str(tmp_path), predict_with_generate=True, per_device_eval_batch_size=2,
                                    report_to=[], use_cpu=True)
    model, predictions = tiny_model(model_type), {}
    for fast in (True, False):
        searches.clear()
        trainer = hf_layerfusion.LayerFusionSeq2SeqTrainer(model=model, args=args, fast_generation=fast)
        predictions[fast] = trainer.predict(dataset, **settings).predictions
        assert len(searches) == (3 if fast else 0), searches  # 3 batches of at most 2 sentences
    assert predictions[True].shape == predictions[False].shape
    assert (predictions[True] == predictions[False]).all(), (predictions[True], predictions[False])
    assert (predictions[True][:, 1] != PAD).all()  # translations, not padding, were compared
    with pytest.raises(TypeError, match="`fast_generation` must be True or False, got 'yes'"):
        hf_layerfusion.LayerFusionSeq2SeqTrainer(model=model, args=args, fast_generation="yes")


def test_slot_memory_serves_the_next_generation_and_each_thread_its_own(source):
    """The self-attention buffers of one generation serve the thread's next (`decoding.SlotMemory`: no fresh pages to
    fault in), whatever they hold: generations in a row, under `torch.inference_mode()` and outside it, each give
    `generate()`'s tokens with the same buffers; another thread takes its own; `release_decoding_buffers` frees them."""
    import threading

    model = tiny_model("gtrans")
    decoding.release_decoding_buffers()
    loop = fast_decoding_loop(fallback=False)
    memory = decoding.thread_slot_memory()
    buffers = None
    for turn, (settings, inference_mode) in enumerate([
        (dict(num_beams=3, max_new_tokens=8), True), (dict(num_beams=3, max_new_tokens=8), False),
        (dict(num_beams=2, max_new_tokens=8), False), (dict(num_beams=3, max_new_tokens=4), True),
    ]):
        sources = {name: tensor.flip(0) if turn % 2 else tensor for name, tensor in source.items()}
        with torch.no_grad():
            expected = model.generate(**sources, **settings)
        with torch.inference_mode(inference_mode), torch.no_grad():
            actual = model.generate(**sources, custom_generate=loop, **settings)
        assert torch.equal(actual, expected), settings
        pointers = sorted(buffer.data_ptr() for buffer in memory.free)
        if buffers is None:
            assert pointers, "the generation gave its buffers back"
            buffers = pointers
        assert pointers == buffers, settings  # reused, none made; fewer beams take the same (larger) buffers
        assert not any(buffer.is_inference() for buffer in memory.free)
    other = []
    thread = threading.Thread(target=lambda: other.append(decoding.thread_slot_memory()))
    thread.start()
    thread.join()
    assert other[0] is not memory and not other[0].free
    decoding.release_decoding_buffers()
    assert decoding.thread_slot_memory() is not memory


def test_slot_memory_takes_the_smallest_free_buffer_of_the_dtype():
    memory, taken = decoding.SlotMemory(), []
    like = torch.empty(0)
    large, small = memory.empty((4, 10), like, taken), memory.empty((2, 5), like, taken)
    whole = memory.empty((3,), like.double(), taken)
    assert whole.dtype == torch.float64 and len(taken) == 3
    memory.give_back(taken)
    assert not taken and len(memory.free) == 3
    again = memory.empty((3, 3), like, taken)  # 9 floats: the 10-float buffer, not the 40-float one
    assert again.data_ptr() == small.data_ptr() and again.shape == (3, 3)
    assert memory.empty((20,), like, taken).data_ptr() == large.data_ptr()
    assert memory.empty((2,), like.double(), taken).data_ptr() == whole.data_ptr()
    assert memory.empty((1,), like, taken).data_ptr() not in (small.data_ptr(), large.data_ptr())  # none free: new
    assert memory.free == [] and len(taken) == 4
