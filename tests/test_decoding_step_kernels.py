"""The compiled decoding steps of the inference copies' sub-layers (`KernelResidualSublayer.run`,
kernels/decoding_step.cpp), float32 and int8, against the copy's own Python path: the same logits bit for bit at every
step, for every family and the variants whose sub-layers they cover (pre-norm, mixed attention with its source prefix,
beams sharing a sentence's cross-attention keys), which sub-layers get a compiled step, and `KernelLinear`, the
layers' weights as the steps take them."""

import copy


import pytest
import torch
from helpers import CountingKernels, decoder_logits, encoded_sources, one_call_applies, tiny_model, tiny_sources

import hf_layerfusion
from hf_layerfusion.inference import inference_copies, prepare_for_inference
from hf_layerfusion.inference.decoding import DecoderSteps
from hf_layerfusion.inference.inference_copies import KernelResidualSublayer, float32_kernel_available
from hf_layerfusion.modeling.layers import TransformerLayer

pytestmark = pytest.mark.skipif(
    not float32_kernel_available(), reason="the float32 copy needs the compiled kernels and AVX-512 or AVX2 with FMA"
)

# head_dim 16 (the attention kernel's smallest), sources with padding
CASES = {
    **{family: (family, {}) for family in sorted(hf_layerfusion.FAMILIES)},
    "plain_transformer pre-norm": ("plain_transformer", dict(normalize_before=True)),
    "layerwise_coordination pre-norm": ("layerwise_coordination", dict(normalize_before=True)),
    "layerwise_coordination without mixed attention": ("layerwise_coordination", dict(mixed_attention=False)),
    "re_transformer sff encoder, scf-sfc decoder": (
        "re_transformer", dict(encoder_layout="s-sff", decoder_layout="scf-sfc")
    ),
}


def step_blocks(engine) -> list[tuple[str, KernelResidualSublayer]]:
    """(sub-layer class name, block) of every decoder sub-layer of the copy."""
    return [
        (type(layer.get_submodule(name)).__name__, layer.get_submodule(f"{name}_block"))
        for layer in engine.model.decoder.modules() if isinstance(layer, TransformerLayer)
        for _, name in layer.sublayers
    ]


