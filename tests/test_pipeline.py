"""The translation pipeline registered by `import hf_layerfusion`, for every family, against direct `generate()` calls
on the same padded batch (the Hub-code pipeline is compared in tests/test_hub.py)."""

import logging

import pytest
import torch
from helpers import GENERATION, SOURCES, tiny_model, tiny_tokenizer
from transformers import pipeline

import hf_layerfusion


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def generate_texts(model, tokenizer, sources, **kwargs) -> list[str]:
    batch = tokenizer(sources, padding=True, return_tensors="pt")
    with torch.no_grad():
        output = model.generate(**batch, **kwargs)
    return [text.strip() for text in tokenizer.batch_decode(output, skip_special_tokens=True)]


@pytest.mark.parametrize("model_type", sorted(hf_layerfusion.FAMILIES))
def test_pipeline_is_batched_generate_with_kwargs_passed_through(model_type, tokenizer):
    model = tiny_model(model_type)
    translator = pipeline(hf_layerfusion.PIPELINE_TASK, model=model, tokenizer=tokenizer)
    assert isinstance(translator, hf_layerfusion.LayerFusionTranslationPipeline)
    # one batch of all sources: the same padding as the direct call
    records = translator(SOURCES, batch_size=len(SOURCES), **GENERATION)
    assert [r["translation_text"] for r in records] == generate_texts(model, tokenizer, SOURCES, **GENERATION)
    assert translator(SOURCES[0], **GENERATION) == [{"translation_text": records[0]["translation_text"]}]
    # generation keywords reach generate(): two returned sequences per input
    pairs = translator(SOURCES, batch_size=len(SOURCES), num_return_sequences=2, **GENERATION)
    expected = generate_texts(model, tokenizer, SOURCES, num_return_sequences=2, **GENERATION)
    assert [[r["translation_text"] for r in records] for records in pairs] == [expected[i : i + 2] for i in range(0, 8, 2)]
    groups = model.config.num_decoder_groups
    if groups > 1:
        top = translator(SOURCES, batch_size=len(SOURCES), decoder_groups=[groups], **GENERATION)
        assert [r["translation_text"] for r in top] == generate_texts(
            model, tokenizer, SOURCES, decoder_groups=[groups], **GENERATION
        )


def test_target_language_tag_is_prepended():
    tokenizer = tiny_tokenizer(language_tags=True)
    model = tiny_model("gtrans")
    translator = pipeline(hf_layerfusion.PIPELINE_TASK, model=model, tokenizer=tokenizer)
    tagged = translator(SOURCES, batch_size=len(SOURCES), src_lang="en", tgt_lang="de", **GENERATION)
    expected = generate_texts(model, tokenizer, [f"<2de> {s}" for s in SOURCES], **GENERATION)
    assert [r["translation_text"] for r in tagged] == expected
    assert expected != generate_texts(model, tokenizer, [f"<2en> {s}" for s in SOURCES], **GENERATION)
    # sources that carry their own tags need no tgt_lang
    own_tags = translator([f"<2de> {s}" for s in SOURCES], batch_size=len(SOURCES), **GENERATION)
    assert [r["translation_text"] for r in own_tags] == expected
    with pytest.raises(ValueError, match="<2fr>"):
        translator(SOURCES, tgt_lang="fr")
    with pytest.raises(ValueError, match="Invalid language code"):
        translator(SOURCES, src_lang="e n", tgt_lang="de")


def test_a_multilingual_model_without_a_target_language_is_refused():
    """Fault round: a multilingual model's pipeline called without `tgt_lang` translated untagged sources, an answer
    in whichever language the model drifted to; one untagged input among tagged ones is named."""
    translator = pipeline(hf_layerfusion.PIPELINE_TASK, model=tiny_model("gtrans"), tokenizer=tiny_tokenizer(True))
    with pytest.raises(ValueError, match=r"Sentence 0 \('ab ba'\) has no target-language tag.*tgt_lang= \(one of de"):
        translator(SOURCES[0], **GENERATION)
    with pytest.raises(ValueError, match="'b'"):
        translator(["<2de> ab ba", "<2en> abba", "b"], **GENERATION)


