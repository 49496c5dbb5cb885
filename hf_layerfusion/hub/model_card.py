"""Hub model cards for trained hf_layerfusion models, rendered from a run's results.

`write_model_card(output_dir, model, ...)` renders `hf_layerfusion/hub/model_card_templates/_base.md` (a
huggingface_hub Jinja template: YAML metadata, use with and without the package, intended use and limits, training
data, architecture, BLEU with the sacreBLEU signature, how to reproduce) with the family's own sections from
`hf_layerfusion/hub/model_card_templates/<model_type>.md` (what the model is, its limits, the paper and its BibTeX
citation). The metadata (`language`, `license`, `tags` with `translation` and the family, `datasets`, `metrics`,
`model-index` with the BLEU results) is built with huggingface_hub's `ModelCardData` and the rendered card is parsed
back with `ModelCard` before it is written, so a card the Hub would reject is never written. An existing `README.md` is
not replaced unless `overwrite=True`, nor ever when it is (a link to) a file of the model or of a template; the card is
written through a temporary file renamed into place, so a failure leaves the previous card whole.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..file_checks import check_output_file, write_file_atomically
from ..modeling.configuration import LayerFusionConfig
from ..modeling.input_checks import check_switch
from ..version import TORCH_REQUIREMENT, TRANSFORMERS_REQUIREMENT

TEMPLATE_DIR = Path(__file__).resolve().parent / "model_card_templates"  # package data: works from a wheel too
BASE_TEMPLATE = TEMPLATE_DIR / "_base.md"
FAMILY_SECTIONS = ("description", "limits", "paper", "citation")
ARCHITECTURE_KEYS = (
    "d_model",
    "encoder_layers",
    "decoder_layers",
    "encoder_attention_heads",
    "decoder_attention_heads",
    "encoder_ffn_dim",
    "decoder_ffn_dim",
    "normalize_before",
    "position_embedding_type",
    "vocab_size",
)


def family_sections(model_type: str) -> dict[str, str]:
    """The family's template sections (`## description`, `## limits`, `## paper`, `## citation`)."""
    path = TEMPLATE_DIR / f"{model_type}.md"
    if not path.is_file():
        raise FileNotFoundError(
            f"No model-card template for family {model_type!r}: add {path} with the sections {FAMILY_SECTIONS}."
        )
    parts = re.split(r"^## (\w+)\s*$", path.read_text(encoding="utf-8"), flags=re.MULTILINE)
    sections = {name: text.strip() for name, text in zip(parts[1::2], parts[2::2])}
    missing = [name for name in FAMILY_SECTIONS if name not in sections]
    if missing:
        raise ValueError(f"{path} lacks the sections {missing}.")
    return sections


# an ISO 639-1/-2/-3 code, optionally with a region or script subtag ("en", "deu", "pt-BR", "zh-Hant")
LANGUAGE_CODE = re.compile(r"[a-z]{2,3}(?:[-_][A-Za-z0-9]{2,8})*")


