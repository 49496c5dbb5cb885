"""RTAL (equations numbered as in shared/papers/rtal.txt) against references written independently here: each
node function (Eq. 7, Eq. 8, our reading of the lost Eq. 9-10), the tree written recursively, the tree shapes
spelled out by hand, the root as printed (`root_layer_norm=False`), the paper's pre-norm setting, and the plain
backbone / MarianMTModel with aggregation off."""

import json

import pytest
import torch
from helpers import (
    FIRST_TOKEN_ID,
    assert_cached_search_is_uncached_search,
    assert_generate_matches_references,
    assert_incremental_decoding_matches_full_forward,
    assert_save_load_round_trip,
    assert_trainer_step_is_hand_computed,
    copy_task_rows,
    float64_default,
    output_logits,
    padded_source,
    pre_norm_readout_states,
    randomize_layer_norms,
    seeded_decoder_inputs,
    source_of,
    tiny_marian,
)

import hf_layerfusion
from hf_layerfusion import (
    PlainTransformerConfig,
    PlainTransformerForConditionalGeneration,
    RTALConfig,
    RTALForConditionalGeneration,
)
from hf_layerfusion.models.rtal import RTAL_PAPER_SETTING
from hf_layerfusion.modeling.presets import BACKBONE_PRESETS

FUNCTIONS = ["mean", "concat_ffn", "ewp_ffn"]
RESIDUALS = ["block_input", "children", "none"]


def build_rtal(tiny_backbone, **overrides) -> RTALForConditionalGeneration:
    """An RTAL with 6 encoder / 4 decoder layers by default, random tree parameters (γ included, so that the scale
    matters; LayerNorm gains around 1) and logits bias, and a 0.3-std init."""
    config = RTALConfig(
        **{**tiny_backbone, "encoder_layers": 6, "decoder_layers": 4, "init_std": 0.3, **overrides}
    )
    model = RTALForConditionalGeneration(config).eval()
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "readout" in name:
                noise = torch.randn(param.shape, generator=generator)
                param.copy_(noise * 0.3 + 1.0 if name.endswith(("layer_norm.weight", "scale")) else noise * 0.5)
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=generator))
    return model


# ------------------------------------------------------------------------------------------- references
def reference_layer_norm(x, layer_norm):
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + layer_norm.eps) * layer_norm.weight + layer_norm.bias


def reference_ffn(x, ffn):
    """W_2 relu(W_1 x + b_1) + b_2."""
    return torch.clamp(x @ ffn.fc1.weight.T + ffn.fc1.bias, min=0) @ ffn.fc2.weight.T + ffn.fc2.bias


def reference_node_function(function_name, module, x, y):
    if function_name == "mean":  # Eq. 7
        return 0.5 * x + 0.5 * y
    if function_name == "concat_ffn":  # Eq. 8
        return reference_ffn(torch.cat([x, y], dim=-1), module)
    product = x * y  # Eq. 9
    transformed = module.scale * reference_ffn(product, module.ffn)
    return reference_layer_norm(product + transformed, module.layer_norm)  # Eq. 10


def reference_tree(tree, function_name, residual, states, first, last, is_root=True, root_layer_norm=True):
    """The tree over 1-based layers first..last, written recursively: halves, children first, then the node; a
    non-root node adds s_{first-1} ("block_input") or its two children ("children"). `root_layer_norm=False`: the
    root is Eq. 7 / Eq. 8 / Eq. 10 as printed."""
    if first == last:
        return states[first]
    split = first + (last - first + 1) // 2 - 1
    left = reference_tree(tree, function_name, residual, states, first, split, is_root=False)
    right = reference_tree(tree, function_name, residual, states, split + 1, last, is_root=False)
    node = reference_node_function(function_name, tree.functions[f"layers_{first}_to_{last}"], left, right)
    if not is_root and residual == "block_input":
        node = node + states[first - 1]
    if not is_root and residual == "children":
        node = node + left + right
    if is_root and root_layer_norm and function_name != "ewp_ffn":
        node = reference_layer_norm(node, tree.root_layer_norm)  # Eq. 10 ends in LN; the others get their own
    return node


