"""A new family's fast path, declared through the extension points only (docs/adding_a_family.md, "The fast path").

The toy family below is registered for these tests only (the `toy_family` fixture registers it with
`register_family` and removes it afterwards: the other tests enumerate `FAMILIES`). Its decoder self-attention is a
sub-layer class of its own that declares its compiled decoding step (`decoding_step="self"`: the same computation as
`MultiHeadAttention`'s, with its own sharper scaling, which the compiled step reads from the module), and its
feed-forward is a gated one that declares none, so that its Python path runs inside the fast loop. The tests that
every registered family runs (tests/test_fast_generation.py) run on it unchanged: `fast_generate` gives generate()'s
tokens, greedy and beam, on the model itself and on its float32 copy, whose compiled steps give the Python path's
logits bit for bit."""

import pytest
import torch
from huggingface_hub.dataclasses import strict
from test_decoding_step_kernels import decoder_logits, step_blocks
import test_fast_generation as every_family  # its tests, called on the toy (imported as a module: not collected twice)
from test_fast_generation import SEARCHES, needs_float32_kernel
from transformers.generation import GenerationMixin

import helpers
from hf_layerfusion.inference import encoding, prepare_for_inference
from hf_layerfusion.modeling.attention import CrossAttention, MultiHeadAttention
from hf_layerfusion.modeling.configuration import LayerFusionConfig
from hf_layerfusion.modeling.extension_points import Connection, FeedForwardSublayer, FusionParameters, Sublayer
from hf_layerfusion.modeling.layers import FeedForward
from hf_layerfusion.modeling.model import LayerFusionForConditionalGeneration, LayerFusionModel
from hf_layerfusion.modeling.registry import FAMILIES, register_family

MODEL_TYPE = "toy_fast_path"


@strict
class ToyFastPathConfig(LayerFusionConfig):
    """The backbone's configuration and `attention_sharpness`: the decoder's self-attention scores are multiplied
    by it (on top of 1 / sqrt(head_dim))."""

    model_type = MODEL_TYPE
    attention_sharpness: float = 2.0


class SharpenedSelfAttention(MultiHeadAttention, decoding_step="self"):
    """Self-attention with scores scaled by `attention_sharpness / sqrt(head_dim)`: `MultiHeadAttention`'s forward,
    another `scaling`, which the `"self"` step reads from the module. A subclass of `MultiHeadAttention` declares
    nothing by inheritance: it says here that its step is the `"self"` form."""

    def __init__(self, config: ToyFastPathConfig, num_heads: int, layer_idx: int):
        super().__init__(config, num_heads, is_causal=True, layer_idx=layer_idx)
        self.scaling = self.scaling * config.attention_sharpness


class GatedFeedForward(FeedForward, FusionParameters):
    """`sigmoid(g) * FeedForward(x)`, with a learned gate g per feature: not the `"feed_forward"` form, so it declares
    no decoding step and the fast loop runs this forward."""

    def __init__(self, config: ToyFastPathConfig, ffn_dim: int):
        super().__init__(config, ffn_dim)
        self.gate = torch.nn.Parameter(torch.zeros(config.d_model))

    def init_fusion_weights(self) -> None:
        torch.nn.init.zeros_(self.gate)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.gate) * super().forward(hidden_states)


class ToyFastPathModel(LayerFusionModel):
    config_class = ToyFastPathConfig

    def build_sublayer(self, config, is_decoder, kind, layer_idx, cache_slots):
        if is_decoder and kind == "s":
            return SharpenedSelfAttention(config, config.decoder_attention_heads, layer_idx=cache_slots.next_self())
        if kind == "f":
            return GatedFeedForward(config, config.decoder_ffn_dim if is_decoder else config.encoder_ffn_dim)
        return super().build_sublayer(config, is_decoder, kind, layer_idx, cache_slots)


class ToyFastPathForConditionalGeneration(LayerFusionForConditionalGeneration, GenerationMixin):  # not registered here
    config_class = ToyFastPathConfig
    model_class = ToyFastPathModel


@pytest.fixture
def toy_family(monkeypatch):
    """The toy family registered as a family module registers itself (`register_family`), with its tiny test config,
    for one test; removed afterwards."""
    assert MODEL_TYPE not in FAMILIES
    register_family(ToyFastPathForConditionalGeneration)
    tiny_config_overrides = helpers.tiny_config_overrides
    monkeypatch.setattr(
        helpers, "tiny_config_overrides",
        lambda model_type: {} if model_type == MODEL_TYPE else tiny_config_overrides(model_type),
    )
    monkeypatch.setattr(encoding, "CALL_COST_POSITIONS", 0)  # as tests/test_fast_generation.py's autouse fixture
    try:
        yield MODEL_TYPE
    finally:
        FAMILIES.pop(MODEL_TYPE, None)


