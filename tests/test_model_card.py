"""The model card carries the Hub metadata a user needs, parsed back with huggingface_hub's own ModelCard."""

import pytest
from huggingface_hub import ModelCard

import hf_layerfusion


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
    assert "import hf_layerfusion" in card.text and "nrefs:1|tok:13a" in card.text


def test_model_card_needs_saved_model(tmp_path):
    model = hf_layerfusion.PlainTransformerForConditionalGeneration(
        hf_layerfusion.PlainTransformerConfig(
            vocab_size=20, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16,
        )
    )
    with pytest.raises(FileNotFoundError, match="missing_dir"):
        hf_layerfusion.write_model_card(tmp_path / "missing_dir", model, "en", "de", "multi30k")