# ------------------------------------------------------------------------------------------- tree shapes
# (first layer, last layer of the left child, last layer, is root) of every node, in post-order, by hand
TREE_SHAPES = [
    (4, None, [(1, 1, 2, False), (3, 3, 4, False), (1, 2, 4, True)]),
    (4, 2, [(3, 3, 4, True)]),
    (6, None, [(3, 3, 4, False), (5, 5, 6, False), (3, 4, 6, True)]),  # the paper: the last 4 of 6
    (6, 2, [(5, 5, 6, True)]),
    (8, None, [
        (1, 1, 2, False), (3, 3, 4, False), (1, 2, 4, False),
        (5, 5, 6, False), (7, 7, 8, False), (5, 6, 8, False),
        (1, 4, 8, True),
    ]),
    (8, 4, [(5, 5, 6, False), (7, 7, 8, False), (5, 6, 8, True)]),
    (8, 2, [(7, 7, 8, True)]),
]


@pytest.mark.parametrize("layers, leaves, expected", TREE_SHAPES)
def test_tree_shape_post_order(layers, leaves, expected, tiny_backbone, padded_batch):
    model = build_rtal(
        tiny_backbone, encoder_layers=layers, encoder_tree_leaves=leaves, decoder_aggregation=False
    )
    tree = model.model.encoder.readout
    assert [(n.first, n.split, n.last, n.is_root) for n in tree.nodes] == expected
    assert list(tree.functions) == [f"layers_{first}_to_{last}" for first, _, last, _ in expected]

    # what each node really combines, in which order: record the inputs of every node function
    calls = []
    handles = [
        module.register_forward_hook(lambda _, inputs, output, name=name: calls.append((name, *inputs, output)))
        for name, module in tree.functions.items()
    ]
    with torch.no_grad():
        out = model(**padded_batch, output_hidden_states=True)
    for handle in handles:
        handle.remove()
    assert [call[0] for call in calls] == list(tree.functions)  # evaluated in post-order
    states = out.encoder_hidden_states
    node_values = {}
    for (first, split, last, is_root), (name, left, right, output) in zip(expected, calls, strict=True):
        expected_left = states[first] if split == first else node_values[first, split]
        expected_right = states[last] if split + 1 == last else node_values[split + 1, last]
        assert torch.equal(left, expected_left) and torch.equal(right, expected_right), name
        # block_input residual: s_{first-1} enters every non-root node, and nothing enters the root
        node_values[first, last] = output if is_root else output + states[first - 1]
    torch.testing.assert_close(out.encoder_last_hidden_state, node_values[expected[-1][0], layers], atol=0, rtol=0)


# ------------------------------------------------------------------------------------------- formulas
@pytest.mark.parametrize("function_name", FUNCTIONS)
def test_node_functions_eq7_to_eq10(function_name, tiny_backbone):
    model = build_rtal(tiny_backbone, aggregation_function=function_name, aggregation_ffn_dim=24)
    generator = torch.Generator().manual_seed(2)
    x, y = torch.randn(2, 3, 4, 16, generator=generator)
    for module in model.model.encoder.readout.functions.values():
        with torch.no_grad():
            torch.testing.assert_close(
                module(x, y), reference_node_function(function_name, module, x, y), atol=1e-5, rtol=1e-5
            )
    # Eq. 8 widens the FFN input to the concatenation [x; y]; Eq. 10's FFN reads the d-wide product
    first_linear = {"mean": None, "concat_ffn": "fc1", "ewp_ffn": "ffn.fc1"}[function_name]
    if first_linear is not None:
        assert module.get_submodule(first_linear).weight.shape == (24, 32 if function_name == "concat_ffn" else 16)


