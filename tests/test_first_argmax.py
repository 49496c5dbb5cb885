"""Greedy search's choice through the compiled `first_argmax` (kernels/first_argmax.cpp) against torch's `argmax`,
the function `generate()` calls: the first maximal index, the first NaN of a row that has one."""

import pytest
import torch

from hf_layerfusion.inference import search


@pytest.mark.parametrize("vocab", [1, 5, 16, 17, 100, 8000])
def test_kernel_is_argmax(kernels, vocab):
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
