"""BLEU for translation: sacreBLEU directly, as an offline `evaluate` metric, and as `Seq2SeqTrainer` metrics.

All BLEU scores here are sacreBLEU corpus BLEU on detokenised text (default 13a tokenisation, mixed case), reported
with the sacreBLEU signature so they are comparable across papers and runs.
"""

from collections.abc import Callable, Sequence
from pathlib import Path

import evaluate
import numpy as np
from sacrebleu.metrics import BLEU

# `evaluate.load("sacrebleu")` downloads its script from the Hub; this local module has the same interface.
SACREBLEU_OFFLINE_PATH = Path(__file__).resolve().parent / "metrics" / "sacrebleu_offline" / "sacrebleu_offline.py"


def load_bleu_metric(**load_kwargs) -> evaluate.EvaluationModule:
    """`evaluate.load` of the package's sacreBLEU module: the Hub `sacrebleu` metric's inputs and outputs plus
    `signature`, with no network access (works with `HF_HUB_OFFLINE=1` and `HF_EVALUATE_OFFLINE=1`)."""
    return evaluate.load(str(SACREBLEU_OFFLINE_PATH), **load_kwargs)


def corpus_bleu(
    hypotheses: Sequence[str],
    references: Sequence[str] | Sequence[Sequence[str]],
    tokenize: str = "13a",
    lowercase: bool = False,
) -> tuple[float, str]:
    """sacreBLEU corpus BLEU of detokenised `hypotheses`.

    Args:
        hypotheses: one system output per segment.
        references: one reference per segment, or for each segment a list of references (the same number each).
        tokenize: sacreBLEU tokeniser ("13a" is the WMT standard).
        lowercase: case-insensitive BLEU.

    Returns:
        `(score, signature)`, e.g. `(27.3, "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0")`.
    """
    if len(hypotheses) != len(references):
        raise ValueError(f"Got {len(hypotheses)} hypotheses but {len(references)} references.")
    if not hypotheses:
        raise ValueError("BLEU needs at least one hypothesis.")
    per_segment = [[reference] if isinstance(reference, str) else list(reference) for reference in references]
    references_per_segment = len(per_segment[0])
    if any(len(segment_references) != references_per_segment for segment_references in per_segment):
        raise ValueError("Every hypothesis needs the same number of references.")
    # sacreBLEU takes one stream per reference set.
    reference_streams = [[segment[i] for segment in per_segment] for i in range(references_per_segment)]
    bleu = BLEU(tokenize=tokenize, lowercase=lowercase)
    score = bleu.corpus_score(list(hypotheses), reference_streams).score
    return score, str(bleu.get_signature())


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
