"""Deep representations (Dou et al. 2018): every strategy against a brute-force reference written here, the
hierarchical tree's shape, KV-cached decoding, layer diversity, and the HF plumbing (save/load, Marian, trainer)."""

import json
import math

import pytest
import torch
import torch.nn.functional as F
from helpers import (
    assert_cached_search_is_uncached_search,
    assert_generate_matches_references,
    assert_gradient_checkpointing_same_gradients,
    assert_incremental_decoding_matches_full_forward,
    assert_save_load_round_trip,
    assert_trainer_step_is_hand_computed,
    attention,
    causal_allowed,
    copy_task_rows,
    embed,
    float64_default,
    layer_norm,
    output_logits,
    padded_source,
    padding_allowed,
    plain_attend,
    randomize_layer_norms,
    reference_stack,
    source_of,
    tiny_marian,
)
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForSeq2SeqLM,
    MarianConfig,
    MarianMTModel,
    Seq2SeqTrainingArguments,
    modeling_utils,
)
from transformers.testing_utils import CaptureLogger

import hf_layerfusion
from hf_layerfusion import (
    DeepRepresentationsConfig,
    DeepRepresentationsForConditionalGeneration,
    DeepRepresentationsModel,
    PlainTransformerConfig,
    PlainTransformerForConditionalGeneration,
)
from hf_layerfusion.models.deep_representations import (
    DIVERSITY_DIAGNOSTICS,
    MultiLayerSelfAttention,
    layer_diversity,
    position_spread,
)
from hf_layerfusion.training.trainer import LayerFusionSeq2SeqTrainer

STRATEGIES = ("none", "dense", "linear", "iterative", "hierarchical", "multi_layer_attention")
OFF = dict(encoder_aggregation="none", decoder_aggregation="none", diversity_weight=0.0)


def make_model(tiny_backbone, layers=4, **overrides) -> DeepRepresentationsForConditionalGeneration:
    config = DeepRepresentationsConfig(
        **{**tiny_backbone, "encoder_layers": layers, "decoder_layers": layers, "init_std": 0.3, **overrides}
    )
    model = DeepRepresentationsForConditionalGeneration(config).eval()
    randomize_fusion(model)
    return model


def randomize_fusion(model):
    """Random W_l and AGG LayerNorms (their init is I / 0 and 1 / 0), so that every fusion parameter shows."""
    generator = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("readout.weight"):
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
            elif ("nodes." in name or "aggregation." in name) and ".layer_norm." in name:
                base = 1.0 if name.endswith("weight") else 0.0
                param.copy_(base + torch.randn(param.shape, generator=generator) * 0.5)


def source_tokens(batch=2, length=5):
    return torch.randint(4, 24, (batch, length), generator=torch.Generator().manual_seed(3))


# ----------------------------------------------------------------------------------------- brute-force helpers
def agg_reference(node, inputs, residual="all", top=None, activation=torch.sigmoid):
    """LN(FF([x_1; ..; x_n]) + residual), FF = W_2 act(W_1 z + b_1) + b_2, written out with the node's weights."""
    z = torch.cat(inputs, dim=-1)
    ff = activation(z @ node.fc1.weight.T + node.fc1.bias) @ node.fc2.weight.T + node.fc2.bias
    if residual == "all":
        ff = ff + sum(inputs)
    elif residual == "top":
        ff = ff + inputs[top]
    return F.layer_norm(ff, ff.shape[-1:], node.layer_norm.weight, node.layer_norm.bias, node.layer_norm.eps)


def attention_reference(attention, queries_from, keys_from, num_heads):
    """Unmasked multi-head attention softmax(Q K^T / sqrt(d_h)) V, written out with the module's projections."""
    batch, length, d = queries_from.shape
    d_h = d // num_heads

    def heads(x, proj):
        return (x @ proj.weight.T + proj.bias).view(batch, -1, num_heads, d_h).transpose(1, 2)

    q = heads(queries_from, attention.q_proj)
    k, v = heads(keys_from, attention.k_proj), heads(keys_from, attention.v_proj)
    scores = q @ k.transpose(-1, -2) / math.sqrt(d_h)
    context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, d)
    return context @ attention.out_proj.weight.T + attention.out_proj.bias


def encoder_embeddings(model, input_ids):
    encoder = model.model.encoder
    return encoder.embeddings(input_ids, encoder.embed_tokens(input_ids))


def run_layer(layer, hidden_states):
    """Backbone layer `Layer(.)` as a black box (no padding, so no mask)."""
    return layer(hidden_states, None)[0]


def encoder_output(model, input_ids):
    with torch.no_grad():
        return model.model.encoder(input_ids=input_ids).last_hidden_state


# ----------------------------------------------------------------------------------------- aggregation off
@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_aggregation_off_equals_plain_backbone(attn_implementation, tiny_backbone, padded_batch):
    plain = PlainTransformerForConditionalGeneration(
        PlainTransformerConfig(**tiny_backbone, init_std=0.3, attn_implementation=attn_implementation)
    ).eval()
    model = DeepRepresentationsForConditionalGeneration(
        DeepRepresentationsConfig(**tiny_backbone, **OFF, attn_implementation=attn_implementation)
    ).eval()
    assert set(model.state_dict()) == set(plain.state_dict())  # no fusion parameter at all
    model.load_state_dict(plain.state_dict())
    with torch.no_grad():
        expected, actual = plain(**padded_batch), model(**padded_batch)
    assert expected.logits.abs().max() > 1.0
    assert torch.equal(actual.logits, expected.logits)
    assert torch.equal(actual.loss, expected.loss)
    assert actual.layer_diversity is None


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_from_marian_aggregation_off_matches_marian(attn_implementation):
    marian = tiny_marian(attn_implementation)
    model = hf_layerfusion.from_marian(
        marian, model_type="deep_representations", attn_implementation=attn_implementation, **OFF
    ).eval()
    assert type(model) is DeepRepresentationsForConditionalGeneration
    batch = padded_source()
    with torch.no_grad():
        torch.testing.assert_close(model(**batch).logits, marian(**batch).logits, atol=1e-4, rtol=0)
    generate_kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=4,
                           max_length=12, output_scores=True, return_dict_in_generate=True)
    expected, generated = marian.generate(**generate_kwargs), model.generate(**generate_kwargs)
    assert generated.sequences.tolist() == expected.sequences.tolist()
    torch.testing.assert_close(generated.sequences_scores, expected.sequences_scores, atol=1e-4, rtol=0)