@pytest.mark.parametrize("residual", RESIDUALS)
@pytest.mark.parametrize("function_name", FUNCTIONS)
def test_tree_memory_and_output_projection(function_name, residual, tiny_backbone, padded_batch):
    model = build_rtal(tiny_backbone, aggregation_function=function_name, tree_residual=residual)
    with torch.no_grad():
        out = model(**padded_batch, output_hidden_states=True)
        encoder_tree = reference_tree(
            model.model.encoder.readout, function_name, residual, out.encoder_hidden_states, 3, 6
        )
        torch.testing.assert_close(out.encoder_last_hidden_state, encoder_tree, atol=1e-5, rtol=1e-5)
        # the tree really differs from the top layer, and the residual changes it
        assert (encoder_tree - out.encoder_hidden_states[-1]).abs().max() > 0.1
        # every cross-attention reads the tree's root: a decoder fed the reference memory reproduces the states
        decoder = model.model.decoder(
            input_ids=model.prepare_decoder_input_ids_from_labels(padded_batch["labels"]),
            encoder_hidden_states=encoder_tree,
            encoder_attention_mask=padded_batch["attention_mask"],
            output_hidden_states=True,
        )
        for ours, reference in zip(out.decoder_hidden_states, decoder.hidden_states, strict=True):
            torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)
        # the output projection reads the decoder tree's root (leaves 1..4)
        decoder_tree = reference_tree(
            model.model.decoder.readout, function_name, residual, out.decoder_hidden_states, 1, 4
        )
        logits = decoder_tree @ model.model.shared.weight.T + model.final_logits_bias
    torch.testing.assert_close(out.logits, logits, atol=1e-4, rtol=1e-5)
    keep = padded_batch["labels"] != -100
    nll = -torch.log_softmax(logits, -1)[keep].gather(-1, padded_batch["labels"][keep][:, None]).mean()
    torch.testing.assert_close(out.loss, nll, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("function_name", FUNCTIONS)
def test_root_is_layer_normalised(function_name, tiny_backbone, padded_batch):
    """The root replaces the top layer and reaches cross-attention and the output projection layer-normalised, like
    the top layer of a post-norm stack: Eq. 10's own LN for ewp_ffn, the tree's LayerNorm for mean and concat_ffn."""
    config = RTALConfig(**tiny_backbone, aggregation_function=function_name, init_std=0.3)  # root variance >> eps
    model = RTALForConditionalGeneration(config).eval()
    for readout in (model.model.encoder.readout, model.model.decoder.readout):
        assert (readout.root_layer_norm is None) == (function_name == "ewp_ffn")
    with torch.no_grad():
        memory = model(**padded_batch).encoder_last_hidden_state  # LayerNorm gains 1, biases 0 at initialisation
    torch.testing.assert_close(memory.mean(-1), torch.zeros(memory.shape[:2]), atol=1e-5, rtol=0)
    torch.testing.assert_close(memory.var(-1, unbiased=False), torch.ones(memory.shape[:2]), atol=1e-3, rtol=0)


@pytest.mark.parametrize("residual", ["block_input", "children"])
@pytest.mark.parametrize("function_name", FUNCTIONS)
def test_without_root_layer_norm_the_root_is_the_printed_equation(function_name, residual, tiny_backbone,
                                                                   padded_batch):
    """`root_layer_norm=False`: the root is Eq. 7 ((x + y) / 2), Eq. 8 (FFN([x; y])) or Eq. 10 exactly as printed,
    with no LayerNorm of the package's own, and both cross-attention and the output projection read it."""
    model = build_rtal(tiny_backbone, aggregation_function=function_name, tree_residual=residual,
                       root_layer_norm=False)
    for readout in (model.model.encoder.readout, model.model.decoder.readout):
        assert readout.root_layer_norm is None
        assert not any("root_layer_norm" in name for name, _ in readout.named_parameters())
    with torch.no_grad():
        out = model(**padded_batch, output_hidden_states=True)
        states = out.encoder_hidden_states
        root = reference_tree(model.model.encoder.readout, function_name, residual, states, 3, 6,
                              root_layer_norm=False)
        # the root node over layers 3..6, spelled out: its children are the nodes over 3..4 and 5..6
        left = reference_tree(model.model.encoder.readout, function_name, residual, states, 3, 4, is_root=False)
        right = reference_tree(model.model.encoder.readout, function_name, residual, states, 5, 6, is_root=False)
        if function_name == "mean":
            torch.testing.assert_close(root, (left + right) / 2, atol=1e-6, rtol=0)  # Eq. 7
        torch.testing.assert_close(out.encoder_last_hidden_state, root, atol=1e-5, rtol=1e-5)
        decoder_root = reference_tree(model.model.decoder.readout, function_name, residual,
                                      out.decoder_hidden_states, 1, 4, root_layer_norm=False)
        logits = decoder_root @ model.model.shared.weight.T + model.final_logits_bias
    torch.testing.assert_close(out.logits, logits, atol=1e-4, rtol=1e-5)
    if function_name != "ewp_ffn":  # the switch changes the model exactly where the package adds a LayerNorm
        with torch.no_grad():
            normalised = build_rtal(tiny_backbone, aggregation_function=function_name, tree_residual=residual)
            assert (normalised(**padded_batch).encoder_last_hidden_state - root).abs().max() > 0.1


def test_paper_setting_pre_norm_children_ewp(tiny_backbone, padded_batch):
    """`from_preset("rtal_paper")`: EWP + FFN nodes, the children residual and pre-norm layers, whose final
    LayerNorm normalises every leaf; the tree's leaves, residuals and root computed here from the raw layer outputs."""
    model = build_rtal(tiny_backbone, **RTAL_PAPER_SETTING)
    assert model.config.normalize_before and model.config.tree_residual == "children"
    with torch.no_grad():
        out = model(**padded_batch, output_hidden_states=True)

        def leaves(stack, hidden_states):  # pre-norm: s_1..s_L through the stack's final LayerNorm
            return [hidden_states[0]] + [reference_layer_norm(h, stack.layer_norm) for h in hidden_states[1:]]

        encoder, decoder = model.model.encoder, model.model.decoder
        states = leaves(encoder, out.encoder_hidden_states)
        readout = encoder.readout

        def node(first, last, x, y):  # Eq. 9-10, then the children residual below the root
            return reference_node_function("ewp_ffn", readout.functions[f"layers_{first}_to_{last}"], x, y)

        left = node(3, 4, states[3], states[4]) + states[3] + states[4]
        right = node(5, 6, states[5], states[6]) + states[5] + states[6]
        torch.testing.assert_close(out.encoder_last_hidden_state, node(3, 6, left, right), atol=1e-5, rtol=1e-5)
        decoder_root = reference_tree(decoder.readout, "ewp_ffn", "children",
                                      leaves(decoder, out.decoder_hidden_states), 1, 4)
        logits = decoder_root @ model.model.shared.weight.T + model.final_logits_bias
    torch.testing.assert_close(out.logits, logits, atol=1e-4, rtol=1e-5)


def test_paper_preset():
    config = RTALConfig.from_preset("rtal_paper")
    assert (config.aggregation_function, config.tree_residual, config.normalize_before) == ("ewp_ffn", "children",
                                                                                            True)
    assert config.encoder_aggregation and config.decoder_aggregation and config.root_layer_norm
    # Transformer-Base + RTAL (6L): the backbone defaults, the last 4 of 6 layers in each tree
    assert (config.d_model, config.encoder_layers, config.decoder_layers, config.encoder_ffn_dim,
            config.encoder_attention_heads) == (512, 6, 6, 2048, 8)
    assert (config.tree_leaves(is_decoder=False), config.tree_leaves(is_decoder=True)) == (4, 4)
    small = RTALConfig.from_preset("rtal_paper", **BACKBONE_PRESETS["multi30k"])
    assert (small.d_model, small.encoder_ffn_dim, small.tree_residual, small.normalize_before) == (256, 1024,
                                                                                                    "children", True)
    with pytest.raises(ValueError, match="'rtal_paper'"):
        PlainTransformerConfig.from_preset("rtal_paper")  # other families do not see it


def test_config_without_root_layer_norm_key_keeps_the_root_layer_norm(tiny_backbone, tmp_path):
    """A checkpoint saved before the switch existed (no `root_layer_norm` in config.json) loads with its root
    LayerNorm and every weight."""
    model = build_rtal(tiny_backbone, aggregation_function="concat_ffn")
    model.save_pretrained(tmp_path)
    config_file = tmp_path / "config.json"
    saved = json.loads(config_file.read_text())
    assert saved.pop("root_layer_norm") is True
    config_file.write_text(json.dumps(saved))
    loaded = RTALForConditionalGeneration.from_pretrained(tmp_path)
    assert loaded.config.root_layer_norm is True
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key


def test_residual_readings_differ(tiny_backbone, padded_batch):
    """The three residual readings give three different memories (a mutation swapping them would show)."""
    memories = []
    for residual in RESIDUALS:
        with torch.no_grad():
            memories.append(build_rtal(tiny_backbone, tree_residual=residual)(**padded_batch).encoder_last_hidden_state)
    for i in range(3):
        for j in range(i + 1, 3):
            assert (memories[i] - memories[j]).abs().max() > 0.1


def test_one_side_only(tiny_backbone, padded_batch):
    """Table 3: "+encoder" keeps the top decoder layer for the projection, "+decoder" the top encoder layer."""
    encoder_only = build_rtal(tiny_backbone, decoder_aggregation=False)
    decoder_only = build_rtal(tiny_backbone, encoder_aggregation=False)
    assert not any("decoder.readout" in name for name, _ in encoder_only.named_parameters())
    assert not any("encoder.readout" in name for name, _ in decoder_only.named_parameters())
    with torch.no_grad():
        out = encoder_only(**padded_batch, output_hidden_states=True)
        top = out.decoder_hidden_states[-1] @ encoder_only.model.shared.weight.T + encoder_only.final_logits_bias
        torch.testing.assert_close(out.logits, top, atol=1e-5, rtol=1e-5)
        out = decoder_only(**padded_batch, output_hidden_states=True)
        assert torch.equal(out.encoder_last_hidden_state, out.encoder_hidden_states[-1])


def test_gradients_reach_every_tree_parameter(tiny_backbone, padded_batch):
    model = build_rtal(tiny_backbone).train()
    model(**padded_batch).loss.backward()
    tree = [(name, p) for name, p in model.named_parameters() if "readout" in name]
    assert len(tree) == 2 * 3 * 7  # 3 nodes per side, each: γ, fc1 (w, b), fc2 (w, b), LayerNorm (w, b)
    for name, param in tree:
        assert param.grad is not None and param.grad.abs().sum() > 0, name
    assert set(model.model.encoder.readout.fusion_weights()) == {"node_scale"}
    torch.testing.assert_close(
        model.model.encoder.readout.fusion_weights()["node_scale"],
        torch.cat([f.scale for f in model.model.encoder.readout.functions.values()]),
    )


def test_init_scale_is_one(tiny_backbone):
    model = RTALForConditionalGeneration(RTALConfig(**tiny_backbone))
    for readout in (model.model.encoder.readout, model.model.decoder.readout):
        assert torch.equal(readout.fusion_weights()["node_scale"], torch.ones(1))  # 2 layers: one node


# ------------------------------------------------------------------------------------------- aggregation off
def test_aggregation_off_is_plain_backbone(tiny_backbone, padded_batch):
    plain = PlainTransformerForConditionalGeneration(PlainTransformerConfig(**tiny_backbone, init_std=0.3)).eval()
    rtal = RTALForConditionalGeneration(
        RTALConfig(**tiny_backbone, encoder_aggregation=False, decoder_aggregation=False)
    ).eval()
    rtal.load_state_dict(plain.state_dict(), strict=True)  # the very same parameters, nothing more
    with torch.no_grad():
        assert torch.equal(rtal(**padded_batch).logits, plain(**padded_batch).logits)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_from_marian_aggregation_off_matches_marian(attn_implementation):
    marian = tiny_marian(attn_implementation)
    model = hf_layerfusion.from_marian(
        marian, model_type="rtal", encoder_aggregation=False, decoder_aggregation=False
    ).eval()
    assert model.conversion_report["freshly_initialised"] == []
    batch = padded_source()
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, marian(**batch).logits, atol=1e-5, rtol=1e-5)


