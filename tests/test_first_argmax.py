"""Greedy search's choice through the compiled `first_argmax` (kernels/first_argmax.cpp) against torch's `argmax`,
the function `generate()` calls: the first maximal index, the first NaN of a row that has one; and the rest of a
greedy step (`greedy_choice`) against `generate()`'s `_sample` written out."""

import pytest
import torch

from hf_layerfusion.inference import search


@pytest.mark.parametrize("vocab", [1, 5, 16, 17, 100, 8000])
def test_kernel_is_argmax(kernels, instruction_set, vocab):
    generator = torch.Generator().manual_seed(vocab)
    scores = torch.randn(40, vocab, generator=generator)
    # ties: a few values drawn from four levels, so that the maximum recurs in several lanes and in the tail
    scores[:8] = torch.randint(0, 4, (8, vocab), generator=generator).float()
    scores[8] = -float("inf")  # a row of -inf: index 0
    scores[9, vocab // 2:] = float("inf")
    scores[10, (vocab - 1) // 3] = float("nan")
    scores[11, vocab - 1] = float("nan")
    scores[12] = float("nan")
    scores[13] = torch.where(torch.rand(vocab, generator=generator) < 0.5, -0.0, 0.0)  # -0.0 == 0.0: the first
    scores[14] = -float("inf")
    scores[14, vocab - 1] = -1e30
    expected = scores.argmax(dim=-1)
    assert torch.equal(kernels.first_argmax(scores), expected)
    assert torch.equal(search.first_argmax(scores), expected)
    wide = torch.randn(40, vocab + 7, generator=generator)  # rows further apart than their length
    assert torch.equal(kernels.first_argmax(wide[:, 3:vocab + 3]), wide[:, 3:vocab + 3].argmax(dim=-1))


def test_other_scores_go_to_torch(kernels, monkeypatch):
    """Scores the kernel does not take (not float32, not 2-D, strided columns, no kernels) get torch's `max` index."""
    scores = torch.randn(3, 50)
    for other in (scores.double(), scores[None], scores.t().contiguous().t(), scores[:, ::2]):
        assert torch.equal(search.first_argmax(other), other.argmax(dim=-1))
    monkeypatch.setattr(search, "compiled_kernels", lambda: None)
    assert torch.equal(search.first_argmax(scores), scores.argmax(dim=-1))


def test_kernel_names_bad_inputs(kernels):
    with pytest.raises(RuntimeError, match=r"float32 CPU \(rows, vocab\) with vocab > 0 contiguous, got Double"):
        kernels.first_argmax(torch.zeros(2, 3, dtype=torch.float64))
    with pytest.raises(RuntimeError, match=r"got Float \[2, 0\]"):
        kernels.first_argmax(torch.zeros(2, 0))
    with pytest.raises(RuntimeError, match=r"got Float \[3, 2\]"):
        kernels.first_argmax(torch.zeros(2, 3).t())


def generate_step(scores, finished, sequences, rows, position, pad, eos):
    """A greedy step as `GenerationMixin._sample` writes it (argmax, `next * unfinished + pad * (1 - unfinished)`,
    the end-token criterion on the new token), on copies: (tokens, finished, sequences)."""
    tokens = scores.argmax(dim=-1)
    finished, sequences = finished.clone(), sequences.clone()
    if eos is not None:
        unfinished = (~finished).long()
        tokens = tokens * unfinished + pad * (1 - unfinished)
        finished |= torch.isin(tokens, eos)
    sequences[torch.arange(len(tokens)) if rows is None else rows, position] = tokens
    return tokens, finished, sequences


@pytest.mark.parametrize("eos", [None, [2], [2, 5, 7]], ids=["no eos", "one eos", "three eos"])
@pytest.mark.parametrize("layout", ["all rows", "rows kept", "strided sequences"])
def test_greedy_choice_is_a_step_of_generate(kernels, instruction_set, monkeypatch, eos, layout):
    """`search.greedy_choice` (the compiled `greedy_choice`, and the torch operations it falls back to) against a
    greedy step of `generate()`: the tokens, the padding of finished rows, the finished rows, the sequences."""
    generator = torch.Generator().manual_seed(len(eos or []))
    batch, vocab, pad = 9, 40, 1
    eos_tensor = None if eos is None else torch.tensor(eos)
    rows = {"all rows": None, "rows kept": torch.tensor([7, 0, 3, 5, 8]), "strided sequences": None}[layout]
    count = batch if rows is None else len(rows)
    scores = torch.randn(count, vocab, generator=generator)
    scores[0, 2] = scores[1, 7 if eos and 7 in eos else 2] = 100.0  # rows that choose an end token
    finished = torch.zeros(count, dtype=torch.bool)
    finished[[2, count - 1]] = True
    sequences = torch.randint(0, vocab, (batch, 12), generator=generator)
    if layout == "strided sequences":
        sequences = sequences.t().contiguous().t()
    expected = generate_step(scores, finished, sequences, rows, 6, pad, eos_tensor)
    for compiled in (True, False):
        if not compiled:
            monkeypatch.setattr(search, "compiled_kernels", lambda: None)
        got_finished, got_sequences = finished.clone(), sequences.clone()
        tokens, done = search.greedy_choice(scores, got_finished, got_sequences, rows, 6, pad, eos_tensor)
        assert torch.equal(tokens, expected[0]) and torch.equal(got_finished, expected[1]), (compiled, tokens)
        assert torch.equal(got_sequences, expected[2]) and done == int(expected[1].sum()), compiled
    if eos is not None:
        assert expected[0][2] == pad and expected[1][0]  # a finished row got padding; a row chose an end token


def test_greedy_choice_names_bad_inputs(kernels):
    scores, finished = torch.zeros(3, 5), torch.zeros(3, dtype=torch.bool)
    sequences = torch.zeros(4, 6, dtype=torch.int64)
    rows = torch.tensor([0, 1, 3])
    with pytest.raises(RuntimeError, match=r"rows\[2\] = 4 is outside the 4 rows"):
        kernels.greedy_choice(scores, finished, sequences, torch.tensor([0, 1, 4]), 1, 0, None)
    with pytest.raises(RuntimeError, match=r"3 rows of scores need 3 rows of sequences without `rows`, got 4"):
        kernels.greedy_choice(scores, finished, sequences, None, 1, 0, None)
    with pytest.raises(RuntimeError, match="position 6 inside width"):
        kernels.greedy_choice(scores, finished, sequences, rows, 6, 0, None)
    with pytest.raises(RuntimeError, match=r"finished must be a contiguous bool CPU tensor \(3,\), got Long"):
        kernels.greedy_choice(scores, finished.long(), sequences, rows, 1, 0, None)
    with pytest.raises(RuntimeError, match="eos_tokens need a pad_token"):
        kernels.greedy_choice(scores, finished, sequences, rows, 1, None, torch.tensor([2]))
    with pytest.raises(RuntimeError, match=r"eos_tokens must be a contiguous int64 CPU tensor \(n,\), got Int"):
        kernels.greedy_choice(scores, finished, sequences, rows, 1, 0, torch.tensor([2], dtype=torch.int32))