def test_bad_inputs_and_the_removed_task_name(tokenizer):
    model = tiny_model("plain_transformer")
    translator = pipeline(hf_layerfusion.PIPELINE_TASK, model=model, tokenizer=tokenizer)
    with pytest.raises(TypeError, match="string or a list of strings"):
        translator([SOURCES[0], 3])
    with pytest.raises(ValueError, match="max_source_length"):
        translator(SOURCES, max_source_length=0)
    # why the package's task has its own name: transformers 5 refuses "translation" before the registry
    with pytest.raises(KeyError, match="has been removed"):
        pipeline("translation", model=model, tokenizer=tokenizer)


def test_a_left_padding_tokenizer_gives_each_input_its_own_translation():
    """Fault round: `Pipeline` pads a batch on the tokenizer's side, and a left-padded source's positions shift (as
    in Marian): batched inputs translated otherwise than one by one. The pipeline moves the padding after each row's
    tokens (`padding_last`): batched, one by one and the right-padding tokenizer's translations agree."""
    left = tiny_tokenizer()
    left.padding_side = "left"
    model = tiny_model("gtrans")
    translator = pipeline(hf_layerfusion.PIPELINE_TASK, model=model, tokenizer=left)
    batched = [r["translation_text"] for r in translator(SOURCES, batch_size=len(SOURCES), **GENERATION)]
    assert batched == [translator(source, **GENERATION)[0]["translation_text"] for source in SOURCES]
    assert batched == generate_texts(model, tiny_tokenizer(), SOURCES, **GENERATION)
    assert batched != generate_texts(model, left, SOURCES, **GENERATION)  # what left padding would have given


def test_an_empty_list_is_refused_by_name(tokenizer):
    translator = pipeline(hf_layerfusion.PIPELINE_TASK, model=tiny_model("plain_transformer"), tokenizer=tokenizer)
    with pytest.raises(ValueError, match="no sentences"):
        translator([])


def test_max_new_tokens_replaces_the_saved_max_length_without_a_warning(tokenizer):
    """run_translation.py saves `max_length` in the generation config; a call's `max_new_tokens` is the limit then,
    and generate() must not warn that both are set (it used to, on every pipeline call)."""
    from transformers.generation import utils as generation_utils
    from transformers.testing_utils import CaptureLogger

    model = tiny_model("gtrans")
    model.generation_config.max_length = 6  # what run_translation.py saves (there: --max_target_length + 1)
    translator = pipeline(hf_layerfusion.PIPELINE_TASK, model=model, tokenizer=tokenizer)
    with CaptureLogger(generation_utils.logger) as captured:
        records = translator(SOURCES, batch_size=len(SOURCES), num_beams=2, max_new_tokens=3)
    assert "max_length" not in captured.out, captured.out
    expected = generate_texts(model, tokenizer, SOURCES, num_beams=2, max_new_tokens=3)
    assert [r["translation_text"] for r in records] == expected
    # the saved limit still applies to calls without max_new_tokens
    records = translator(SOURCES, batch_size=len(SOURCES), num_beams=2)
    assert [r["translation_text"] for r in records] == generate_texts(model, tokenizer, SOURCES, num_beams=2)