@pytest.mark.parametrize("strategy", ["dense", "linear", "iterative", "hierarchical", "multi_layer_attention"])
def test_from_marian_with_aggregation_loads_every_backbone_weight(strategy):
    marian = MarianMTModel(MarianConfig(vocab_size=30, decoder_vocab_size=30, d_model=16, encoder_layers=4,
                                        decoder_layers=4, encoder_attention_heads=2, decoder_attention_heads=2,
                                        encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
                                        pad_token_id=29, decoder_start_token_id=29, eos_token_id=0))
    model = hf_layerfusion.from_marian(marian, model_type="deep_representations", encoder_aggregation=strategy,
                                       decoder_aggregation=strategy)
    fresh = set(model.conversion_report["freshly_initialised"]) - {"lm_head.weight"}
    fusion_keys = {"dense": (), "linear": ("readout",), "iterative": ("readout",), "hierarchical": ("connection",),
                   "multi_layer_attention": ("lower_attentions", "self_attn.aggregation")}[strategy]
    assert all(any(part in key for part in fusion_keys) for key in fresh), fresh
    assert bool(fresh) == bool(fusion_keys)
    # in a multi-layer-attention layer, ATT_1 (over layer l-1) is Marian's self-attention
    key = "model.encoder.layers.3.self_attn.q_proj.weight"
    assert torch.equal(model.state_dict()[key], marian.state_dict()[key])


# ----------------------------------------------------------------------------------------- Eq. 4-7
def test_dense_connection_eq4(tiny_backbone):
    model = make_model(tiny_backbone, encoder_aggregation="dense")
    input_ids = source_tokens()
    with torch.no_grad():
        states = [encoder_embeddings(model, input_ids)]  # H^0
        for layer in model.model.encoder.layers:
            # H^l = Layer(H^{l-1}) + sum_{i=1}^{l-1} H^i
            states.append(run_layer(layer, states[-1]) + sum(states[1:], torch.zeros_like(states[0])))
    torch.testing.assert_close(encoder_output(model, input_ids), states[-1], atol=1e-5, rtol=1e-5)


def test_linear_combination_eq5(tiny_backbone):
    model = make_model(tiny_backbone, encoder_aggregation="linear")
    readout = model.model.encoder.readout
    assert readout.weight.shape == (4, 16, 16)  # one d x d matrix per layer, not scalars
    input_ids = source_tokens()
    with torch.no_grad():
        h = encoder_embeddings(model, input_ids)
        expected = 0
        for l, layer in enumerate(model.model.encoder.layers):
            h = run_layer(layer, h)  # H^{l+1}: the stack is the plain one
            expected = expected + torch.einsum("btj,ij->bti", h, readout.weight[l])  # W_l h
    torch.testing.assert_close(encoder_output(model, input_ids), expected, atol=1e-5, rtol=1e-5)


def test_linear_combination_starts_as_top_layer(tiny_backbone):
    config = DeepRepresentationsConfig(**tiny_backbone, encoder_aggregation="linear", decoder_aggregation="linear")
    model = DeepRepresentationsForConditionalGeneration(config)
    weight = model.model.decoder.readout.weight
    assert torch.equal(weight[-1], torch.eye(16)) and not weight[:-1].any()


