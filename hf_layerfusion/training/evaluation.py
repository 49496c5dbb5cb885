"""BLEU in training: as an offline `evaluate` metric and as `Seq2SeqTrainer` metrics, both the sacreBLEU corpus BLEU
of `hf_layerfusion.translation.bleu`.
"""

from collections.abc import Callable
from pathlib import Path

import evaluate
import numpy as np

from ..translation.bleu import corpus_bleu

# `evaluate.load("sacrebleu")` downloads its script from the Hub; this local module has the same interface.
SACREBLEU_OFFLINE_PATH = Path(__file__).resolve().parent / "metrics" / "sacrebleu_offline" / "sacrebleu_offline.py"


def load_bleu_metric(**load_kwargs) -> evaluate.EvaluationModule:
    """`evaluate.load` of the package's sacreBLEU module: the Hub `sacrebleu` metric's inputs and outputs plus
    `signature`, with no network access (works with `HF_HUB_OFFLINE=1` and `HF_EVALUATE_OFFLINE=1`)."""
    return evaluate.load(str(SACREBLEU_OFFLINE_PATH), **load_kwargs)


def compute_translation_metrics(tokenizer) -> Callable:
    """`compute_metrics` for `Seq2SeqTrainer(..., args=Seq2SeqTrainingArguments(predict_with_generate=True))`.

    The returned callable decodes generated ids and labels (-100, the loss-ignore and cross-batch padding value,
    becomes `pad_token_id` first), strips surrounding spaces and returns
    `{"bleu": sacreBLEU score, "bleu_signature": signature, "gen_len": mean generated length}`; `gen_len` counts
    the non-pad tokens after the decoder start token (the final `</s>` included).
    """
    pad_token_id = tokenizer.pad_token_id
    if pad_token_id is None:
        raise ValueError("The tokenizer needs a `pad_token_id` to decode padded predictions and labels.")

    def compute_metrics(eval_prediction) -> dict:
        predictions, labels = eval_prediction.predictions, eval_prediction.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        predictions = np.where(predictions != -100, predictions, pad_token_id)
        labels = np.where(labels != -100, labels, pad_token_id)
        hypotheses = [text.strip() for text in tokenizer.batch_decode(predictions, skip_special_tokens=True)]
        references = [text.strip() for text in tokenizer.batch_decode(labels, skip_special_tokens=True)]
        score, signature = corpus_bleu(hypotheses, references)
        # `generate` output starts with the decoder start token, which was not generated.
        generated_lengths = np.count_nonzero(predictions[:, 1:] != pad_token_id, axis=1)
        return {"bleu": score, "bleu_signature": signature, "gen_len": float(generated_lengths.mean())}

    return compute_metrics
