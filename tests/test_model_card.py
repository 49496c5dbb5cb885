"""The model card carries the Hub metadata a user needs, parsed back with huggingface_hub's own ModelCard."""

import errno
import os
from unittest import mock

import pytest
from helpers import tiny_model
from huggingface_hub import ModelCard

import hf_layerfusion
from hf_layerfusion.hub.model_card import family_sections


def test_model_card_metadata_and_scores(tmp_path):
    config = hf_layerfusion.GTransConfig(
        vocab_size=20, d_model=8, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, encoder_group_size=1, decoder_group_size=1,
    )
    model = hf_layerfusion.GTransForConditionalGeneration(config)
    model.save_pretrained(tmp_path)
    path = hf_layerfusion.write_model_card(
        tmp_path, model, "en", "de", "multi30k", bleu_scores={"test": 31.25}, bleu_signature="nrefs:1|tok:13a",
        training_command="python examples/run_translation.py ...",
    )
    card = ModelCard.load(path)
    assert card.data.language == ["de", "en"]
    assert "gtrans" in card.data.tags and card.data.pipeline_tag == "translation"
    result = card.data.eval_results[0]
    assert result.metric_type == "bleu" and result.metric_value == pytest.approx(31.25)
    assert "from hf_layerfusion import PIPELINE_TASK" in card.text and "nrefs:1|tok:13a" in card.text


def test_model_card_needs_saved_model(tmp_path):
    model = hf_layerfusion.PlainTransformerForConditionalGeneration(
        hf_layerfusion.PlainTransformerConfig(
            vocab_size=20, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
        )
    )
    with pytest.raises(FileNotFoundError, match="missing_dir"):
        hf_layerfusion.write_model_card(tmp_path / "missing_dir", model, "en", "de", "multi30k")


def test_model_card_never_silently_replaces_a_readme(tmp_path):
    model = hf_layerfusion.PlainTransformerForConditionalGeneration(
        hf_layerfusion.PlainTransformerConfig(
            vocab_size=20, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
        )
    )
    readme = tmp_path / "README.md"
    readme.write_text("my own notes\n")
    with pytest.raises(FileExistsError, match=str(readme)):
        hf_layerfusion.write_model_card(tmp_path, model, "en", "de", "multi30k")
    assert readme.read_text() == "my own notes\n"
    hf_layerfusion.write_model_card(tmp_path, model, "en", "de", "multi30k", bleu_scores={"test": 12.0}, overwrite=True)
    assert ModelCard.load(readme).data.eval_results[0].metric_value == pytest.approx(12.0)


@pytest.mark.parametrize("model_type", sorted(hf_layerfusion.FAMILIES))
def test_every_family_has_a_card_template_with_its_paper(model_type, tmp_path):
    model = tiny_model(model_type)
    path = hf_layerfusion.write_model_card(
        tmp_path, model, "de", "en", "multi30k", bleu_scores={"test": 27.5, "validation": 28.25},
        bleu_signature="nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0", repo_id="someone/model",
    )
    card = ModelCard.load(path, ignore_metadata_errors=False)
    assert card.data.license == "apache-2.0" and card.data.datasets == ["multi30k"] and card.data.metrics == ["bleu"]
    assert {"translation", model_type} <= set(card.data.tags)
    assert {(r.dataset_split, r.metric_value) for r in card.data.eval_results} == {("test", 27.5), ("validation", 28.25)}
    sections = family_sections(model_type)
    assert sections["citation"] in card.text and sections["paper"] in card.text
    assert "| validation | 28.25 |" in card.text and "trust_remote_code=True" in card.text
    assert 'AutoModelForSeq2SeqLM.from_pretrained("someone/model", trust_remote_code=True)' in card.text
    # without it the tokenizer stops at an interactive "Do you wish to run the custom code? [y/N]"
    assert 'AutoTokenizer.from_pretrained("someone/model", trust_remote_code=True)' in card.text


def _tiny_plain():
    return hf_layerfusion.PlainTransformerForConditionalGeneration(
        hf_layerfusion.PlainTransformerConfig(
            vocab_size=20, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
        )
    )


def test_model_card_never_writes_through_a_link_to_a_model_file(tmp_path):
    """A `README.md` that is a link to the model's own `config.json` (issue 40): replaced through the link, the model
    would be lost; refused before anything is written, even with overwrite=True."""
    model = _tiny_plain()
    model.save_pretrained(tmp_path)
    config = (tmp_path / "config.json").read_bytes()
    (tmp_path / "README.md").symlink_to("config.json")
    with pytest.raises(ValueError, match=r"README\.md'.*config\.json"):
        hf_layerfusion.write_model_card(tmp_path, model, "en", "de", "multi30k", overwrite=True)
    assert (tmp_path / "config.json").read_bytes() == config


def test_model_card_failed_write_keeps_the_previous_card(tmp_path):
    """A disk that fills while the card is written (`fsync` fails): the previous card stays whole, the error names
    the card, and no temporary file is left beside it."""
    model = _tiny_plain()
    readme = tmp_path / "README.md"
    readme.write_text("my own notes\n")
    with mock.patch("os.fsync", side_effect=OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))):
        with pytest.raises(OSError, match=r"README\.md'.*No space left"):
            hf_layerfusion.write_model_card(tmp_path, model, "en", "de", "multi30k", overwrite=True)
    assert readme.read_text() == "my own notes\n"
    assert [child.name for child in tmp_path.iterdir()] == ["README.md"]


def _tiny_plain():
    return hf_layerfusion.PlainTransformerForConditionalGeneration(
        hf_layerfusion.PlainTransformerConfig(
            vocab_size=20, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
        )
    )


@pytest.mark.parametrize("overwrite", ["no", 0, None])
def test_overwrite_must_be_a_switch(tmp_path, overwrite):
    """`overwrite="no"` (truthy) replaced the existing README.md: a non-bool is refused by name, the card kept."""
    readme = tmp_path / "README.md"
    readme.write_text("my own notes\n")
    with pytest.raises(TypeError, match=rf"`overwrite` must be True or False, got {overwrite!r}"):
        hf_layerfusion.write_model_card(tmp_path, _tiny_plain(), "en", "de", "multi30k", overwrite=overwrite)
    assert readme.read_text() == "my own notes\n"


@pytest.mark.parametrize(
    "keyword, message",
    [
        (dict(dataset_name=None), r"dataset_name=None is empty or not a string.*'multi30k'"),
        (dict(dataset_name=""), r"dataset_name='' is empty or not a string"),
        (dict(dataset_name="  "), r"dataset_name='  ' is empty or not a string"),
        (dict(dataset_name=["multi30k"]), r"dataset_name=\['multi30k'\] is empty or not a string"),
        (dict(license=None), r"license=None is empty or not a string.*'apache-2.0'"),
        (dict(license=""), r"license='' is empty or not a string"),
    ],
)
def test_empty_dataset_or_license_is_refused_not_published(tmp_path, keyword, message):
    """Before, dataset_name=None went into the Hub metadata as `datasets: - null`, "" as `- ''`, license=None was
    accepted; each is refused by name and no card is written."""
    arguments = {"src_lang": "en", "tgt_lang": "de", "dataset_name": "multi30k", **keyword}
    with pytest.raises(ValueError, match=message):
        hf_layerfusion.write_model_card(tmp_path, _tiny_plain(), **arguments)
    assert not (tmp_path / "README.md").exists()