def write_model_card(
    output_dir: str | Path,
    model,
    src_lang: str,
    tgt_lang: str,
    dataset_name: str,
    bleu_scores: dict[str, float] | None = None,
    bleu_signature: str | None = None,
    training_command: str | None = None,
    license: str = "apache-2.0",
    repo_id: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write `output_dir/README.md` for `model` and return its path.

    Args:
        bleu_scores: split name -> sacreBLEU score of this run (e.g. `{"test": result["test"]["bleu"]}`); they go
            to the card's table and to the Hub's `model-index`.
        bleu_signature: the sacreBLEU signature of those scores.
        repo_id: the Hub repository the card shows in its code snippets (default: the directory name).
        overwrite: replace an existing `README.md` (otherwise a `FileExistsError` naming it).
    """
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    # the Hub's metadata lists languages by code and `model-index` scores as numbers: a name or an empty string, a NaN,
    # a string or a BLEU no run produces (sacreBLEU's is in [0, 100]) would be published in the card as they are
    for name, code in (("src_lang", src_lang), ("tgt_lang", tgt_lang)):
        if not isinstance(code, str) or not LANGUAGE_CODE.fullmatch(code):
            raise ValueError(f"{name}={code!r} is not a language code: give an ISO 639 code such as 'en' or 'de'.")
    # None or "" would be published as the card's `datasets: - null` or `license: ''`
    for name, value, example in (("dataset_name", dataset_name, "multi30k"), ("license", license, "apache-2.0")):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name}={value!r} is empty or not a string: give its name, such as {example!r}.")
    check_switch(overwrite, "overwrite")  # "no" is truthy: it would replace the existing card
    for split, score in (bleu_scores or {}).items():
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 100:
            raise ValueError(f"bleu_scores[{split!r}]={score!r} is not a finite number in [0, 100]; give the split's "
                             "sacreBLEU score.")
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise FileNotFoundError(f"Model directory {output_dir} does not exist; save the model there first.")
    path = output_dir / "README.md"
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it.")
    config = model.config
    model_type = config.model_type
    # what this reads: the model's files beside the card and the templates; a README.md that is a link (or a hard
    # link) to one of them would be replaced through it. Checked before rendering, with the directory's writability.
    model_files = [child for child in output_dir.iterdir() if child.name != path.name]
    check_output_file(path, [*model_files, BASE_TEMPLATE, TEMPLATE_DIR / f"{model_type}.md"], what="Model card")
    bleu_scores = dict(bleu_scores or {})
    model_name = repo_id.split("/")[-1] if repo_id else output_dir.resolve().name
    card_data = ModelCardData(
        language=sorted({src_lang, tgt_lang}),
        license=license,
        library_name="transformers",
        pipeline_tag="translation",
        tags=["translation", "hf_layerfusion", model_type],
        datasets=[dataset_name],
        metrics=["bleu"],
        model_name=model_name,
        eval_results=[
            EvalResult(
                task_type="translation",
                task_name=f"Translation {src_lang}-{tgt_lang}",
                dataset_type=dataset_name,
                dataset_name=dataset_name,
                dataset_split=split,
                metric_type="bleu",
                metric_name=f"sacreBLEU ({split})",
                metric_value=round(float(score), 2),
            )
            for split, score in bleu_scores.items()
        ]
        or None,
    )
    family = family_sections(model_type)
    architecture = {key: getattr(config, key) for key in ARCHITECTURE_KEYS if hasattr(config, key)}
    # the family's own knobs: whatever its config adds to the backbone's
    backbone_keys = set(LayerFusionConfig().to_dict())
    architecture.update({k: v for k, v in config.to_diff_dict().items() if k not in backbone_keys and _is_knob(k, v)})
    card = ModelCard.from_template(
        card_data,
        template_path=BASE_TEMPLATE,
        model_name=model_name,
        model_type=model_type,
        repo_id=repo_id or "PATH_OR_REPO_ID",
        src_lang=src_lang,
        tgt_lang=tgt_lang,
        dataset_name=dataset_name,
        family_description=family["description"],
        family_limits=family["limits"],
        paper=family["paper"],
        citation=family["citation"],
        architecture=json.dumps(architecture, indent=2),
        bleu_scores=bleu_scores,
        bleu_signature=bleu_signature,
        training_command=training_command,
        transformers_requirement=TRANSFORMERS_REQUIREMENT,
        torch_requirement=TORCH_REQUIREMENT,
    )
    ModelCard(str(card), ignore_metadata_errors=False)  # the Hub's own parsing: raises on invalid metadata
    write_file_atomically(path, str(card), what="Model card")
    return path


def _is_knob(key: str, value) -> bool:
    """A family hyper-parameter worth showing (not bookkeeping such as `auto_map` or `transformers_version`)."""
    return not key.startswith("_") and key not in {
        "auto_map",
        "custom_pipelines",
        "architectures",
        "transformers_version",
        "model_type",
        "dtype",
    } and isinstance(value, (int, float, bool, str, type(None)))
