"""SacreBLEU as a local `evaluate` metric module.

`evaluate.load("sacrebleu")` fetches its script from the Hugging Face Hub. This module takes the same inputs and
returns the same keys as that Hub metric (plus the sacreBLEU `signature`), so `evaluate.load(<path to this file>)`
works offline (`HF_HUB_OFFLINE=1`, `HF_EVALUATE_OFFLINE=1`). It is loaded by path through
`hf_layerfusion.training.evaluation.load_bleu_metric`; `evaluate` copies it into its module cache, so it imports only
installed packages.
"""

import datasets
import evaluate
from sacrebleu.metrics import BLEU

_CITATION = """\
@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    address = "Belgium, Brussels",
    publisher = "Association for Computational Linguistics",
    url = "https://www.aclweb.org/anthology/W18-6319",
    pages = "186--191",
}
"""

_DESCRIPTION = """\
Corpus BLEU computed by sacreBLEU on detokenised text, with the sacreBLEU signature that makes the score
reproducible (number of references, casing, tokenisation, smoothing, version).
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (`list` of `str`): detokenised system outputs.
    references (`list` of `str`, or `list` of `list` of `str`): one reference per prediction, or for each
        prediction a list of references (every prediction must have the same number of references).
    smooth_method (`str`): "exp" (default), "none", "floor" or "add-k".
    smooth_value (`float`, *optional*): value for "floor" (default 0.1) or "add-k" (default 1).
    tokenize (`str`, *optional*): sacreBLEU tokeniser; default "13a" (mteval-v13a), as sacreBLEU.
    lowercase (`bool`): case-insensitive BLEU. Defaults to `False`.
    force (`bool`): do not warn about input that looks tokenised. Defaults to `False`.
    use_effective_order (`bool`): ignore n-gram orders with no matches (for sentence-level BLEU).
        Defaults to `False`.

Returns:
    score (`float`): BLEU, 0-100.
    counts (`list` of `int`): matching n-grams for n = 1..4.
    totals (`list` of `int`): hypothesis n-grams for n = 1..4.
    precisions (`list` of `float`): n-gram precisions (percent).
    bp (`float`): brevity penalty.
    sys_len (`int`): hypothesis length in tokens.
    ref_len (`int`): effective reference length in tokens.
    signature (`str`): sacreBLEU signature, e.g. "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0".

Examples:
    >>> bleu = evaluate.load("path/to/sacrebleu_offline")
    >>> result = bleu.compute(predictions=["hello there general kenobi"], references=[["hello there general kenobi"]])
    >>> round(result["score"], 1)
    100.0
"""


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SacrebleuOffline(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            homepage="https://github.com/mjpost/sacreBLEU",
            inputs_description=_KWARGS_DESCRIPTION,
            # The same two input layouts as the Hub `sacrebleu` metric: several references or one per prediction.
            features=[
                datasets.Features(
                    {
                        "predictions": datasets.Value("string", id="sequence"),
                        "references": datasets.Sequence(datasets.Value("string", id="sequence"), id="references"),
                    }
                ),
                datasets.Features(
                    {
                        "predictions": datasets.Value("string", id="sequence"),
                        "references": datasets.Value("string", id="sequence"),
                    }
                ),
            ],
            codebase_urls=["https://github.com/mjpost/sacreBLEU"],
            reference_urls=["https://github.com/mjpost/sacreBLEU"],
        )

    def _compute(
        self,
        predictions,
        references,
        smooth_method="exp",
        smooth_value=None,
        force=False,
        lowercase=False,
        tokenize=None,
        use_effective_order=False,
    ):
        if isinstance(references[0], str):
            references = [[reference] for reference in references]
        references_per_prediction = len(references[0])
        for index, prediction_references in enumerate(references):
            if len(prediction_references) != references_per_prediction:
                raise ValueError(
                    f"sacreBLEU needs the same number of references for every prediction: prediction 0 has "
                    f"{references_per_prediction}, prediction {index} has {len(prediction_references)}."
                )
        # sacreBLEU takes one stream per reference set (transpose of the per-prediction lists).
        reference_streams = [[refs[i] for refs in references] for i in range(references_per_prediction)]
        # `sacrebleu.corpus_bleu` builds exactly this `BLEU` object; building it here also gives the signature.
        bleu = BLEU(
            lowercase=lowercase,
            force=force,
            tokenize=tokenize,
            smooth_method=smooth_method,
            smooth_value=smooth_value,
            effective_order=use_effective_order,
        )
        output = bleu.corpus_score(predictions, reference_streams)
        return {
            "score": output.score,
            "counts": output.counts,
            "totals": output.totals,
            "precisions": output.precisions,
            "bp": output.bp,
            "sys_len": output.sys_len,
            "ref_len": output.ref_len,
            "signature": str(bleu.get_signature()),
        }