def test_from_marian_reports_fresh_tree(tiny_backbone):
    model = hf_layerfusion.from_marian(tiny_marian("eager"), model_type="rtal", aggregation_function="concat_ffn")
    tree = sorted(name for name, _ in model.named_parameters() if "readout" in name)
    assert len(tree) == 2 * 6  # one node per side (2 layers): fc1 (w, b), fc2 (w, b), root LayerNorm (w, b)
    assert model.conversion_report["freshly_initialised"] == tree


# ------------------------------------------------------------------------------------------- cache, generate, io
CACHE_CASES = {
    "ewp_ffn": {},
    "concat_ffn_children": dict(aggregation_function="concat_ffn", tree_residual="children"),
    "mean_pre_norm": dict(aggregation_function="mean", normalize_before=True),
    "decoder_two_leaves": dict(decoder_tree_leaves=2),
}


@pytest.mark.parametrize("case", sorted(CACHE_CASES))
def test_incremental_decoding_matches_full_forward(case, tiny_backbone, padded_batch):
    # float64: the LayerNorm of Eq. 10 over a product of states amplifies float32 rounding to ~1e-5, while a
    # cache bug shows at 1e-2 and more
    model = build_rtal(tiny_backbone, **CACHE_CASES[case]).double()
    source = source_of(padded_batch)
    decoder_input_ids = torch.randint(FIRST_TOKEN_ID, model.config.vocab_size, (3, 6))
    decoder_input_ids[:, 0] = model.config.decoder_start_token_id
    assert_incremental_decoding_matches_full_forward(model, source, decoder_input_ids, atol=1e-10)

    # beam 4 and greedy: cache reordering between beams must not change the search
    for num_beams in (4, 1):
        assert_cached_search_is_uncached_search(model, source, num_beams)
    # and against step-by-step decoding over full forward passes: greedy, beam scores, seeded sampling
    assert_generate_matches_references(model, source, max_new_tokens=6)