def test_the_pipeline_steps_keywords_of_transformers_4_are_its_own_not_generates():
    """Fault round: `truncation=`, `return_tensors=`, `return_text=` and `clean_up_tokenization_spaces=` (keywords of
    transformers 4's translation pipeline) went to `generate()`, which refused them as unused model arguments. They
    now act as they did there: token ids instead of text, decoding's space clean-up, and truncation that can be
    turned off so that a source longer than the position table is an error, not a translation of its beginning."""
    tokenizer, model = tiny_tokenizer(), tiny_model("gtrans")
    translator = pipeline(hf_layerfusion.PIPELINE_TASK, model=model, tokenizer=tokenizer)
    batch = tokenizer(SOURCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = model.generate(**batch, **GENERATION)
    records = translator(SOURCES, batch_size=len(SOURCES), return_tensors=True, **GENERATION)
    assert all(set(record) == {"translation_token_ids"} for record in records)
    assert [tokenizer.decode(r["translation_token_ids"], skip_special_tokens=True).strip() for r in records] == [
        tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in expected
    ]
    assert translator(SOURCES[:1], return_text=False, **GENERATION)[0].keys() == {"translation_token_ids"}
    texts = translator(SOURCES, batch_size=len(SOURCES), clean_up_tokenization_spaces=True, **GENERATION)
    assert [r["translation_text"] for r in texts] == generate_texts(model, tokenizer, SOURCES, **GENERATION)
    too_long = " ".join(["abba"] * 200)  # more tokens than the position table holds
    assert translator(too_long, **GENERATION)[0]["translation_text"] is not None  # truncated by default
    with pytest.raises(ValueError, match="position table"):
        translator(too_long, truncation=False, **GENERATION)
    with pytest.raises(TypeError, match=r"`return_tensors` must be True or False, got 'yes'"):
        translator(SOURCES, return_tensors="yes")
    with pytest.raises(ValueError, match="contradict"):
        translator(SOURCES, return_tensors=True, return_text=True)


@pytest.mark.parametrize(
    "keyword, error, message",
    [
        # before: bool(fast), so "no" and 0 decoded with the fast loop
        (dict(fast="no"), TypeError, r"`fast` must be True or False, got 'no' \(str\)"),
        (dict(fast=0), TypeError, r"`fast` must be True or False, got 0 \(int\)"),
        # before: True cut every source to 1 token without a word, 2.5 and NaN failed in the tokenizer naming nothing
        (dict(max_source_length=True), ValueError, r"`max_source_length` must be a positive integer, got True"),
        (dict(max_source_length=2.5), ValueError, r"`max_source_length` must be a positive integer, got 2\.5"),
        (dict(max_source_length=float("nan")), ValueError, r"`max_source_length` must be a positive integer, got nan"),
    ],
)
def test_the_fast_switch_and_the_source_length_limit_are_checked_by_name(tokenizer, keyword, error, message):
    translator = pipeline(hf_layerfusion.PIPELINE_TASK, model=tiny_model("plain_transformer"), tokenizer=tokenizer)
    with pytest.raises(error, match=message):
        translator(SOURCES, **keyword, **GENERATION)


def test_sources_cut_at_the_length_limit_are_counted_in_one_warning_per_pipeline_call(tokenizer, caplog):
    """Before, the pipeline cut sources longer than `max_source_length` (default: the position table) without a word,
    where `translate()` warns. Each call that cuts says so once (a string or a list, in any batch size), with
    `translate()`'s warning; a call that cuts nothing, or does not truncate, says nothing."""
    model = tiny_model("plain_transformer")
    translator = pipeline(hf_layerfusion.PIPELINE_TASK, model=model, tokenizer=tokenizer)
    lengths = [len(tokenizer(source)["input_ids"]) for source in SOURCES]

    def cut_warnings(sentences, **kwargs) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hf_layerfusion.translation.translate"):
            translator(sentences, num_beams=1, max_new_tokens=2, **kwargs)
        return [record.getMessage() for record in caplog.records if "longer than" in record.getMessage()]

    assert cut_warnings(SOURCES, max_source_length=max(lengths)) == []
    warnings = cut_warnings(SOURCES, batch_size=2, max_source_length=max(lengths) - 1)
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"The translation pipeline: {lengths.count(max(lengths))} of 4 sentence(s) are "
                                  f"longer than max_source_length={max(lengths) - 1} tokens")
    positions = model.config.max_position_embeddings  # the default limit
    long_sentence = " ".join(["abba baab"] * positions)
    warnings = cut_warnings(long_sentence)
    assert len(warnings) == 1 and f"1 of 1 sentence(s) are longer than max_source_length={positions}" in warnings[0]
    assert cut_warnings(SOURCES[:1], truncation=False) == []
