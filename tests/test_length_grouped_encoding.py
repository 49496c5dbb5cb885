"""The fast path's encoder in groups of similar length (`hf_layerfusion.inference.encoding`): the grouping against a
brute-force search over every partition, each sentence's output against the encoder run on the whole batch, and
`fast_generate` running it."""

import itertools
import random

import pytest
import torch
from helpers import tiny_model, tiny_sources

import hf_layerfusion
from hf_layerfusion.inference import encoding, fast_generate
from hf_layerfusion.inference.encoding import encode_by_length, length_groups, right_padded_lengths
from hf_layerfusion.inference.fast_generation import encodes_by_length

FAMILIES = sorted(hf_layerfusion.FAMILIES)


def partitions(items: list):
    """Every partition of `items` into non-empty groups."""
    if not items:
        yield []
        return
    first, rest = items[0], items[1:]
    for partition in partitions(rest):
        yield [[first], *partition]
        for index in range(len(partition)):
            yield [*partition[:index], [first, *partition[index]], *partition[index + 1 :]]


def grouping_cost(lengths, groups, call_cost) -> int:
    return sum(len(group) * max(lengths[row] for row in group) + call_cost for group in groups)


def test_length_groups_is_the_cheapest_partition_of_the_rows():
    generator = random.Random(0)
    for case in range(60):
        lengths = [generator.randint(1, 12) for _ in range(generator.randint(1, 7))]
        call_cost = generator.choice([0, 1, 4, 16, 100])
        groups = length_groups(lengths, call_cost)
        assert sorted(itertools.chain(*groups)) == list(range(len(lengths))), (lengths, groups)
        assert all(group == sorted(group) for group in groups)
        best = min(grouping_cost(lengths, partition, call_cost) for partition in partitions(list(range(len(lengths)))))
        assert grouping_cost(lengths, groups, call_cost) == best, (lengths, call_cost, groups)
    assert length_groups([3, 3, 3], 0) == [[0, 1, 2]]  # equal lengths: one group, whatever a call costs
    assert length_groups([2, 40, 2, 40], 16) == [[0, 2], [1, 3]]
    assert length_groups([2, 40, 2, 40], 200) == [[0, 1, 2, 3]]


def test_only_right_padded_batches_with_a_token_in_every_row_are_grouped():
    assert right_padded_lengths(torch.tensor([[1, 1, 0], [1, 1, 1]])) == [2, 3]
    assert right_padded_lengths(torch.tensor([[0, 1, 1], [1, 1, 1]])) is None  # left padding
    assert right_padded_lengths(torch.tensor([[1, 0, 1], [1, 1, 1]])) is None  # a hole
    assert right_padded_lengths(torch.tensor([[0, 0, 0], [1, 1, 1]])) is None  # an empty row
    assert right_padded_lengths(torch.ones(2, 0, dtype=torch.long)) is None


@pytest.mark.parametrize("model_type", FAMILIES)
def test_each_sentence_gets_the_encoder_output_of_the_whole_batch(model_type, monkeypatch):
    monkeypatch.setattr(encoding, "CALL_COST_POSITIONS", 0)  # every length its own group: 2, 3, 7, 9
    source = tiny_sources()
    model = tiny_model(model_type)
    encoder = model.get_encoder()
    calls = []
    encoder.register_forward_hook(lambda module, args, kwargs: calls.append(1))
    with torch.no_grad():
        expected = encoder(**source, return_dict=True)
        calls.clear()
        grouped = encode_by_length(encoder, source["input_ids"], source["attention_mask"])
    assert len(calls) == 4
    real = source["attention_mask"].bool()
    fields = ["last_hidden_state"] + (["layer_memories"] if expected.get("layer_memories") is not None else [])
    for field in fields:
        wanted, got = expected[field], grouped[field]
        assert got.shape == wanted.shape
        if field == "layer_memories":  # (batch, layers, source, d) -> (batch, source, layers, d)
            wanted, got = wanted.transpose(1, 2), got.transpose(1, 2)
        torch.testing.assert_close(got[real], wanted[real], rtol=1e-5, atol=1e-5)
        assert torch.equal(got[~real], torch.zeros_like(got[~real]))  # padding: zeros, masked by the decoder
    assert set(grouped.keys()) == set(fields)


def test_batches_one_group_covers_best_are_encoded_as_they_are():
    source = tiny_sources()  # lengths 9, 7, 3, 9, 2: one group costs less than two encoder calls
    encoder = tiny_model("gtrans").get_encoder()
    with torch.no_grad():
        expected = encoder(**source, return_dict=True)
        actual = encode_by_length(encoder, source["input_ids"], source["attention_mask"])
    assert torch.equal(actual.last_hidden_state, expected.last_hidden_state)


def test_fast_generate_encodes_by_length_and_keeps_the_tokens_of_generate(monkeypatch):
    monkeypatch.setattr(encoding, "CALL_COST_POSITIONS", 0)
    source = tiny_sources()
    model = tiny_model("layerwise_coordination")  # per-layer memories: both fields regrouped
    grouped = []
    real_encode = encoding.encode_by_length
    monkeypatch.setattr("hf_layerfusion.inference.fast_generation.encode_by_length",
                        lambda *args: grouped.append(1) or real_encode(*args))
    for num_beams in (1, 3):
        with torch.no_grad():
            expected = model.generate(**source, num_beams=num_beams, max_new_tokens=8)
        actual = fast_generate(model, **source, num_beams=num_beams, max_new_tokens=8, fallback=False)
        assert torch.equal(actual, expected)
    assert len(grouped) == 2


def test_the_batch_is_encoded_by_generate_where_the_groups_would_lose_something():
    source = tiny_sources()
    model = tiny_model("plain_transformer")
    assert encodes_by_length(model, dict(source))
    assert encodes_by_length(model, {"inputs": source["input_ids"], "attention_mask": source["attention_mask"]})
    assert not encodes_by_length(model, {"input_ids": source["input_ids"]})  # no mask
    assert not encodes_by_length(model, {**source, "output_attentions": True})
    assert not encodes_by_length(model, {**source, "return_dict_in_generate": True, "output_hidden_states": True})
    assert not encodes_by_length(model, {**source, "decoder_input_ids": source["input_ids"][:, :1]})
    config = model.generation_config.__class__(**model.generation_config.to_dict())
    config.output_hidden_states = True
    assert not encodes_by_length(model, {**source, "generation_config": config})