def test_save_load_round_trip(tiny_backbone, padded_batch, tmp_path):
    """The family contract's round trip (tests/helpers.py) of a tree with the non-default knobs saved in config.json."""
    model = build_rtal(tiny_backbone, aggregation_function="concat_ffn", decoder_tree_leaves=2, aggregation_ffn_dim=8)
    loaded = assert_save_load_round_trip(model, padded_batch, tmp_path)
    for key in ("aggregation_function", "decoder_tree_leaves", "aggregation_ffn_dim", "tree_residual"):
        assert getattr(loaded.config, key) == getattr(model.config, key)


def test_plain_checkpoint_loads_with_fresh_tree(tiny_backbone, tmp_path):
    """A plain Transformer checkpoint loads into RTAL: the backbone is the checkpoint's, the tree starts fresh with
    γ = 1 and unit LayerNorms."""
    plain = PlainTransformerForConditionalGeneration(PlainTransformerConfig(**tiny_backbone))
    plain.save_pretrained(tmp_path)
    rtal = RTALForConditionalGeneration.from_pretrained(tmp_path)
    assert torch.equal(rtal.model.encoder.layers[1].ffn.fc2.weight, plain.model.encoder.layers[1].ffn.fc2.weight)
    for readout in (rtal.model.encoder.readout, rtal.model.decoder.readout):
        (node,) = readout.functions.values()
        assert torch.equal(node.scale, torch.ones(1))
        assert torch.equal(node.layer_norm.weight, torch.ones(16))
        assert torch.equal(node.layer_norm.bias, torch.zeros(16))
        assert 0 < node.ffn.fc1.weight.std() < 4 * rtal.config.init_std