@pytest.mark.parametrize("search", sorted(SEARCHES))
def test_the_toy_family_generates_the_tokens_of_generate(toy_family, search):
    """tests/test_fast_generation.py's check of every registered family, on the toy: the fast loop on the model
    itself and `fast_generate` (its float32 copy where the kernels run) give generate()'s tokens."""
    every_family.test_every_family_generates_the_tokens_of_generate(toy_family, search, helpers.tiny_sources())


@needs_float32_kernel
def test_the_toy_familys_float32_copy_runs_its_declared_steps_and_generates_the_tokens_of_generate(
    toy_family, kernels, monkeypatch
):
    """The same test's check of the float32 copy: every linear layer a kernel, the declared steps compiled."""
    every_family.test_the_float32_copy_runs_the_kernels_at_every_step_and_generates_the_tokens_of_generate(
        toy_family, kernels, monkeypatch
    )


@needs_float32_kernel
@pytest.mark.parametrize("quantization", [None, "int8"])
def test_the_declared_step_is_compiled_the_undeclared_one_is_not_and_the_logits_are_the_python_paths(
    toy_family, quantization, kernels
):
    model = helpers.tiny_model(toy_family, d_model=32)
    engine = prepare_for_inference(model, quantization)
    bound = [(name, block.decoding_step is not None) for name, block in step_blocks(engine)]
    assert bound == [("SharpenedSelfAttention", True), ("CrossAttention", True), ("GatedFeedForward", False)] * 2
    tokens = torch.randint(4, model.config.vocab_size, (6, 10), generator=torch.Generator().manual_seed(0))
    tokens[0] = model.config.decoder_start_token_id
    for group in (1, 2):  # greedy rows, and beams sharing their sentence's cross-attention keys
        rows = tokens[:, : 5 * group]
        compiled = decoder_logits(engine, group, rows)
        blocks = [block for _, block in step_blocks(engine)]
        steps = [block.decoding_step for block in blocks]
        for block in blocks:
            block.decoding_step = None
        try:
            python_path = decoder_logits(engine, group, rows)
        finally:
            for block, step in zip(blocks, steps):
                block.decoding_step = step
        for step, (actual, expected) in enumerate(zip(compiled, python_path)):
            assert torch.equal(actual, expected), (quantization, group, step)


def test_a_declaration_is_the_classs_own_and_checked_where_it_is_made():
    """`decoding_step()` is what the sub-layer's own class declares: a subclass that does not repeat the declaration
    has none (it may compute something else), and a form of the other extension point, or an unknown one, is refused
    when the class is defined."""
    config = ToyFastPathConfig(**helpers.TINY_BACKBONE)
    assert SharpenedSelfAttention(config, 2, layer_idx=0).decoding_step() == "self"
    assert MultiHeadAttention(config, 2).decoding_step() == "self"
    assert CrossAttention(config, 2, layer_idx=0).decoding_step() == "memory"
    assert FeedForward(config, 32).decoding_step() == "feed_forward"
    assert GatedFeedForward(config, 32).decoding_step() is None

    class Undeclared(SharpenedSelfAttention):
        pass

    assert Undeclared(config, 2, layer_idx=0).decoding_step() is None
    with pytest.raises(TypeError, match=r"decoding_step='feed_forward' is not a decoding step form of its extension "
                                        r"point \(this class may declare \['memory', 'self'\]"):

        class WrongForm(MultiHeadAttention, decoding_step="feed_forward"):
            pass

    with pytest.raises(TypeError, match=r"decoding_step='self' .* may declare \['feed_forward'\]"):

        class AttentionFormOnAFeedForward(FeedForwardSublayer, decoding_step="self"):
            pass

    with pytest.raises(TypeError, match=r"decoding_step='ffn' .* may declare none"):

        class NoExtensionPoint(Sublayer, decoding_step="ffn"):
            pass


def test_a_connection_changes_only_the_embeddings_where_its_own_class_declares_it():
    """`changes_only_embeddings()` is what the connection's own class declares (`changes_only_embeddings=True`):
    layer-wise coordination's language embedding does, deep representations' aggregations do not, a subclass that
    does not repeat it does not (it may connect the layers too), and anything but a bool is refused when the class is
    defined."""
    from hf_layerfusion.models.deep_representations import DenseConnection
    from hf_layerfusion.models.layerwise_coordination import LanguageEmbedding, LayerwiseCoordinationConfig

    language_embedding = LanguageEmbedding(LayerwiseCoordinationConfig(**helpers.TINY_BACKBONE))
    assert language_embedding.changes_only_embeddings() is True
    assert DenseConnection().changes_only_embeddings() is False

    class AddsToEveryLayer(LanguageEmbedding):
        def forward(self, layer_idx, output, states):
            return output + self.language_embedding.weight[0]

    assert AddsToEveryLayer(LayerwiseCoordinationConfig(**helpers.TINY_BACKBONE)).changes_only_embeddings() is False
    with pytest.raises(TypeError, match=r"WrongFlag: changes_only_embeddings must be True or False, got 'yes'"):

        class WrongFlag(Connection, changes_only_embeddings="yes"):
            pass


def test_the_toy_family_is_gone_after_its_tests():
    assert MODEL_TYPE not in FAMILIES