@pytest.mark.parametrize("quantization", [None, "int8"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_steps_give_the_python_paths_logits_bit_for_bit(case, quantization, kernels, monkeypatch):
    model_type, overrides = CASES[case]
    model = tiny_model(model_type, d_model=32, **overrides)
    engine = prepare_for_inference(model, quantization)
    blocks = step_blocks(engine)
    compiled = {block: block.decoding_step for _, block in blocks}
    assert all(block.decoding_step is not None for name, block in blocks if name != "MultiLayerSelfAttention"), blocks
    counting = CountingKernels(kernels)
    monkeypatch.setattr(inference_copies, "compiled_kernels", lambda: counting)
    for group in (1, 3):
        tokens = torch.randint(4, model.config.vocab_size, (6, 5 * group), generator=torch.Generator().manual_seed(group))
        tokens[0] = model.config.decoder_start_token_id
        counting.calls.clear()
        with_kernels = decoder_logits(engine, group, tokens)
        steps_run = sum(counting.calls[name] for name in ("self_attention_step", "cross_attention_step",
                                                          "feed_forward_step"))
        # each bound block's kernel runs once per step: the feed-forward's from the first step on, the attention's
        # from the second (the first fills their cache slots in the Python path)
        expected = sum(tokens.shape[0] - (name != "FeedForward") for name, block in blocks if compiled[block] is not None)
        assert steps_run == expected, counting.calls
        for block in compiled:
            block.decoding_step = None
        python_path = decoder_logits(engine, group, tokens)
        for block, step in compiled.items():
            block.decoding_step = step
        for step, (actual, expected) in enumerate(zip(with_kernels, python_path)):
            assert torch.equal(actual, expected), (case, quantization, group, step, (actual - expected).abs().max())


# groups (sentences) kept at a step: rows leave the batch (the fast loop's compaction), in a new order, twice
GROUPS_KEPT = {2: [4, 0, 2, 3], 4: [3, 0]}


@pytest.mark.parametrize("quantization", [None, "int8"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_rows_leaving_the_batch_read_the_memory_through_memory_rows(case, quantization, kernels, monkeypatch):
    """Rows leaving the batch where the layers run in one call change `DecoderSteps.memory_rows` (which row of the
    memory, its mask and the cross-attention keys/values each sentence reads) instead of copying them: the logits
    are those of the blocks' steps, whose memory is copied into the rows kept, bit for bit, at every step after two
    compactions (sentences of different padding, reordered; beams of one sentence); a step that leaves the one call
    (here, made to) first gives each sentence its own rows again (`gather_memory_rows`). Layer-wise coordination's
    source prefix reads its mask (the memory mask, row by row) through `memory_rows` too."""
    model_type, overrides = CASES[case]
    engine = prepare_for_inference(tiny_model(model_type, d_model=32, **overrides), quantization)
    states = inference_copies.CompiledDecoderLayers.states
    leave_the_call_at = {5}

    def states_except_at_one_step(self, embeddings, cache, *args):
        return None if cache.get_seq_length() in leave_the_call_at else states(self, embeddings, cache, *args)

    monkeypatch.setattr(inference_copies.CompiledDecoderLayers, "states", states_except_at_one_step)
    for group in (1, 3):
        generator = torch.Generator().manual_seed(group)
        tokens = torch.randint(4, engine.config.vocab_size, (7, 5 * group), generator=generator)
        tokens[0] = engine.config.decoder_start_token_id
        results = {}
        for compile_layers in (inference_copies.compiled_decoder_layers, None):
            encoder_outputs, mask = encoded_sources(engine, group)
            logits, memory_rows = [], []
            with torch.inference_mode():
                steps = DecoderSteps(engine, encoder_outputs, mask, capacity=tokens.shape[0], decoder_groups=None,
                                     group=group, compile_layers=compile_layers)
                rows = torch.arange(tokens.shape[1])
                for step, step_tokens in enumerate(tokens):
                    if step in GROUPS_KEPT:
                        # the kept groups' rows, indexed among the rows still computed
                        kept = torch.tensor(GROUPS_KEPT[step])
                        wanted = (kept[:, None] * group + torch.arange(group)).reshape(-1)
                        index = torch.cat([(rows == row).nonzero()[0] for row in wanted])
                        steps.select(index, rows_dropped=True)
                        rows = wanted
                    logits.append(steps.logits(step_tokens[rows]))
                    memory_rows.append(None if steps.memory_rows is None else steps.memory_rows.tolist())
            results[compile_layers is not None] = logits, memory_rows
        (in_one_call, memory_rows), (through_blocks, copied) = results[True], results[False]
        for step, (actual, expected) in enumerate(zip(in_one_call, through_blocks)):
            assert torch.equal(actual, expected), (case, quantization, group, step, (actual - expected).abs().max())
        assert copied == [None] * tokens.shape[0]
        if one_call_applies(engine):
            # sentences 4, 0, 2, 3 of the five, then 3 and 0; the step outside the call gathered them. Attention that
            # cannot share a sentence's memory among its beams (mixed attention) keeps one memory row per beam.
            def memory_row(groups):
                return groups if steps.group == group else [g * group + beam for g in groups for beam in range(group)]

            expected = [None, None, *[memory_row(GROUPS_KEPT[2])] * 2, memory_row([3, 0]), None, None]
            assert memory_rows == expected, (case, memory_rows)
        else:
            assert memory_rows == [None] * tokens.shape[0], (case, memory_rows)


def test_the_layers_in_one_call_are_made_once_per_copy_and_layers(kernels, monkeypatch):
    """`compiled_decoder_layers` is made at a copy's first fast call and reused by the next calls with the same
    layers; fewer layers (GTrans' first decoder group), a layer replaced, or a new copy (the model's weights changed)
    make their own. The tokens stay `generate()`'s throughout."""
    from hf_layerfusion.inference import fast_generate

    built = []
    compile_decoder_layers = inference_copies.compile_decoder_layers

    def counted(kernels, decoder, layers):
        built.append(len(layers))
        return compile_decoder_layers(kernels, decoder, layers)

    monkeypatch.setattr(inference_copies, "compile_decoder_layers", counted)
    model = tiny_model("gtrans", d_model=32)
    source = tiny_sources()
    settings = dict(num_beams=2, max_new_tokens=6)
    with torch.no_grad():
        expected = model.generate(**source, **settings)
        expected_first_group = model.generate(**source, decoder_groups=[1], **settings)
    for _ in range(2):
        assert torch.equal(fast_generate(model, **source, fallback=False, **settings), expected)
    layers = model.config.decoder_layers
    assert built == [layers], built
    assert torch.equal(fast_generate(model, **source, decoder_groups=[1], fallback=False, **settings),
                       expected_first_group)
    assert len(built) == 2 and built[1] < layers, built  # the first group needs fewer layers
    decoder = prepare_for_inference(model).get_decoder()
    first = inference_copies.compiled_decoder_layers(decoder, decoder.layers)
    assert inference_copies.compiled_decoder_layers(decoder, decoder.layers) is first and len(built) == 2
    replaced = torch.nn.ModuleList([*decoder.layers[:-1], copy.deepcopy(decoder.layers[-1])])
    assert inference_copies.compiled_decoder_layers(decoder, replaced) is not first and len(built) == 3
    with torch.no_grad():
        model.model.decoder.layers[0].ffn.fc1.weight.mul_(1.5)  # a new copy at the next call
        expected = model.generate(**source, **settings)
    assert torch.equal(fast_generate(model, **source, fallback=False, **settings), expected)
    assert built[3:] == [layers], built


@pytest.mark.parametrize("quantization", [None, "int8"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_layers_in_one_call_give_the_blocks_logits_bit_for_bit(case, quantization, kernels, monkeypatch):
    """Every layer of a step in one compiled call (`CompiledDecoderLayers`, as the fast loop runs it) against the same
    steps through `run_layers` and the blocks' own compiled steps: the same logits bit for bit at every step (beams
    sharing a sentence's cross-attention keys, a source prefix). It applies to stacks without a connection whose
    every decoder sub-layer has a bound step, at every step (the first one making the cross-attention keys and the
    self-attention slots before its kernels), and there it replaces the blocks' calls and the Python path's. A
    connection that changes the embeddings alone (layer-wise coordination's language embedding) runs before the
    call; a family whose attention makes its first step otherwise (layer-wise coordination's source prefix, its
    normalised layer-wise memory) runs that step through `run_layers`, and the next ones in the call."""
    model_type, overrides = CASES[case]
    engine = prepare_for_inference(tiny_model(model_type, d_model=32, **overrides), quantization)
    applies = one_call_applies(engine)
    first_step_in_call = model_type != "layerwise_coordination"
    runs = []
    states = inference_copies.CompiledDecoderLayers.states

    def counted_states(self, *args):
        computed = states(self, *args)
        runs.append(computed is not None)
        return computed

    monkeypatch.setattr(inference_copies.CompiledDecoderLayers, "states", counted_states)
    counting = CountingKernels(kernels)
    monkeypatch.setattr(inference_copies, "compiled_kernels", lambda: counting)
    for group in (1, 3):
        tokens = torch.randint(4, engine.config.vocab_size, (6, 5 * group), generator=torch.Generator().manual_seed(group))
        tokens[0] = engine.config.decoder_start_token_id
        runs.clear()
        counting.calls.clear()
        in_one_call = decoder_logits(engine, group, tokens, inference_copies.compiled_decoder_layers)
        blocks_calls = sum(counting.calls[name] for name in ("self_attention_step", "cross_attention_step"))
        expected_runs = [first_step_in_call] + [True] * (tokens.shape[0] - 1)
        assert runs == (expected_runs if applies else []), (case, runs)
        # where it applies, every step runs in the one call (the first one included, or made by the Python path,
        # which runs no block's attention kernel), and no block's attention kernel runs
        assert (blocks_calls == 0) == applies, (case, counting.calls)
        through_blocks = decoder_logits(engine, group, tokens)
        for step, (actual, expected) in enumerate(zip(in_one_call, through_blocks)):
            assert torch.equal(actual, expected), (case, quantization, group, step, (actual - expected).abs().max())
    # deep representations' stack has a connection between its layers (the aggregation), which runs in Python
    expected_to_apply = {"gtrans", "plain_transformer", "plain_transformer pre-norm", "re_transformer",
                         "re_transformer sff encoder, scf-sfc decoder", "rtal", "layerwise_coordination",
                         "layerwise_coordination pre-norm", "layerwise_coordination without mixed attention"}
    assert applies == (case in expected_to_apply), (case, applies)


@pytest.mark.parametrize("in_one_call", [True, False])
@pytest.mark.parametrize("engine_kind", ["model itself", "float32", "int8"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_first_step_once_per_group_gives_every_rows_logits_bit_for_bit(case, engine_kind, in_one_call):
    """Beam search's first step computed for one row per sentence and repeated (`logits_of_equal_groups`) against
    every row computed: the same logits bit for bit at that step and at the next ones (the cache holds the copies),
    on both copies, the next steps in one compiled call or through the blocks; nothing computed where the rows of a
    group differ, after the first step, or on the model itself (torch's products choose their kernels by the row
    count: one row differs from three in the last bits). Mixed attention, whose memory is kept per beam, reads the
    sentence's row through `memory_rows` in one call and copies of it through the blocks."""
    model_type, overrides = CASES[case]
    model = tiny_model(model_type, d_model=32, **overrides)
    engine = model if engine_kind == "model itself" else prepare_for_inference(
        model, None if engine_kind == "float32" else engine_kind
    )
    group, source = 3, tiny_sources()
    tokens = torch.randint(4, model.config.vocab_size, (5, source["input_ids"].shape[0] * group),
                           generator=torch.Generator().manual_seed(0))
    tokens[0] = model.config.decoder_start_token_id
    encoder_outputs, mask = encoded_sources(engine, group)
    with torch.inference_mode():

        def new_steps():
            return DecoderSteps(engine, encoder_outputs, mask, capacity=tokens.shape[0], decoder_groups=None,
                                group=group,
                                compile_layers=inference_copies.compiled_decoder_layers if in_one_call else None,
                                rows_computed_alone=engine is not model)

        assert new_steps().logits_of_equal_groups(tokens[1]) is None  # the beams' tokens differ
        once, every = new_steps(), new_steps()
        first = once.logits_of_equal_groups(tokens[0])
        assert (first is not None) == (engine is not model), case  # rows computed alone
        if first is None:
            return
        assert once.logits_of_equal_groups(tokens[1]) is None  # not the first step any more
        if once.group == 1:  # the memory per beam: each beam reads its sentence's row
            sentences = torch.arange(source["input_ids"].shape[0]).repeat_interleave(group).tolist()
            if in_one_call and one_call_applies(engine):
                assert once.memory_rows.tolist() == sentences and once.memory.shape[0] == len(sentences) // group
            else:
                assert once.memory_rows is None and once.memory.shape[0] == len(sentences), case
        in_groups = [first] + [once.logits(step_tokens) for step_tokens in tokens[1:]]
        every_row = [every.logits(step_tokens) for step_tokens in tokens]
    for step, (actual, expected) in enumerate(zip(in_groups, every_row)):
        assert torch.equal(actual, expected), (case, engine_kind, step, (actual - expected).abs().max())


def test_only_sub_layers_that_declare_their_step_get_one(kernels, monkeypatch):
    """A family's subclass that does not declare its decoding step itself (the class keyword `decoding_step`: deep
    representations' multi-layer attention) runs its Python path; so do attention of head_dim 8 and a GELU
    feed-forward, in both copies, and the int8 copy's layers where the kernels are not compiled (`Int8Linear` then
    runs torch operations)."""
    model = tiny_model("deep_representations", d_model=32, decoder_aggregation="multi_layer_attention",
                       encoder_aggregation="multi_layer_attention", encoder_layers=4, decoder_layers=4)
    for quantization in (None, "int8"):
        engine = prepare_for_inference(model, quantization)
        bound = {(name, block.decoding_step is not None) for name, block in step_blocks(engine)}
        assert bound == {("MultiHeadAttention", True), ("MultiLayerSelfAttention", False), ("CrossAttention", True),
                         ("FeedForward", True)}, quantization
        for overrides, expected in (
            (dict(d_model=16), ["FeedForward"]),
            (dict(d_model=32, activation_function="gelu"), ["MultiHeadAttention", "CrossAttention"]),
        ):
            blocks = step_blocks(prepare_for_inference(tiny_model("plain_transformer", **overrides), quantization))
            assert [name for name, block in blocks if block.decoding_step is not None] == expected * 2  # 2 layers
    monkeypatch.setattr(inference_copies, "compiled_kernels", lambda: None)
    engine = inference_copies.int8_copy(tiny_model("gtrans", d_model=32))
    assert not [block for _, block in step_blocks(engine) if block.decoding_step is not None]


def test_step_kernels_name_bad_inputs(kernels):
    engine = prepare_for_inference(tiny_model("plain_transformer", d_model=32, decoder_ffn_dim=48))
    layer = engine.model.decoder.layers[0]
    attention = layer.self_attn
    norm = layer.self_attn_block.kernel_arguments
    qkv_proj = kernels.KernelLinear.concatenate([getattr(attention, name).kernel_linear
                                                 for name in ("q_proj", "k_proj", "v_proj")])
    projections = [qkv_proj, attention.out_proj.kernel_linear]
    hidden, buffer = torch.randn(3, 1, 32), torch.zeros(3, 4, 2, 16)

    def self_step(hidden=hidden, keys=buffer, position=0, prefix=0, prefix_mask=None, projections=projections,
                  key_rows=None):
        return kernels.self_attention_step(hidden, *norm, False, *projections, keys, keys.clone(), position, prefix,
                                           prefix_mask, attention.scaling, key_rows)

    assert self_step().shape == (3, 1, 32)
    with pytest.raises(RuntimeError, match=r"key_rows\[1, 1\] = 3 is outside the 3 rows of the keys"):
        self_step(position=1, key_rows=torch.tensor([[0, 0, 0, 0], [1, 3, 1, 1], [2, 2, 2, 2]]))
    with pytest.raises(RuntimeError, match=r"key_rows must be int64 \(3, 2\)"):
        self_step(position=1, key_rows=torch.zeros(3, 4, dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"input must be a float32 CPU tensor \(rows, 1, d_model\)"):
        self_step(hidden=torch.randn(3, 2, 32))
    with pytest.raises(RuntimeError, match="position 4 is outside the cache's 4 positions after a prefix of 0"):
        self_step(position=4)
    with pytest.raises(RuntimeError, match=r"cache buffers must be float32 \(3, capacity, heads, head_dim\)"):
        self_step(keys=torch.zeros(2, 4, 2, 16))
    with pytest.raises(RuntimeError, match=r"cache buffers must be float32 .* got Double \[3, 4, 2, 16\]"):
        self_step(keys=torch.zeros(3, 4, 2, 16, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=r"prefix mask must be bool \(rows or 1, 1, 1, 2\)"):
        self_step(position=2, prefix=2, prefix_mask=torch.ones(3, 1, 1, 3, dtype=torch.bool))
    fc1, fc2 = layer.ffn.fc1.kernel_linear, layer.ffn.fc2.kernel_linear
    with pytest.raises(RuntimeError, match="qkv_proj must have 96 output features and no ReLU, got 48 and a ReLU"):
        self_step(projections=[fc1, projections[1]])
    cross = layer.encoder_attn
    q_proj, out_proj = cross.q_proj.kernel_linear, cross.out_proj.kernel_linear
    with pytest.raises(RuntimeError, match=r"3 rows need keys \(key rows dividing them"):
        kernels.cross_attention_step(hidden, *norm, False, q_proj, out_proj, torch.zeros(2, 2, 5, 16),
                                     torch.zeros(2, 2, 5, 16), None, cross.scaling)
    with pytest.raises(RuntimeError, match="got \\[4, 2, 5, 16\\] read through memory_rows of 2 key rows"):
        kernels.cross_attention_step(hidden, *norm, False, q_proj, out_proj, torch.zeros(4, 2, 5, 16),
                                     torch.zeros(4, 2, 5, 16), None, cross.scaling, torch.tensor([3, 0]))
    assert kernels.cross_attention_step(hidden, *norm, False, q_proj, out_proj, torch.zeros(4, 2, 5, 16),
                                        torch.zeros(4, 2, 5, 16), None, cross.scaling,
                                        torch.tensor([3, 0, 1])).shape == (3, 1, 32)
    feed_forward_norm = layer.ffn_block.kernel_arguments
    assert kernels.feed_forward_step(hidden, *feed_forward_norm, False, fc1, fc2).shape == (3, 1, 32)
    with pytest.raises(RuntimeError, match="fc1 must have the ReLU folded in"):
        kernels.feed_forward_step(hidden, *feed_forward_norm, False, q_proj, fc2)
    with pytest.raises(RuntimeError, match="fc2 must have 32 output features and no ReLU, got 48 and a ReLU"):
        kernels.feed_forward_step(hidden, *feed_forward_norm, False, fc1, fc1)


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_kernel_linear_is_its_layers_product_and_survives_deep_copies(quantization, kernels):
    """`KernelLinear` computes the product of the layer it was made for (`float32_linear` / `int8_linear` with the
    layer's tensors) and survives deep copies (of a whole inference copy too): the copy gives the same logits and
    runs its compiled steps on its own tensors."""
    model = tiny_model("plain_transformer", d_model=32)
    engine = prepare_for_inference(model, quantization)
    fc1 = engine.model.decoder.layers[0].ffn.fc1
    inputs = torch.randn(5, 32)
    if quantization is None:
        expected = kernels.float32_linear(inputs, fc1.panels, fc1.out_features, fc1.bias, True)
    else:
        expected = kernels.int8_linear(inputs, fc1.weight_t, fc1.packed_weights, fc1.column_sums, fc1.weight_scale,
                                       fc1.bias, True, fc1.code_bits)
    assert expected.min() == 0 and torch.equal(fc1.kernel_linear(inputs), expected)
    assert (fc1.kernel_linear.out_features, fc1.kernel_linear.relu) == (fc1.out_features, True)
    assert fc1.kernel_linear.code_bits == (0 if quantization is None else fc1.code_bits)
    assert torch.equal(copy.deepcopy(fc1.kernel_linear)(inputs), expected)
    if quantization is not None:  # int8 weights travel unpacked (the packed layout is this CPU's), packed again
        state = fc1.kernel_linear.__getstate__()
        assert len(state) == 7 and torch.equal(state[1], fc1.weight_t)
    tokens = torch.randint(4, model.config.vocab_size, (4, 5), generator=torch.Generator().manual_seed(0))
    tokens[0] = model.config.decoder_start_token_id
    duplicate = copy.deepcopy(engine)
    assert duplicate.model.decoder.layers[0].ffn_block.decoding_step is not None
    for expected, actual in zip(decoder_logits(engine, 1, tokens), decoder_logits(duplicate, 1, tokens)):
        assert torch.equal(actual, expected)
    duplicate.model.decoder.layers[0].ffn.fc2.bias[0] += 1.0  # the duplicate's steps read the duplicate's tensors
    assert not torch.equal(decoder_logits(duplicate, 1, tokens)[1], decoder_logits(engine, 1, tokens)[1])


@pytest.mark.parametrize("quantization", [None, "int8"])
def test_concatenated_kernel_linears_give_each_layers_outputs_bit_for_bit(quantization, kernels):
    """What the self-attention step runs for q, k and v: one layer of the three whose outputs side by side are each
    layer's own, bit for bit (widths that are not a multiple of the float32 panels' 32 columns included)."""
    engine = prepare_for_inference(tiny_model("plain_transformer", d_model=48, decoder_ffn_dim=80), quantization)
    layer = engine.model.decoder.layers[0]
    linears = [layer.self_attn.q_proj, layer.encoder_attn.out_proj, layer.self_attn.v_proj]  # 48 outputs each
    inputs = torch.randn(7, 48)
    joint = kernels.KernelLinear.concatenate([linear.kernel_linear for linear in linears])
    assert joint.out_features == 144
    assert torch.equal(joint(inputs), torch.cat([linear(inputs) for linear in linears], dim=-1))
    with pytest.raises(RuntimeError, match="the layers differ in kind .*, ReLU, bias or input features"):
        kernels.KernelLinear.concatenate([layer.ffn.fc1.kernel_linear, layer.ffn.fc2.kernel_linear])


def test_kernel_linear_names_bad_weights(kernels):
    panels = torch.zeros(2, 32, 16)
    with pytest.raises(RuntimeError, match="out_features 40 does not match panels for 32 features"):
        kernels.KernelLinear.float32(panels, 40, None, False)
    with pytest.raises(RuntimeError, match=r"panels must be \(panels, in_features, 16\), got \[32, 16\]"):
        kernels.KernelLinear.float32(torch.zeros(32, 16), 16, None, False)
    weight_t = torch.zeros(32, 8, dtype=torch.int8)
    with pytest.raises(RuntimeError, match="column_sums must have 8 contiguous int32 entries"):
        kernels.KernelLinear.int8(weight_t, weight_t.new_empty(0), torch.zeros(4, dtype=torch.int32),
                                  torch.ones(8), None, False, 8)
    with pytest.raises(RuntimeError, match="not a KernelLinear's state"):
        kernels.KernelLinear.__new__(kernels.KernelLinear).__setstate__(("int4", weight_t))


def test_compiled_steps_call_a_linear_layer_only_where_its_forward_is_the_kernels(kernels):
    """`compiled_linear`: the compiled decoding steps call `kernel_linear` directly, which is what `Float32Linear` and
    `Int8Linear` (and subclasses that only bind other kernels, as the benchmarks' candidates do) compute in `forward`;
    a subclass with a `forward` of its own runs through it instead."""
    from hf_layerfusion.inference.inference_copies import Float32Linear, Int8Linear, compiled_linear

    class Rebound(Int8Linear):
        pass

    class Scaled(Float32Linear):
        def forward(self, hidden_states):
            return 2 * super().forward(hidden_states)

    weight, bias = torch.randn(16, 32), torch.randn(16)
    assert compiled_linear(Int8Linear(weight, bias)) and compiled_linear(Float32Linear(weight, bias))
    assert compiled_linear(Rebound(weight, bias))
    assert not compiled_linear(Scaled(weight, bias))
    assert not compiled_linear(torch.nn.Linear(32, 16))
