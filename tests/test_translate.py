"""`hf_layerfusion.translate()` against `generate()` itself: hypotheses land on their own sentence, and the model's
training mode is left as it was (issue 40)."""

from __future__ import annotations

import pytest
import torch

import hf_layerfusion
from helpers import SOURCES, tiny_model, tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "generate"])
def test_num_return_sequences_gives_each_sentence_its_own_hypotheses(tokenizer, fast):
    """`generate()` returns the n hypotheses of each sentence one after the other; `translate()` returns them as one
    list per sentence, in input order, whatever its length-sorted batches were (batch_size=3 splits the 4 sources)."""
    model = tiny_model("gtrans")
    settings = dict(num_beams=4, num_return_sequences=2, max_new_tokens=6)
    with torch.no_grad():
        outputs = model.generate(**tokenizer(SOURCES, padding=True, return_tensors="pt"), **settings)
    texts = [text.strip() for text in tokenizer.batch_decode(outputs, skip_special_tokens=True)]
    expected = [texts[2 * i : 2 * i + 2] for i in range(len(SOURCES))]
    assert len(set(map(tuple, expected))) > 1  # the sentences' hypotheses differ: a shuffle would show
    assert hf_layerfusion.translate(model, tokenizer, SOURCES, batch_size=3, fast=fast, **settings) == expected
    single = hf_layerfusion.translate(model, tokenizer, SOURCES, batch_size=3, fast=fast, num_beams=4, max_new_tokens=6)
    assert single == [hypotheses[0] for hypotheses in expected]  # one hypothesis: one string per sentence


@pytest.mark.parametrize("training", [True, False])
def test_translate_leaves_the_training_mode_as_it_was(tokenizer, training):
    model = tiny_model("plain_transformer").train(training)
    hf_layerfusion.translate(model, tokenizer, SOURCES[:2], max_new_tokens=2)
    assert model.training is training
    assert all(module.training is training for module in model.modules())
