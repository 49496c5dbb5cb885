"""The compiled decoding steps of the float32 copy's sub-layers (`KernelResidualSublayer.run`,
kernels/decoding_step.cpp) against the copy's own Python path: the same logits bit for bit at every step, for every
family and the variants whose sub-layers they cover (pre-norm, mixed attention with its source prefix, beams sharing a
sentence's cross-attention keys), and which sub-layers get a compiled step."""

import pytest
import torch
from helpers import CountingKernels, tiny_model, tiny_sources

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


def decoder_logits(engine, group: int, tokens: torch.Tensor) -> list[torch.Tensor]:
    """The logits of `DecoderSteps` at each step of `tokens` `(steps, rows)`, rows = sources x `group` (beams)."""
    source = tiny_sources()
    with torch.inference_mode():
        encoder_outputs = engine.get_encoder()(**source)
        for name in ("last_hidden_state", "layer_memories"):
            value = getattr(encoder_outputs, name, None)
            if value is not None:
                setattr(encoder_outputs, name, value.repeat_interleave(group, dim=0))
        mask = source["attention_mask"].repeat_interleave(group, dim=0)
        steps = DecoderSteps(engine, encoder_outputs, mask, capacity=tokens.shape[0], decoder_groups=None, group=group)
        return [steps.logits(step_tokens) for step_tokens in tokens]


@pytest.mark.parametrize("case", sorted(CASES))
def test_compiled_steps_give_the_python_paths_logits_bit_for_bit(case, kernels, monkeypatch):
    model_type, overrides = CASES[case]
    model = tiny_model(model_type, d_model=32, **overrides)
    engine = prepare_for_inference(model)
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
            assert torch.equal(actual, expected), (case, group, step, (actual - expected).abs().max())


def test_only_sub_layers_that_declare_their_step_get_one(kernels):
    """A family's subclass that does not declare `decoding_step_form` itself (deep representations' multi-layer
    attention) runs its Python path; so do every sub-layer of the int8 copy, attention of head_dim 8, and a GELU
    feed-forward."""
    model = tiny_model("deep_representations", d_model=32, decoder_aggregation="multi_layer_attention",
                       encoder_aggregation="multi_layer_attention", encoder_layers=4, decoder_layers=4)
    bound = {(name, block.decoding_step is not None) for name, block in step_blocks(prepare_for_inference(model))}
    assert bound == {("MultiHeadAttention", True), ("MultiLayerSelfAttention", False), ("CrossAttention", True),
                     ("FeedForward", True)}
    assert not [block for _, block in step_blocks(prepare_for_inference(tiny_model("gtrans", d_model=32), "int8"))
                if block.decoding_step is not None]
    for overrides, expected in (
        (dict(d_model=16), ["FeedForward"]),
        (dict(d_model=32, activation_function="gelu"), ["MultiHeadAttention", "CrossAttention"]),
    ):
        blocks = step_blocks(prepare_for_inference(tiny_model("plain_transformer", **overrides)))
        assert [name for name, block in blocks if block.decoding_step is not None] == expected * 2  # 2 layers


def test_step_kernels_name_bad_inputs(kernels):
    engine = prepare_for_inference(tiny_model("plain_transformer", d_model=32))
    attention = engine.model.decoder.layers[0].self_attn
    norm = engine.model.decoder.layers[0].self_attn_block.kernel_arguments
    projections = [tensor for name in ("q_proj", "k_proj", "v_proj", "out_proj")
                   for tensor in (getattr(attention, name).panels, getattr(attention, name).bias)]
    hidden, buffer = torch.randn(3, 1, 32), torch.zeros(3, 4, 2, 16)

    def self_step(hidden=hidden, keys=buffer, position=0, prefix=0, prefix_mask=None):
        return kernels.self_attention_step(hidden, *norm, False, *projections, keys, keys.clone(), position, prefix,
                                           prefix_mask, attention.scaling)

    assert self_step().shape == (3, 1, 32)
    with pytest.raises(RuntimeError, match=r"input must be a float32 CPU tensor \(rows, 1, d_model\)"):
        self_step(hidden=torch.randn(3, 2, 32))
    with pytest.raises(RuntimeError, match="position 4 is outside the cache's 4 positions after a prefix of 0"):
        self_step(position=4)
    with pytest.raises(RuntimeError, match=r"cache buffers must be \(3, capacity, heads, head_dim\)"):
        self_step(keys=torch.zeros(2, 4, 2, 16))
    with pytest.raises(RuntimeError, match=r"prefix mask must be bool \(rows or 1, 1, 1, 2\)"):
        self_step(position=2, prefix=2, prefix_mask=torch.ones(3, 1, 1, 3, dtype=torch.bool))
    cross = engine.model.decoder.layers[0].encoder_attn
    with pytest.raises(RuntimeError, match="key rows dividing 3"):
        kernels.cross_attention_step(hidden, *norm, False, cross.q_proj.panels, cross.q_proj.bias, cross.out_proj.panels,
                                     cross.out_proj.bias, torch.zeros(2, 2, 5, 16), torch.zeros(2, 2, 5, 16), None,
                                     cross.scaling)
