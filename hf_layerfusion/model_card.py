"""Hub model cards for trained hf_layerfusion models.

`write_model_card(output_dir, model, ...)` writes `README.md` with the Hub's YAML metadata (languages, tags,
datasets, BLEU as a model-index result) and a body that says how to load the model (it needs
`import hf_layerfusion`, which registers the architecture), what was measured and how to reproduce it.
`model.push_to_hub(...)` / `huggingface_hub.upload_folder` then publish it with the weights.
"""

from __future__ import annotations

import json
from pathlib import Path

PAPERS = {
    "gtrans": "Yang et al., GTrans: Grouping and Fusing Transformer Layers for Neural Machine Translation",
    "plain_transformer": "Vaswani et al. 2017, Attention Is All You Need",
    "layerwise_coordination": "He et al. 2018, Layer-Wise Coordination between Encoder and Decoder for NMT",
    "rtal": "Residual Tree Aggregation of Layers for Neural Machine Translation",
    "deep_representations": "Dou et al. 2018, Exploiting Deep Representations for Neural Machine Translation",
    "re_transformer": "Liu & Chen 2021, Re-Transformer",
}


def _yaml_list(key: str, values: list[str]) -> str:
    return f"{key}:\n" + "".join(f"- {v}\n" for v in values) if values else ""


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
) -> Path:
    """Write `output_dir/README.md` for `model`; `bleu_scores` maps split name -> sacreBLEU score."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        raise FileNotFoundError(f"Model directory {output_dir} does not exist; save the model there first.")
    config = model.config
    model_type = config.model_type
    bleu_scores = bleu_scores or {}
    results = "".join(
        f"      - type: bleu\n        value: {score:.2f}\n        name: sacreBLEU ({split})\n"
        for split, score in bleu_scores.items()
    )
    metadata = (
        "---\n"
        + _yaml_list("language", sorted({src_lang, tgt_lang}))
        + f"license: {license}\nlibrary_name: transformers\npipeline_tag: translation\n"
        + _yaml_list("tags", ["translation", "hf_layerfusion", model_type])
        + _yaml_list("datasets", [dataset_name])
        + _yaml_list("metrics", ["bleu"])
    )
    if results:
        metadata += (
            f"model-index:\n- name: {output_dir.name}\n  results:\n  - task:\n      type: translation\n"
            f"      name: Translation {src_lang}-{tgt_lang}\n    dataset:\n      name: {dataset_name}\n"
            f"      type: {dataset_name}\n    metrics:\n{results}"
        )
    metadata += "---\n"
    architecture = {
        k: getattr(config, k)
        for k in (
            "d_model",
            "encoder_layers",
            "decoder_layers",
            "encoder_attention_heads",
            "encoder_ffn_dim",
            "normalize_before",
            "encoder_group_size",
            "decoder_group_size",
            "encoder_fusion",
            "decoder_fusion",
        )
        if hasattr(config, k)
    }
    scores = "\n".join(f"| {split} | {score:.2f} |" for split, score in bleu_scores.items())
    body = f"""
# {output_dir.name}

A `{model_type}` encoder-decoder ({PAPERS.get(model_type, model_type)}) for {src_lang} -> {tgt_lang} translation,
trained with `hf_layerfusion` on {dataset_name}.

## Use

```python
import hf_layerfusion  # registers the `{model_type}` architecture with the Auto classes
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

model = AutoModelForSeq2SeqLM.from_pretrained("PATH_OR_REPO_ID")
tokenizer = AutoTokenizer.from_pretrained("PATH_OR_REPO_ID")
batch = tokenizer(["..."], return_tensors="pt", padding=True)
print(tokenizer.batch_decode(model.generate(**batch, num_beams=4, max_new_tokens=128), skip_special_tokens=True))
```

## Architecture

```json
{json.dumps(architecture, indent=2)}
```

## Evaluation
"""
    if bleu_scores:
        body += f"\n| split | sacreBLEU |\n|---|---|\n{scores}\n\nSignature: `{bleu_signature or 'n/a'}`\n"
    else:
        body += "\nNot evaluated.\n"
    if training_command:
        body += f"\n## Reproduce\n\n```bash\n{training_command}\n```\n"
    path = output_dir / "README.md"
    path.write_text(metadata + body, encoding="utf-8")
    return path
