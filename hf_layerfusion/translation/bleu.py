"""sacreBLEU corpus BLEU of detokenised text (default 13a tokenisation, mixed case), reported with the sacreBLEU
signature so that scores are comparable across papers and runs. The BLEU of the trainer's evaluations
(`hf_layerfusion.training.evaluation`) and of the benchmarks is this one."""

from collections.abc import Sequence

from sacrebleu.metrics import BLEU


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