# ------------------------------------------------------------------------------------------- config
@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(encoder_tree_leaves=3), r"encoder_tree_leaves.*power of two.*got 3"),
        (dict(decoder_tree_leaves=1), r"decoder_tree_leaves.*power of two.*got 1"),
        (dict(encoder_layers=6, encoder_tree_leaves=8), r"encoder_tree_leaves.*\(8\) exceeds `encoder_layers` \(6\)"),
        (dict(decoder_layers=1), r"at least 2 layers.*decoder_layers` is 1"),
        (dict(aggregation_function="max"), r"aggregation_function.*'max'"),
        (dict(tree_residual="all"), r"tree_residual.*'all'"),
        (dict(aggregation_ffn_dim=0), r"aggregation_ffn_dim.*got 0"),
        (dict(root_layer_norm="false"), r"root_layer_norm.*True or False.*'false'"),
        (dict(root_layer_norm=None), r"root_layer_norm.*True or False.*None"),
        (dict(root_layer_norm=0), r"root_layer_norm.*True or False.*0"),
    ],
)
def test_bad_config_raises(overrides, message, tiny_backbone):
    with pytest.raises(ValueError, match=message):
        RTALConfig(**{**tiny_backbone, **overrides})


def test_config_defaults_and_single_layer_without_aggregation(tiny_backbone):
    config = RTALConfig(**{**tiny_backbone, "encoder_layers": 7, "decoder_layers": 5})
    assert (config.tree_leaves(is_decoder=False), config.tree_leaves(is_decoder=True)) == (4, 4)
    config = RTALConfig(**{**tiny_backbone, "decoder_layers": 1, "decoder_aggregation": False})
    assert RTALForConditionalGeneration(config).model.decoder.readout.num_groups == 1
    with pytest.raises(TypeError, match="tree_leafs"):
        RTALConfig(**tiny_backbone, tree_leafs=4)


