"""`hf_layerfusion.translate()` against `generate()` itself: hypotheses land on their own sentence, and the model's
training mode is left as it was (issue 40)."""

from __future__ import annotations

import pytest
import torch

import hf_layerfusion
from helpers import SOURCES, tiny_model, tiny_tokenizer, varied_gtrans


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


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "generate"])
def test_a_left_padding_tokenizer_gives_each_sentence_its_own_translation(fast):
    """Fault round: with a tokenizer that pads on the left, a sentence's translation depended on the longer sentences
    sorted into its batch (left padding shifts a source's positions, as in Marian). translate() pads on the right
    whatever the tokenizer's side: batched and one by one agree, and equal the right-padding tokenizer's."""
    left = tiny_tokenizer()
    left.padding_side = "left"
    model = tiny_model("gtrans")
    settings = dict(num_beams=2, max_new_tokens=6, fast=fast)
    batched = hf_layerfusion.translate(model, left, SOURCES, batch_size=len(SOURCES), **settings)
    assert batched == [hf_layerfusion.translate(model, left, [source], **settings)[0] for source in SOURCES]
    assert batched == hf_layerfusion.translate(model, tiny_tokenizer(), SOURCES, batch_size=len(SOURCES), **settings)
    assert left.padding_side == "left"  # the caller's tokenizer is left as it was


def test_stop_strings_stop_fast_generate_and_translate_as_they_stop_generate():
    """Fault round: `stop_strings` failed in `fast_generate` and `translate()` ("could not locate a tokenizer"), since
    transformers' `custom_generate` hook does not pass the tokenizer on. The fast path now runs `generate()` for
    them, and `translate()` hands `generate()` its tokenizer.

    The stop string is the first word of a greedy translation of two words or more, so that greedy search must stop
    there: the check that the string took effect holds for any weights. (A beam search may still prefer a beam
    that never met the string, so beams are compared with generate() only.)"""
    model, tokenizer, sources = varied_gtrans()
    batch = tokenizer(sources, padding=True, return_tensors="pt")
    greedy = hf_layerfusion.translate(model, tokenizer, sources, fast=False, num_beams=1, max_new_tokens=10)
    stop = next(text for text in greedy if len(text.split()) > 1).split()[0]
    for num_beams in (1, 2):
        settings = dict(num_beams=num_beams, max_new_tokens=10)
        with torch.no_grad():
            expected = model.generate(**batch, stop_strings=[stop], tokenizer=tokenizer, **settings)
        assert torch.equal(hf_layerfusion.fast_generate(model, **batch, stop_strings=[stop], tokenizer=tokenizer,
                                                        **settings), expected)
        texts = [text.strip() for text in tokenizer.batch_decode(expected, skip_special_tokens=True)]
        if num_beams == 1:
            assert texts != greedy  # the stop string stopped a translation
        for fast in (True, False):
            assert hf_layerfusion.translate(model, tokenizer, sources, batch_size=len(sources), fast=fast,
                                            stop_strings=[stop], **settings) == texts


def test_max_new_tokens_beyond_the_position_table_is_refused_before_translating(tokenizer):
    """Fault round: a max_new_tokens the decoder's position table cannot hold failed only where a translation ran
    that long (the whole batch lost, the message naming max_length), or gave what stopped earlier. Refused up front
    by name; the table's own size decodes (the decoder reads the start token and all but the last new token)."""
    model = tiny_model("plain_transformer")
    positions = model.config.max_position_embeddings
    with pytest.raises(ValueError, match=rf"max_new_tokens={positions + 1} exceeds .*max_position_embeddings="
                                         rf"{positions}.*at most {positions}"):
        hf_layerfusion.translate(model, tokenizer, SOURCES, max_new_tokens=positions + 1)
    full = hf_layerfusion.translate(model, tokenizer, SOURCES, max_new_tokens=positions, min_new_tokens=positions,
                                    num_beams=1)
    assert len(full) == len(SOURCES)


def test_a_multilingual_model_translates_into_the_target_language_it_is_given():
    """Fault round: `translate()` with a multilingual model (its tokenizer holds `<2xx>` tags) and untagged sentences
    answered in whichever language the model drifted to. `tgt_lang` prepends the tag (as `translate_to` and the
    pipeline do); without it every sentence must carry its own tag, and the first that does not is named."""
    tokenizer, model = tiny_tokenizer(language_tags=True), tiny_model("gtrans")
    settings = dict(num_beams=2, max_new_tokens=6)
    into_german = hf_layerfusion.translate(model, tokenizer, SOURCES, tgt_lang="de", **settings)
    assert into_german == hf_layerfusion.translate(model, tokenizer, [f"<2de> {s}" for s in SOURCES], **settings)
    assert into_german != hf_layerfusion.translate(model, tokenizer, SOURCES, tgt_lang="en", **settings)
    with pytest.raises(ValueError, match=r"Sentence 1 \('abba baab ab'\) has no target-language tag.*tgt_lang="):
        hf_layerfusion.translate(model, tokenizer, ["<2en> ab", SOURCES[1]], **settings)
    with pytest.raises(ValueError, match=r"no <2fr> token \(its target languages: de, en\)"):
        hf_layerfusion.translate(model, tokenizer, SOURCES, tgt_lang="fr", **settings)
    # a one-direction model's tokenizer has no tags: nothing to choose, and tgt_lang names a tag it lacks
    with pytest.raises(ValueError, match=r"no <2de> token \(its target languages: none\)"):
        hf_layerfusion.translate(model, tiny_tokenizer(), SOURCES, tgt_lang="de", **settings)
