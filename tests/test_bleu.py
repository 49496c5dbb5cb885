"""Offline BLEU against `sacrebleu.corpus_bleu` on real Multi30k references and perturbed hypotheses."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
import torch
from helpers import MULTI30K_DIR, require_shared
from transformers import DataCollatorForSeq2Seq, EvalPrediction, Seq2SeqTrainer, Seq2SeqTrainingArguments

from hf_layerfusion import PlainTransformerConfig, PlainTransformerForConditionalGeneration
from hf_layerfusion.training.data import builtin_number_corpus, preprocess_translation
from hf_layerfusion.training.evaluation import compute_translation_metrics, load_bleu_metric
from hf_layerfusion.training.tokenization import train_joint_tokenizer
from hf_layerfusion.translation.bleu import corpus_bleu

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULT_KEYS = ["score", "counts", "totals", "precisions", "bp", "sys_len", "ref_len"]
SIGNATURE = f"nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{sacrebleu.__version__}"


def perturb(sentence: str, rng: random.Random) -> str:
    """A plausible system output: drop, duplicate or swap a word, change case, or leave the sentence alone."""
    words = sentence.split(" ")
    edit = rng.randrange(5)
    position = rng.randrange(len(words))
    if edit == 0 and len(words) > 1:
        del words[position]
    elif edit == 1:
        words.insert(position, words[position])
    elif edit == 2 and position + 1 < len(words):
        words[position], words[position + 1] = words[position + 1], words[position]
    elif edit == 3:
        words[position] = words[position].lower()
    return " ".join(words)


@pytest.fixture(scope="module")
def references() -> list[str]:
    require_shared(MULTI30K_DIR / "test_2016_flickr.de", "Multi30k data")
    return (MULTI30K_DIR / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def hypotheses(references) -> list[str]:
    rng = random.Random(0)
    return [perturb(reference, rng) for reference in references]


def test_evaluate_module_equals_sacrebleu(references, hypotheses):
    expected = sacrebleu.corpus_bleu(hypotheses, [references])
    assert 30 < expected.score < 95  # the perturbation is neither trivial nor destructive
    metric = load_bleu_metric()
    for layout in (references, [[reference] for reference in references]):  # one reference, or lists of them
        result = metric.compute(predictions=hypotheses, references=layout)
        assert result == {key: getattr(expected, key) for key in RESULT_KEYS} | {"signature": SIGNATURE}


def test_evaluate_module_options_and_multiple_references(references, hypotheses):
    second_references = [perturb(reference, random.Random(index)) for index, reference in enumerate(references)]
    expected = sacrebleu.corpus_bleu(
        hypotheses, [references, second_references], lowercase=True, tokenize="intl", smooth_method="floor"
    )
    result = load_bleu_metric().compute(
        predictions=hypotheses,
        references=[list(pair) for pair in zip(references, second_references, strict=True)],
        lowercase=True,
        tokenize="intl",
        smooth_method="floor",
    )
    assert {key: result[key] for key in RESULT_KEYS} == {key: getattr(expected, key) for key in RESULT_KEYS}
    assert result["signature"].startswith("nrefs:2|case:lc|eff:no|tok:intl|smooth:floor[0.10]|")
    with pytest.raises(ValueError, match="prediction 1 has 1"):
        load_bleu_metric().compute(predictions=["a", "b"], references=[["a", "x"], ["b"]])


def test_evaluate_module_loads_offline(references, hypotheses, tmp_path):
    """A fresh interpreter with the Hub switched off (the flags are read at import time) and an empty module cache."""
    script = (
        "import json, sys\n"
        "from hf_layerfusion.training.evaluation import load_bleu_metric\n"
        "data = json.load(sys.stdin)\n"
        "print(json.dumps(load_bleu_metric().compute(predictions=data['hyps'], references=data['refs'])))\n"
    )
    environment = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_EVALUATE_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "PYTHONPATH": str(REPO_ROOT),
    }
    completed = subprocess.run(
        [sys.executable, "-c", script],
        input=json.dumps({"hyps": hypotheses[:200], "refs": references[:200]}),
        capture_output=True,
        text=True,
        env=environment,
        cwd=REPO_ROOT,
        check=True,
        timeout=120,
    )
    assert any((tmp_path / "modules").rglob("sacrebleu_offline.py"))  # loaded from the fresh cache
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["score"] == sacrebleu.corpus_bleu(hypotheses[:200], [references[:200]]).score
    assert result["signature"] == SIGNATURE


def test_corpus_bleu_equals_sacrebleu(references, hypotheses):
    score, signature = corpus_bleu(hypotheses, references)
    assert score == sacrebleu.corpus_bleu(hypotheses, [references]).score
    assert signature == SIGNATURE
    assert corpus_bleu(references, references)[0] == pytest.approx(100.0)
    with pytest.raises(ValueError, match="2 hypotheses but 1 references"):
        corpus_bleu(["a", "b"], ["a"])


def test_compute_metrics_decodes_generated_ids_and_padded_labels(references, hypotheses):
    tokenizer = train_joint_tokenizer(references, vocab_size=800, model="bpe")
    hypotheses, references = hypotheses[:40], references[:40]
    pad, eos, start = tokenizer.pad_token_id, tokenizer.eos_token_id, 2  # decoder_start_token_id of the configs
    hypothesis_ids = [tokenizer(hypothesis)["input_ids"] for hypothesis in hypotheses]
    reference_ids = [tokenizer(text_target=reference)["input_ids"] for reference in references]
    assert all(ids[-1] == eos for ids in hypothesis_ids + reference_ids)
    # As `Seq2SeqTrainer` hands them over: generations start with the decoder start token and are padded with pad
    # inside a batch and with -100 across batches (second half); labels are padded with -100.
    width = max(map(len, hypothesis_ids)) + 3
    predictions = np.full((len(hypotheses), width), -100)
    for row, ids in enumerate(hypothesis_ids):
        generated = [start, *ids] + [pad] * (2 if row < 20 else 0)
        predictions[row, : len(generated)] = generated
    labels = np.full((len(references), max(map(len, reference_ids))), -100)
    for row, ids in enumerate(reference_ids):
        labels[row, : len(ids)] = ids

    metrics = compute_translation_metrics(tokenizer)(EvalPrediction(predictions=predictions, label_ids=labels))
    assert metrics == {
        "bleu": sacrebleu.corpus_bleu(hypotheses, [references]).score,
        "bleu_signature": SIGNATURE,
        "gen_len": float(np.mean([len(ids) for ids in hypothesis_ids])),  # generated tokens, </s> included
    }


def test_compute_metrics_inside_seq2seq_trainer(tmp_path):
    """End to end: `Seq2SeqTrainer.evaluate(predict_with_generate=True)` reports the BLEU of the model's own
    `generate` output, recomputed here with sacreBLEU."""
    corpus = builtin_number_corpus("en", "de", num_train=30, num_valid=12, num_test=0, seed=0)
    texts = [text for split in ("train", "validation") for row in corpus[split]["translation"] for text in row.values()]
    tokenizer = train_joint_tokenizer(texts, vocab_size=150, model="bpe")
    evaluation_set = preprocess_translation(corpus["validation"], tokenizer, "en", "de", max_target_length=24)
    config = PlainTransformerConfig(
        vocab_size=len(tokenizer),
        d_model=16,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        max_position_embeddings=64,
    )
    model = PlainTransformerForConditionalGeneration(config)
    model.generation_config.max_length = 12
    args = Seq2SeqTrainingArguments(
        output_dir=str(tmp_path),
        per_device_eval_batch_size=5,  # 12 examples: the last batch is shorter, so -100 cross-batch padding occurs
        predict_with_generate=True,
        report_to=[],
        use_cpu=True,
    )
    trainer = Seq2SeqTrainer(
        model=model,
        args=args,
        eval_dataset=evaluation_set,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),
        processing_class=tokenizer,
        compute_metrics=compute_translation_metrics(tokenizer),
    )
    metrics = trainer.evaluate()

    model.eval()
    batch = tokenizer([row["en"] for row in corpus["validation"]["translation"]], padding=True, return_tensors="pt")
    with torch.no_grad():
        generated = model.generate(**batch, max_length=12)
    hypotheses = [text.strip() for text in tokenizer.batch_decode(generated, skip_special_tokens=True)]
    references = [row["de"] for row in corpus["validation"]["translation"]]
    assert metrics["eval_bleu"] == pytest.approx(sacrebleu.corpus_bleu(hypotheses, [references]).score)
    assert metrics["eval_bleu_signature"] == SIGNATURE
    generated_lengths = (generated[:, 1:] != tokenizer.pad_token_id).sum(dim=1).float()
    assert metrics["eval_gen_len"] == pytest.approx(generated_lengths.mean().item())