# ------------------------------------------------------------------------------------------- trainer
def test_one_trainer_step(tiny_backbone, tmp_path):
    """One Trainer step is the SGD step computed by hand from the model's loss (label smoothing included), and the
    tree's parameters take part in it."""
    model = build_rtal(tiny_backbone, label_smoothing=0.1).train()
    _, gradients = assert_trainer_step_is_hand_computed(model, copy_task_rows(model.config.vocab_size), tmp_path)
    assert model.config.label_smoothing == 0.1
    tree = [name for name in gradients if "readout" in name]
    assert tree and all(gradients[name] is not None and gradients[name].abs().sum() > 0 for name in tree)


# ------------------------------------------------------------------------------------------- pre-norm
@pytest.mark.parametrize("function_name", FUNCTIONS)
def test_rtal_pre_norm_tree_on_normalised_states(function_name, tiny_backbone, padded_batch):
    """The trees of both stacks over the final-LayerNorm'd layer outputs: encoder leaves 3..6 (residual of the first
    node: s_2 normalised), decoder leaves 1..4 (residual of the first node: s_0, the embeddings, as they are)."""
    with float64_default():
        model = build_rtal(tiny_backbone, aggregation_function=function_name, normalize_before=True)
    randomize_layer_norms(model)
    encoder, decoder = model.model.encoder, model.model.decoder
    targets = seeded_decoder_inputs(model)
    with torch.no_grad():
        memory, decoder_states = pre_norm_readout_states(
            model, padded_batch, targets,
            lambda states: reference_tree(encoder.readout, function_name, "block_input", states, 3, 6),
        )
        root = reference_tree(decoder.readout, function_name, "block_input", decoder_states, 1, 4)
        out = model(**source_of(padded_batch), decoder_input_ids=targets)
    torch.testing.assert_close(out.encoder_last_hidden_state, memory, atol=1e-10, rtol=0)
    torch.testing.assert_close(out.logits, output_logits(model, root), atol=1e-10, rtol=0)