@pytest.mark.parametrize("residual", ["all", "top", "none"])
@pytest.mark.parametrize("activation", ["sigmoid", "relu"])
def test_iterative_aggregation_eq6_eq7(residual, activation, tiny_backbone):
    model = make_model(tiny_backbone, encoder_aggregation="iterative", aggregation_residual=residual,
                       aggregation_activation=activation)
    nodes = model.model.encoder.readout.nodes
    assert len(nodes) == 3  # Ĥ^2, Ĥ^3, Ĥ^4; Ĥ^1 = H^1
    input_ids = source_tokens()
    with torch.no_grad():
        h = run_layer(model.model.encoder.layers[0], encoder_embeddings(model, input_ids))
        aggregated = h  # Ĥ^1 = H^1
        for node, layer in zip(nodes, model.model.encoder.layers[1:]):
            h = run_layer(layer, h)
            # Ĥ^l = AGG(H^l, Ĥ^{l-1}); "top" is H^l
            aggregated = agg_reference(node, [h, aggregated], residual, top=0,
                                       activation=torch.sigmoid if activation == "sigmoid" else torch.relu)
    torch.testing.assert_close(encoder_output(model, input_ids), aggregated, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------- hierarchical tree
EXPECTED_TREES = {
    4: [("H1", "H2"), ("H3", "H4", "Ĥ1")],
    6: [("H1", "H2"), ("H3", "H4", "Ĥ1"), ("H5", "H6", "Ĥ2")],
    8: [("H1", "H2"), ("H3", "H4", "Ĥ1"), ("H5", "H6", "Ĥ2"), ("H7", "H8", "Ĥ3")],
}


@pytest.mark.parametrize("layers", sorted(EXPECTED_TREES))
def test_hierarchical_tree_shape(layers, tiny_backbone):
    model = make_model(tiny_backbone, layers=layers, encoder_aggregation="hierarchical")
    encoder = model.model.encoder
    assert encoder.connection.node_inputs() == EXPECTED_TREES[layers]
    layer_io, node_io = [], []
    handles = [layer.register_forward_hook(lambda m, args, out: layer_io.append((args[0], out[0])))
               for layer in encoder.layers]
    handles += [node.register_forward_hook(lambda m, args, out: node_io.append((args, out)))
                for node in encoder.connection.nodes]
    output = encoder_output(model, source_tokens())
    for handle in handles:
        handle.remove()
    assert len(layer_io) == layers and len(node_io) == layers // 2
    named = {f"H{l}": out for l, (_, out) in enumerate(layer_io, 1)}
    named.update({f"Ĥ{i}": out for i, (_, out) in enumerate(node_io, 1)})
    for i, (args, _) in enumerate(node_io, 1):
        expected = EXPECTED_TREES[layers][i - 1]
        assert len(args) == len(expected)
        for arg, name in zip(args, expected):
            assert arg is named[name], f"node Ĥ{i} input {name}"
        # each node is fed back: the next sub-tree (layer 2i+1) reads Ĥ^i
        if 2 * i < layers:
            assert layer_io[2 * i][0] is named[f"Ĥ{i}"]
    # odd layers read the preceding layer's output inside a sub-tree
    for l in range(2, layers + 1, 2):
        assert layer_io[l - 1][0] is named[f"H{l - 1}"]
    assert torch.equal(output, named[f"Ĥ{layers // 2}"])  # the top node is the output


@pytest.mark.parametrize("residual", ["all", "top", "none"])
def test_hierarchical_aggregation_values(residual, tiny_backbone):
    model = make_model(tiny_backbone, layers=6, encoder_aggregation="hierarchical", aggregation_residual=residual)
    encoder = model.model.encoder
    input_ids = source_tokens()
    with torch.no_grad():
        h, previous = encoder_embeddings(model, input_ids), None
        for i, node in enumerate(encoder.connection.nodes, 1):
            odd = run_layer(encoder.layers[2 * i - 2], h)  # H^{2i-1}
            even = run_layer(encoder.layers[2 * i - 1], odd)  # H^{2i}
            inputs = [odd, even] + ([previous] if previous is not None else [])
            previous = h = agg_reference(node, inputs, residual, top=1)  # "top" is H^{2i}
    torch.testing.assert_close(encoder_output(model, input_ids), previous, atol=1e-5, rtol=1e-5)


def test_hierarchical_odd_layers_rejected(tiny_backbone):
    with pytest.raises(ValueError, match="`decoder_layers` is 5"):
        DeepRepresentationsConfig(**{**tiny_backbone, "decoder_layers": 5})


# ----------------------------------------------------------------------------------------- Eq. 8
@pytest.mark.parametrize("k", [2, 3])
def test_multi_layer_attention_eq8(k, tiny_backbone):
    model = make_model(tiny_backbone, encoder_aggregation="multi_layer_attention", multi_layer_attention_k=k)
    layers = model.model.encoder.layers
    # layers 1..k keep the plain self-attention (the embedding is not a layer)
    assert [isinstance(layer.self_attn, MultiLayerSelfAttention) for layer in layers] == [l > k for l in range(1, 5)]
    input_ids = source_tokens()
    with torch.no_grad():
        states = [encoder_embeddings(model, input_ids)]  # H^0
        for l, layer in enumerate(layers, 1):
            if l <= k:
                states.append(run_layer(layer, states[-1]))
                continue
            attn = layer.self_attn
            attentions = [attn, *attn.lower_attentions]  # ATT_i over H^{l-i}, i = 1..k
            contexts = [attention_reference(a, states[l - 1], states[l - i], 2) for i, a in enumerate(attentions, 1)]
            c = agg_reference(attn.aggregation, contexts, "all")  # C^l = AGG(C_{-1}, .., C_{-k})
            c = layer.self_attn_block.layer_norm(c + states[l - 1])  # Eq. 1, first sub-layer
            ffn = layer.ffn.fc2(torch.relu(layer.ffn.fc1(c)))
            states.append(layer.ffn_block.layer_norm(ffn + c))
    torch.testing.assert_close(encoder_output(model, input_ids), states[-1], atol=1e-5, rtol=1e-5)


def test_multi_layer_attention_decoder_cache_slots(tiny_backbone):
    config = DeepRepresentationsConfig(**{**tiny_backbone, "decoder_layers": 5}, encoder_aggregation="none",
                                       decoder_aggregation="multi_layer_attention", multi_layer_attention_k=3,
                                       diversity_weight=0)
    assert config.decoder_cache_layers == 3 * 1 + 2 * 3  # layers 1-3 one slot, layers 4-5 three
    assert config.get_text_config(decoder=True).num_hidden_layers == 9
    model = DeepRepresentationsForConditionalGeneration(config)
    slots = [m.layer_idx for layer in model.model.decoder.layers
             for m in [layer.self_attn, *getattr(layer.self_attn, "lower_attentions", [])]]
    assert slots == list(range(9))


# ----------------------------------------------------------------------------------------- both stacks, both norms
def reference_deep_logits(model, batch, targets):
    """The whole model written out (tests/helpers.py layers), both stacks aggregated with the config's strategy, in
    the config's norm: Eq. 4 and the hierarchical nodes act on the states as the layers produce them; Eq. 5 and Eq. 6
    read the states as readouts see them (pre-norm: through the stack's final LayerNorm); multi-layer attention
    (Eq. 8) queries each of the k layers below with its own attention, the lower states through their own LayerNorm
    in pre-norm (the layer's own input through its block's), causal in the decoder."""
    config = model.config
    pre_norm = config.normalize_before
    activation = AGGREGATION_ACTIVATION[config.aggregation_activation]
    residual = config.aggregation_residual

    def run(stack, strategy, ids, self_allowed, memory=None, memory_allowed=None):
        heads = config.decoder_attention_heads if memory is not None else config.encoder_attention_heads

        def attend_for_layer(l, below):
            plain = plain_attend(heads, self_allowed, memory, memory_allowed)
            if strategy != "multi_layer_attention" or l <= config.multi_layer_attention_k:
                return plain

            def attend(kind, module, x, normalize):
                if kind != "s":
                    return plain(kind, module, x, normalize)
                contexts = [attention(module, x, x, self_allowed, heads)]  # C_{-1}: over layer l-1, the input
                for i, lower_attention in enumerate(module.lower_attentions, start=2):
                    lower = below[l - i]  # H^{l-i}
                    if pre_norm:
                        lower = layer_norm(lower, module.lower_norms[i - 2])
                    contexts.append(attention(lower_attention, x, lower, self_allowed, heads))
                return agg_reference(module.aggregation, contexts, residual, top=0, activation=activation)

            return attend

        def connect(l, output, below):
            if strategy == "dense":  # Eq. 4: H^l = Layer(H^{l-1}) + sum_{i=1}^{l-1} H^i
                return output + sum(below[1:l], torch.zeros_like(output))
            if strategy == "hierarchical" and l % 2 == 0:  # Ĥ^i = AGG(H^{2i-1}, H^{2i}[, Ĥ^{i-1}])
                i = l // 2
                inputs = [below[l - 1], output] + ([below[l - 2]] if i > 1 else [])
                return agg_reference(stack.connection.nodes[i - 1], inputs, residual, top=1, activation=activation)
            return output

        layouts = ["scf" if memory is not None else "sf"] * len(stack.layers)
        states = reference_stack(stack.layers, layouts, embed(model, ids), pre_norm, attend_for_layer, connect)
        seen = [layer_norm(state, stack.layer_norm) if pre_norm else state for state in states[1:]]  # H^1..H^L
        if strategy == "linear":  # Eq. 5: sum_l W_l H^l
            return sum(h @ w.T for h, w in zip(seen, stack.readout.weight, strict=True))
        if strategy == "iterative":  # Eq. 6: Ĥ^1 = H^1, Ĥ^l = AGG(H^l, Ĥ^{l-1})
            aggregated = seen[0]
            for node, h in zip(stack.readout.nodes, seen[1:], strict=True):
                aggregated = agg_reference(node, [h, aggregated], residual, top=0, activation=activation)
            return aggregated
        return seen[-1]

    source_mask = batch["attention_mask"]
    memory = run(model.model.encoder, config.encoder_aggregation, batch["input_ids"],
                 padding_allowed(source_mask, source_mask.shape[1]))
    features = run(model.model.decoder, config.decoder_aggregation, targets, causal_allowed(*targets.shape), memory,
                   padding_allowed(source_mask, targets.shape[1]))
    return memory, output_logits(model, features)


AGGREGATION_ACTIVATION = {"sigmoid": torch.sigmoid, "relu": torch.relu}
BOTH_STACKS_CASES = {
    "dense": dict(aggregation="dense"),
    "linear": dict(aggregation="linear"),
    "iterative": dict(aggregation="iterative"),
    "iterative_top_relu": dict(aggregation="iterative", aggregation_residual="top", aggregation_activation="relu"),
    "hierarchical": dict(aggregation="hierarchical"),
    "hierarchical_no_residual": dict(aggregation="hierarchical", aggregation_residual="none"),
    "multi_layer_attention_k2": dict(aggregation="multi_layer_attention", multi_layer_attention_k=2),
    "multi_layer_attention_k3_top": dict(aggregation="multi_layer_attention", multi_layer_attention_k=3,
                                         aggregation_residual="top"),
}


@pytest.mark.parametrize("normalize_before", [False, True])
@pytest.mark.parametrize("case", sorted(BOTH_STACKS_CASES))
def test_both_stacks_equal_hand_written_model(case, normalize_before, tiny_backbone, padded_batch):
    """Encoder- and decoder-side aggregation, post- and pre-norm, against `reference_deep_logits` (float64)."""
    overrides = dict(BOTH_STACKS_CASES[case])
    strategy = overrides.pop("aggregation")
    with float64_default():
        model = make_model(tiny_backbone, encoder_aggregation=strategy, decoder_aggregation=strategy,
                           normalize_before=normalize_before, diversity_weight=0.0, **overrides)
    randomize_layer_norms(model)
    targets = torch.randint(4, 24, (3, 5), generator=torch.Generator().manual_seed(5))
    targets[:, 0] = model.config.decoder_start_token_id
    source = source_of(padded_batch)
    with torch.no_grad():
        memory, expected = reference_deep_logits(model, source, targets)
        out = model(**source, decoder_input_ids=targets)
    torch.testing.assert_close(out.encoder_last_hidden_state, memory, atol=1e-10, rtol=0)
    assert expected.abs().max() > 1.0
    torch.testing.assert_close(out.logits, expected, atol=1e-10, rtol=0)


def test_output_attentions_one_map_per_layer(tiny_backbone, padded_batch):
    model = make_model(tiny_backbone, encoder_aggregation="multi_layer_attention",
                       decoder_aggregation="multi_layer_attention", attn_implementation="eager")
    with torch.no_grad():
        out = model(**padded_batch, output_attentions=True)
    assert len(out.encoder_attentions) == len(out.decoder_attentions) == 4


def test_added_parameters_match_table1():
    """Transformer-Base (d 512, FFN 2048, 6 + 6 layers): the added parameters are Table 1's, which pins AGG's inner
    size (the FFN size) and which layers get multi-layer attention (l > k, the embedding not being a layer)."""
    base = dict(d_model=512, encoder_ffn_dim=2048, decoder_ffn_dim=2048, encoder_layers=6, decoder_layers=6)

    def added(**overrides):
        config = DeepRepresentationsConfig(**base, **overrides)
        total = 0
        for is_decoder in (False, True):
            for module in (DeepRepresentationsModel.build_readout(None, config, is_decoder),
                           DeepRepresentationsModel.build_connection(None, config, is_decoder)):
                total += sum(p.numel() for p in module.parameters()) if module is not None else 0
            for layer_idx in range(6):
                if config.attends_lower_layers(is_decoder, layer_idx):
                    lower_slots = [None] * (config.multi_layer_attention_k - 1)
                    attention = MultiLayerSelfAttention(config, 8, is_decoder, None, lower_slots, 2048)
                    # everything but ATT_1's projections, which the plain layer has too
                    own_projections = ("q_proj.", "k_proj.", "v_proj.", "out_proj.")
                    total += sum(
                        p.numel() for name, p in attention.named_parameters() if not name.startswith(own_projections)
                    )
        return round(total / 1e6, 1)

    assert added(encoder_aggregation="dense", decoder_aggregation="dense") == 0.0
    assert added(encoder_aggregation="iterative", decoder_aggregation="iterative") == 31.5
    assert added(encoder_aggregation="hierarchical", decoder_aggregation="hierarchical") == 23.1
    mla = dict(encoder_aggregation="multi_layer_attention", decoder_aggregation="multi_layer_attention")
    assert added(**mla, multi_layer_attention_k=2) == 33.6
    assert added(**mla, multi_layer_attention_k=3) == 37.8


# ----------------------------------------------------------------------------------------- caching and search
CACHE_CASES = {
    **{s: dict(decoder_aggregation=s) for s in STRATEGIES},
    "multi_layer_attention_k3": dict(decoder_aggregation="multi_layer_attention", multi_layer_attention_k=3),
    "multi_layer_attention_pre_norm": dict(decoder_aggregation="multi_layer_attention", normalize_before=True),
    "hierarchical_pre_norm_top_relu": dict(decoder_aggregation="hierarchical", normalize_before=True,
                                           aggregation_residual="top", aggregation_activation="relu"),
}


@pytest.mark.parametrize("case", sorted(CACHE_CASES))
def test_incremental_decoding_matches_full_forward(case, tiny_backbone, padded_batch):
    model = make_model(tiny_backbone, encoder_aggregation="hierarchical", **CACHE_CASES[case])
    source = source_of(padded_batch)
    decoder_input_ids = torch.randint(4, 24, (3, 6), generator=torch.Generator().manual_seed(5))
    decoder_input_ids[:, 0] = model.config.decoder_start_token_id
    assert_incremental_decoding_matches_full_forward(model, source, decoder_input_ids)
    assert_cached_search_is_uncached_search(model, source, num_beams=4)


def test_generate_greedy_beam_sampling(tiny_backbone, padded_batch):
    """Greedy, beam search and sampling against step-by-step decoding over full forward passes (tests/helpers.py)."""
    model = make_model(tiny_backbone, encoder_aggregation="iterative", decoder_aggregation="multi_layer_attention")
    source = source_of(padded_batch)
    for sequences in assert_generate_matches_references(model, source)[::2]:
        assert (sequences[:, 0] == model.config.decoder_start_token_id).all()


def test_eager_equals_sdpa(tiny_backbone, padded_batch):
    model = make_model(tiny_backbone, encoder_aggregation="multi_layer_attention", decoder_aggregation="hierarchical",
                       attn_implementation="eager")
    with torch.no_grad():
        eager = model(**padded_batch)
        model.set_attn_implementation("sdpa")
        sdpa = model(**padded_batch)
    torch.testing.assert_close(eager.logits, sdpa.logits, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(eager.loss, sdpa.loss, atol=1e-5, rtol=1e-5)


# ----------------------------------------------------------------------------------------- diversity
def test_layer_diversity_hand_computed():
    # 3 layers, d = 2; sentence 1 has 2 real positions (+ 1 pad), sentence 2 one real position (+ 2 pads)
    h1 = torch.tensor([[[1.0, 0], [1, 0], [5, 5]], [[1, 0], [7, 1], [2, 9]]])
    h2 = torch.tensor([[[1.0, 1], [0, 1], [1, 2]], [[2, 0], [3, 3], [4, 1]]])
    h3 = torch.tensor([[[0.0, 1], [0, 2], [3, 1]], [[3, 0], [1, 8], [6, 6]]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    # 1 - cos^2 per position, pairs (1,2) and (2,3): s1p1 0.5 and 0.5, s1p2 1 and 0, s2p1 0 and 0
    # Eq. 10 pooled over the batch's 3 real positions: mean_l mean_n = ((0.5 + 1 + 0) / 3 + (0.5 + 0 + 0) / 3) / 2
    assert layer_diversity([h1, h2, h3], mask).item() == pytest.approx(1 / 3, abs=1e-6)
    # pads do not count: changing them changes nothing
    h1_other_pads = h1.clone()
    h1_other_pads[0, 2] = torch.tensor([-3.0, 4])
    h1_other_pads[1, 1:] = 0.3
    assert layer_diversity([h1_other_pads, h2, h3], mask).item() == pytest.approx(1 / 3, abs=1e-6)
    # opposite directions are linearly dependent: no diversity (why the paper squares the cosine)
    assert layer_diversity([h1, -h1], None).item() == pytest.approx(0.0, abs=1e-6)


def brute_force_diversity(states, mask):
    """Eq. 10 written out position by position, pooled over the batch's real positions."""
    total, count = 0.0, 0
    for b in range(states[0].shape[0]):
        for n in range(states[0].shape[1]):
            if not mask[b, n]:
                continue
            pairs = [1 - (torch.dot(x[b, n], y[b, n]) / (x[b, n].norm() * y[b, n].norm())) ** 2
                     for x, y in zip(states[:-1], states[1:])]
            total, count = total + sum(pairs) / len(pairs), count + 1
    return total / count


def brute_force_spread(states, mask):
    """||X - mean_n(X)|| / ||X|| (Frobenius) over each sentence's real positions, averaged over the sentences."""
    ratios = []
    for b in range(states.shape[0]):
        x = states[b][mask[b].bool()]
        ratios.append(((x - x.mean(0)) ** 2).sum().sqrt() / (x**2).sum().sqrt())
    return sum(ratios) / len(ratios)


def paper_layer_representations(strategy, hidden_states):
    """H^1..H^L as the paper defines them: the layer outputs h^l, except Eq. 4's dense H^l = h^l + sum_{i<l} H^i."""
    outputs = list(hidden_states[1:])
    if strategy != "dense":
        return outputs
    representations = []
    for output in outputs:
        representations.append(output + sum(representations, torch.zeros_like(output)))
    return representations


@pytest.mark.parametrize("strategy", ["hierarchical", "dense", "multi_layer_attention", "iterative"])
def test_diversity_in_model_output_and_loss(strategy, tiny_backbone, padded_batch):
    model = make_model(tiny_backbone, encoder_aggregation=strategy, decoder_aggregation=strategy, diversity_weight=0.7)
    with torch.no_grad():
        out = model(**padded_batch)
        hidden = model(**padded_batch, output_hidden_states=True)
        model.config.diversity_weight = 0.0
        plain_ce = model(**padded_batch)
    assert out.encoder_hidden_states is None and out.decoder_hidden_states is None  # not asked for
    assert plain_ce.layer_diversity is None and plain_ce.memory_spread is None  # evaluation with lambda = 0
    source_mask, target_mask = padded_batch["attention_mask"], padded_batch["labels"].ne(-100)
    encoder_states = paper_layer_representations(strategy, hidden.encoder_hidden_states)
    decoder_states = paper_layer_representations(strategy, hidden.decoder_hidden_states)
    if strategy == "dense":  # the H^L written out here is the stack's top state, the memory
        torch.testing.assert_close(hidden.encoder_last_hidden_state, encoder_states[-1], atol=1e-5, rtol=1e-5)
    encoder = brute_force_diversity(encoder_states, source_mask)
    decoder = brute_force_diversity(decoder_states, target_mask)
    torch.testing.assert_close(out.encoder_layer_diversity, encoder, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.decoder_layer_diversity, decoder, atol=1e-5, rtol=0)
    expected = (encoder + decoder) / 2  # D: the mean of the two stacks' Eq. 10
    assert 0.01 < out.layer_diversity.item() < 1
    torch.testing.assert_close(out.layer_diversity, expected, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.loss, plain_ce.loss - 0.7 * expected, atol=1e-5, rtol=0)  # Eq. 9
    torch.testing.assert_close(
        out.memory_spread, brute_force_spread(hidden.encoder_last_hidden_state, source_mask), atol=1e-5, rtol=0
    )
    if strategy == "dense":  # Eq. 4's sums, not the layer outputs Layer(H^{l-1}) they add up
        layer_outputs = brute_force_diversity(hidden.encoder_hidden_states[1:], source_mask)
        assert abs(out.encoder_layer_diversity - layer_outputs) > 0.05


def test_collapsed_states_have_diversity_one_and_no_spread():
    """The collapse's signature: constant, mutually orthogonal layers give D = 1 and spread 0."""
    basis = torch.eye(4)
    layers = [basis[l].expand(2, 3, 4) for l in range(3)]  # every position of layer l holds e_l
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    assert layer_diversity(layers, mask).item() == pytest.approx(1.0)
    assert position_spread(layers[-1], mask).item() == pytest.approx(0.0, abs=1e-6)
    assert position_spread(torch.randn(2, 3, 4), mask).item() > 0.3


def test_position_spread_zero_for_constant_positions_and_ignores_padding():
    constant = torch.tensor([1.0, 2.0, -1.0]).expand(2, 4, 3).clone()
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    assert position_spread(constant, mask).item() == pytest.approx(0.0, abs=1e-7)
    states = constant.clone()
    states[1, 2:] = 100.0  # padding: must not count
    states[0, 0] = torch.tensor([3.0, 2.0, -1.0])  # sentence 0: one position differs by 2 in dimension 0
    # brute force for sentence 0: mean of dim 0 = 1.5, deviations (1.5, -0.5, -0.5, -0.5)
    expected = (torch.tensor([1.5, -0.5, -0.5, -0.5]).norm() / states[0].norm()).item() / 2  # sentence 1: 0
    assert position_spread(states, mask).item() == pytest.approx(expected, rel=1e-6)


def test_fresh_config_trains_without_the_term_and_logs_it(tiny_backbone, padded_batch):
    """diversity_weight defaults to 0: a fresh model's loss is the cross entropy; training-mode passes still measure
    D and the memory's spread (without gradient), evaluation passes do not."""
    config = DeepRepresentationsConfig(**{**tiny_backbone, "encoder_layers": 4, "decoder_layers": 4})
    assert config.diversity_weight == 0.0
    model = DeepRepresentationsForConditionalGeneration(config)
    with torch.no_grad():
        evaluation = model.eval()(**padded_batch)
    training = model.train()(**padded_batch)
    assert all(getattr(evaluation, key) is None for key in DIVERSITY_DIAGNOSTICS)
    torch.testing.assert_close(training.loss, evaluation.loss)  # no dropout: the same cross entropy
    assert training.encoder_hidden_states is None  # not asked for
    for key in DIVERSITY_DIAGNOSTICS:
        value = getattr(training, key)
        assert value.dim() == 0 and torch.isfinite(value) and not value.requires_grad, key
    # one-layer stacks have no adjacent layers: nothing is measured (Eq. 10 would be empty)
    shallow = DeepRepresentationsForConditionalGeneration(
        DeepRepresentationsConfig(**{**tiny_backbone, "encoder_layers": 1, "decoder_layers": 1}, **OFF)
    ).train()
    assert shallow(**padded_batch).layer_diversity is None


def test_saved_lambda_loads_back_and_a_plain_checkpoint_gets_zero(tiny_backbone, tmp_path):
    """A checkpoint trained with lambda = 1 (the default before 0.0) keeps it: config.json holds every family key.
    A plain Transformer checkpoint loaded as deep representations gets the default 0 unless the recipe sets it."""
    model = make_model(tiny_backbone, diversity_weight=1.0)
    model.save_pretrained(tmp_path / "deep")
    assert json.loads((tmp_path / "deep" / "config.json").read_text())["diversity_weight"] == 1.0
    assert AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "deep").config.diversity_weight == 1.0
    plain = PlainTransformerForConditionalGeneration(PlainTransformerConfig(**tiny_backbone))
    plain.save_pretrained(tmp_path / "plain")
    assert DeepRepresentationsForConditionalGeneration.from_pretrained(tmp_path / "plain").config.diversity_weight == 0


def test_optimiser_step_on_diversity_raises_it(tiny_backbone, padded_batch):
    model = make_model(tiny_backbone, diversity_weight=1.0).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    before = model(**padded_batch).layer_diversity
    (-before).backward()
    optimizer.step()
    with torch.no_grad():
        after = model(**padded_batch).layer_diversity
    assert after > before + 1e-4, (before.item(), after.item())


def test_diversity_needs_encoder_layers(tiny_backbone, padded_batch):
    model = make_model(tiny_backbone, diversity_weight=1.0)
    with torch.no_grad():
        encoder_outputs = model.get_encoder()(input_ids=padded_batch["input_ids"],
                                              attention_mask=padded_batch["attention_mask"])
        with pytest.raises(ValueError, match="encoder's layer outputs"):
            model(encoder_outputs=encoder_outputs, attention_mask=padded_batch["attention_mask"],
                  labels=padded_batch["labels"])


@pytest.mark.parametrize("use_reentrant", [True, False])
def test_gradient_checkpointing_same_gradients(use_reentrant, tiny_backbone, padded_batch):
    """Multi-layer attention, the hierarchical feedback and the diversity term under the family contract's
    checkpointing check (tests/helpers.py); the diversity term reaches the layers' weights with checkpointing too."""
    model = make_model(tiny_backbone, encoder_aggregation="multi_layer_attention",
                       decoder_aggregation="hierarchical", diversity_weight=1.0)
    with_diversity = assert_gradient_checkpointing_same_gradients(model, padded_batch, use_reentrant, 1e-5, 1e-4)
    model.config.diversity_weight = 0.0  # Eq. 9 is part of the loss: without it the layers' gradients change
    model.zero_grad(set_to_none=True)
    model(**padded_batch).loss.backward()
    name = "model.encoder.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(model.get_parameter(name).grad, with_diversity[name])


# ----------------------------------------------------------------------------------------- HF plumbing
def test_auto_classes_and_save_load(tiny_backbone, padded_batch, tmp_path):
    """A config built by name with a readout and a multi-layer attention, through the family contract's round trip
    (tests/helpers.py)."""
    config = AutoConfig.for_model("deep_representations", **{**tiny_backbone, "decoder_layers": 3},
                                  encoder_aggregation="linear", decoder_aggregation="multi_layer_attention")
    assert type(config) is DeepRepresentationsConfig
    assert type(AutoModel.from_config(config)) is DeepRepresentationsModel
    model = AutoModelForSeq2SeqLM.from_config(config).eval()
    assert type(model) is DeepRepresentationsForConditionalGeneration
    randomize_fusion(model)
    loaded = assert_save_load_round_trip(model, padded_batch, tmp_path)
    assert loaded.config.to_dict()["decoder_aggregation"] == "multi_layer_attention"


def test_paper_recipe_fine_tunes_a_trained_plain_checkpoint(tiny_backbone, padded_batch, tmp_path):
    """Sec. 4.1: the models start from a trained Transformer. A plain checkpoint loads with the aggregation and the
    diversity term switched on by keyword: every backbone weight is the checkpoint's, the AGG nodes start fresh."""
    plain = PlainTransformerForConditionalGeneration(PlainTransformerConfig(**tiny_backbone, init_std=0.3))
    plain.save_pretrained(tmp_path)
    model = DeepRepresentationsForConditionalGeneration.from_pretrained(
        tmp_path, encoder_aggregation="hierarchical", decoder_aggregation="hierarchical", diversity_weight=1.0
    )
    assert model.config.model_type == "deep_representations" and model.config.diversity_weight == 1.0
    fresh = {name for name in model.state_dict() if ".connection." in name}
    assert fresh and all(".nodes.0." in name for name in fresh)  # 2 layers per stack: one node Ĥ^1 = AGG(H^1, H^2)
    for name, value in plain.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    assert torch.equal(model.model.encoder.connection.nodes[0].layer_norm.weight, torch.ones(16))
    out = model.train()(**padded_batch)
    assert out.layer_diversity is not None and torch.isfinite(out.loss)


def test_a_checkpoint_saved_without_aggregation_loads_with_it_switched_on(tiny_backbone, tmp_path):
    """Issue 73: the recipe from a deep-representations checkpoint saved with aggregation "none" (refused before: it
    "needs tensors it lacks"). It loads as a plain checkpoint of the same weights does: every weight the checkpoint's,
    the same AGG tensors fresh, each named in transformers' load report."""
    saved = DeepRepresentationsForConditionalGeneration(DeepRepresentationsConfig(**tiny_backbone, init_std=0.3, **OFF))
    saved.save_pretrained(tmp_path / "deep")
    plain = PlainTransformerForConditionalGeneration(PlainTransformerConfig(**tiny_backbone))
    plain.load_state_dict(saved.state_dict())
    plain.save_pretrained(tmp_path / "plain")
    switched_on = dict(encoder_aggregation="hierarchical", decoder_aggregation="hierarchical")
    with CaptureLogger(modeling_utils.logger) as report:
        model = DeepRepresentationsForConditionalGeneration.from_pretrained(tmp_path / "deep", **switched_on)
    reference = DeepRepresentationsForConditionalGeneration.from_pretrained(tmp_path / "plain", **switched_on)
    fresh = set(model.state_dict()) - set(saved.state_dict())
    assert fresh and fresh == set(reference.state_dict()) - set(plain.state_dict())
    assert all(name in report.out for name in fresh), report.out
    for name, value in saved.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name


BAD_CONFIGS = [
    (dict(encoder_aggregation="stacked"), "'stacked'"),
    (dict(decoder_aggregation="hierarchical", decoder_layers=3), "`decoder_layers` is 3"),
    (dict(encoder_aggregation="multi_layer_attention", multi_layer_attention_k=4), "got 4"),
    (dict(decoder_aggregation="multi_layer_attention", multi_layer_attention_k=1), "got 1"),
    (dict(aggregation_activation="tanh"), "'tanh'"),
    (dict(aggregation_residual="bottom"), "'bottom'"),
    (dict(diversity_weight=-0.5), "-0.5"),
    (dict(diversity_weight=1.0, encoder_layers=1, encoder_aggregation="none"), "encoder_layers=1"),
]


@pytest.mark.parametrize("overrides, message", BAD_CONFIGS)
def test_bad_config_raises(overrides, message, tiny_backbone):
    with pytest.raises(ValueError, match=message.replace("`", ".").replace("(", r"\(")):
        DeepRepresentationsConfig(**{**tiny_backbone, "encoder_layers": 4, **overrides})


def one_step_trainer(model, padded_batch, output_dir):
    from datasets import Dataset

    rows = [{key: value[i].tolist() for key, value in padded_batch.items()} for i in range(3)]
    args = Seq2SeqTrainingArguments(output_dir=str(output_dir), max_steps=1, per_device_train_batch_size=3,
                                    logging_steps=1, report_to="none", use_cpu=True, save_strategy="no",
                                    learning_rate=1e-3)
    return LayerFusionSeq2SeqTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows),
                                     data_collator=lambda features: {k: torch.tensor([f[k] for f in features])
                                                                     for k in features[0]})


@pytest.mark.parametrize("diversity_weight", [1.0, 0.0])
def test_trainer_step_logs_each_stacks_diversity_and_the_memory_spread(diversity_weight, tiny_backbone,
                                                                       padded_batch, tmp_path):
    model = make_model(tiny_backbone, encoder_aggregation="dense", diversity_weight=diversity_weight).train()
    trainer = one_step_trainer(model, padded_batch, tmp_path)
    with torch.no_grad():
        hidden = model(**padded_batch, output_hidden_states=True)
    encoder = brute_force_diversity(paper_layer_representations("dense", hidden.encoder_hidden_states),
                                    padded_batch["attention_mask"])
    decoder = brute_force_diversity(paper_layer_representations("hierarchical", hidden.decoder_hidden_states),
                                    padded_batch["labels"].ne(-100))
    expected = {
        "encoder_layer_diversity": encoder, "decoder_layer_diversity": decoder,
        "layer_diversity": (encoder + decoder) / 2,
        "memory_spread": brute_force_spread(hidden.encoder_last_hidden_state, padded_batch["attention_mask"]),
    }
    trainer.train()
    (logged,) = [log for log in trainer.state.log_history if "loss" in log and "train_runtime" not in log]
    for key, value in expected.items():
        assert logged[key] == pytest.approx(float(value), abs=1e-5), key


def test_trainer_warns_when_the_memory_collapses(tiny_backbone, padded_batch, tmp_path, caplog):
    """A memory that is the same vector at every source position (here: the top hierarchical node's LayerNorm with
    gain 0) is logged with spread 0 and warned about."""
    model = make_model(tiny_backbone, diversity_weight=1.0).train()
    top_node = model.model.encoder.connection.nodes[-1]
    with torch.no_grad():
        top_node.layer_norm.weight.zero_()
        top_node.layer_norm.bias.fill_(0.5)
    trainer = one_step_trainer(model, padded_batch, tmp_path)
    with caplog.at_level("WARNING", logger="hf_layerfusion.training.trainer"):
        trainer.train()
    (logged,) = [log for log in trainer.state.log_history if "memory_spread" in log]
    assert logged["memory_spread"] == pytest.approx(0.0, abs=1e-6)
    assert "memory_spread 0.000 at step 1" in caplog.text and "fine-tune a trained model" in caplog.text


def test_trainer_step_is_the_hand_computed_sgd_step(tiny_backbone, padded_batch, tmp_path):
    """One Trainer step is the SGD step computed by hand from the model's loss (CE - lambda D, Eq. 9), and the
    logged layer diversity is D of the step's batch."""
    model = make_model(tiny_backbone, diversity_weight=1.0).train()
    rows = [{key: value[i].tolist() for key, value in padded_batch.items()} for i in range(3)]
    with torch.no_grad():
        expected = model(**padded_batch).layer_diversity.item()
    trainer, _ = assert_trainer_step_is_hand_computed(
        model, rows, tmp_path, collate=lambda features: {k: torch.tensor([f[k] for f in features]) for k in features[0]}
    )
    logged = [log for log in trainer.state.log_history if "layer_diversity" in log]
    assert len(logged) == 1 and logged[0]["layer_diversity"] == pytest.approx(expected, abs=1e-5)


def test_a_step_of_accumulated_micro_batches_is_the_step_of_the_whole_batch(tiny_backbone, tmp_path):
    """Gradient accumulation (2 micro-batches of 2 copy-task rows) takes the SGD step of the whole batch of 4: the
    diversity term (a mean over the batch) counts by each micro-batch's share of the step's target tokens, as the
    cross entropy does. Before, the Trainer (which no longer divides the loss by the accumulation steps of a model that
    takes `num_items_in_batch`) added it once per micro-batch: lambda was k times larger under k accumulation steps.
    The copy task's sources are its targets, so the encoder's term is exact too."""
    model = make_model(tiny_backbone, diversity_weight=0.5).train()
    assert_trainer_step_is_hand_computed(
        model, copy_task_rows(tiny_backbone["vocab_size"], count=4), tmp_path, accumulation_steps=2
    )
