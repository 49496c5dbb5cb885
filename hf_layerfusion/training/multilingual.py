"""Many-to-many multilingual NMT in the OPUS-100 setting (Zhang et al. 2020; XLM-T, Ma et al. 2020; GTrans Table V).

One model translates every direction. The pieces, and the choices where the papers leave room:

- **Target language**: a tag token `<2xx>` (`translation.language_tags.language_tag`) prepended to the *source* (Johnson et al. 2017), so the
  source reads `<s> <2de> Hello world </s>` with the XLM-R tokenizer. The encoder sees which language to produce,
  the decoder starts from `decoder_start_token_id` as usual, so any encoder (XLM-R-initialised or not) and
  `generate()` work unchanged. Tags are added to the tokenizer as special tokens (never split, dropped by
  `decode(skip_special_tokens=True)`); `add_language_tags` grows the model's shared embedding if needed. Targets are
  `y </s>` (no `<s>`): the decoder input is `</s> y`, fairseq's convention (`tokenize_direction`).
- **Data**: OPUS-100 is English-centric: each Hub config (`"de-en"`, `"en-fr"`, ... sorted language codes) holds one
  language pair whose rows are `{"translation": {"de": ..., "en": ...}}`; both directions of every pair are trained
  (`both_directions`). `load_opus100` reads the Hub dataset, or local JSON-lines files with the same schema
  (`{data_dir}/{config}/{split}.jsonl`). Each direction is tokenised on its own, then the directions are mixed.
- **Mixing**: temperature-based sampling over directions (Arivazhagan et al. 2019; T = 5 in XLM-T's OPUS-100 runs):
  `p_l = n_l^{1/T} / sum_k n_k^{1/T}`, `n_l` the training size of direction l (both directions of a pair have the
  pair's size). `interleave_directions` draws examples with these probabilities (`datasets.interleave_datasets`,
  `stopping_strategy="all_exhausted"`: an "epoch" ends once every direction has been seen entirely, so the small
  directions are oversampled as the temperature intends).
- **Evaluation** (GTrans Table V follows Zhang et al. 2020): BLEU per direction; directions are grouped by translation
  side (X->en, en->X and, for non-English-centric data such as the Multi30k stand-in, X->Y) and by the training size
  of their language pair into resource groups: high >= 0.9M pairs (`OPUS100_RESOURCE_THRESHOLDS`), low < 0.1M,
  medium in between (Zhang et al. 2020's split, giving the 45 / 21 / 28 pairs of Table V; the GTrans paper uses it
  without restating it). Group and overall averages are plain means over the directions; the overall average is over
  all directions of a side (Table V's Avg_94), not a mean of group means. The win ratio (WR) is the percentage of
  directions whose BLEU is strictly higher than a reference run's (Table V: "win ratio (%) compared to ref");
  ties do not count as wins.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from statistics import mean

from datasets import Dataset, DatasetDict, interleave_datasets

from ..translation.language_tags import check_language_tag, tag_source
from ..translation.translate import translate
from .data import load_translation_dataset

PIVOT_LANGUAGE = "en"
OPUS100_HUB_ID = "Helsinki-NLP/opus-100"
OPUS100_SAMPLING_TEMPERATURE = 5.0
# (high, low): a pair with >= high training examples is high-resource, < low is low-resource, medium otherwise
OPUS100_RESOURCE_THRESHOLDS = (900_000, 100_000)
RESOURCE_GROUPS = ("high", "medium", "low")


# ------------------------------------------------------------------------------------------------- data
def direction_name(source_lang: str, target_lang: str) -> str:
    return f"{source_lang}-{target_lang}"


def split_direction(name: str) -> tuple[str, str]:
    """`"de-en"` -> `("de", "en")` (a direction, or a language pair such as an OPUS-100 config)."""
    parts = name.split("-")
    if len(parts) != 2 or not all(parts) or parts[0] == parts[1]:
        raise ValueError(f"A direction or language pair is named 'xx-yy' with two languages, got {name!r}.")
    return parts[0], parts[1]


def both_directions(pair_names: Sequence[str]) -> list[str]:
    """`["de-en", "en-fr"]` -> `["de-en", "en-de", "en-fr", "fr-en"]`: many-to-many training uses both ways."""
    directions = []
    for pair in pair_names:
        first, second = split_direction(pair)
        directions += [direction_name(first, second), direction_name(second, first)]
    return directions


def opus100_config_name(language: str, pivot: str = PIVOT_LANGUAGE) -> str:
    """OPUS-100's Hub config of the pair of `language` with English: the two codes sorted (`de-en`, `en-fr`)."""
    if language == pivot:
        raise ValueError(f"OPUS-100 pairs {pivot!r} with another language, got {language!r}.")
    return "-".join(sorted((language, pivot)))


def load_opus100(
    languages: Sequence[str], data_dir: str | Path | None = None, pivot: str = PIVOT_LANGUAGE
) -> dict[str, DatasetDict]:
    """`{pair config: DatasetDict of its splits}` of OPUS-100 for `languages` (each paired with English).

    Without `data_dir`, from the Hub (`load_dataset("Helsinki-NLP/opus-100", "de-en")`); with it, from local
    JSON-lines files of the same schema, `{data_dir}/{config}/{split}.jsonl` (`train`, `validation`, `test`), whose
    rows are `{"translation": {"de": ..., "en": ...}}`. Both go through `load_translation_dataset`.
    """
    pairs = {}
    for language in languages:
        config = opus100_config_name(language, pivot)
        if data_dir is None:
            pairs[config] = load_translation_dataset(OPUS100_HUB_ID, config, src_lang=language, tgt_lang=pivot)
            continue
        local = Path(data_dir) / config
        if not any(local.glob("*.jsonl")):
            raise FileNotFoundError(f"No OPUS-100 files for pair {config!r}: expected {local}/{{split}}.jsonl.")
        pairs[config] = load_translation_dataset(local, src_lang=language, tgt_lang=pivot)
    return pairs


def tokenize_direction(
    pair: Dataset,
    tokenizer,
    source_lang: str,
    target_lang: str,
    max_source_length: int = 256,
    max_target_length: int = 256,
) -> Dataset:
    """Tokenise one direction of a `translation`-schema dataset: `<s> <2tgt> x </s>` sources, `y </s>` labels.

    Not `hf_layerfusion.preprocess_translation`: XLM-R's tokenizer wraps every sequence, targets included, in
    `<s> ... </s>`, while the labels must be `y </s>` (the decoder starts from `</s>`). Lengths count special tokens.
    """

    check_language_tag(tokenizer, target_lang)

    def tokenize(batch):
        sources = [tag_source(pair[source_lang], target_lang) for pair in batch["translation"]]
        model_inputs = tokenizer(sources, max_length=max_source_length, truncation=True)
        targets = tokenizer(
            [pair[target_lang] for pair in batch["translation"]],
            add_special_tokens=False,
            max_length=max_target_length - 1,
            truncation=True,
        )["input_ids"]
        model_inputs["labels"] = [ids + [tokenizer.eos_token_id] for ids in targets]
        return model_inputs

    return pair.map(tokenize, batched=True, remove_columns=pair.column_names)


def sampling_probabilities(
    sizes: Mapping[str, int], temperature: float = OPUS100_SAMPLING_TEMPERATURE
) -> dict[str, float]:
    """Temperature-based sampling: `p_l = n_l^{1/T} / sum_k n_k^{1/T}` (T = 1: proportional, T -> inf: uniform)."""
    if temperature <= 0:
        raise ValueError(f"`temperature` must be positive, got {temperature}.")
    bad = {name: n for name, n in sizes.items() if n <= 0}
    if not sizes or bad:
        raise ValueError(f"Sampling needs at least one direction and positive sizes, got {dict(sizes)}.")
    # n^{1/T} computed as exp(log(n)/T - max) so that large corpora with T close to 0 do not overflow
    logits = {name: math.log(n) / temperature for name, n in sizes.items()}
    top = max(logits.values())
    weights = {name: math.exp(value - top) for name, value in logits.items()}
    total = sum(weights.values())
    return {name: weight / total for name, weight in weights.items()}


def interleave_directions(
    directions: Mapping[str, Dataset], temperature: float = OPUS100_SAMPLING_TEMPERATURE, seed: int = 0
) -> Dataset:
    """One training stream of the (tokenised) `directions`, each example's direction drawn with
    `sampling_probabilities` of the direction sizes; ends once every direction has been exhausted."""
    names = list(directions)
    probabilities = sampling_probabilities({name: len(directions[name]) for name in names}, temperature)
    return interleave_datasets(
        [directions[name] for name in names],
        probabilities=[probabilities[name] for name in names],
        seed=seed,
        stopping_strategy="all_exhausted",
    )


# ------------------------------------------------------------------------------------------------- evaluation
def translate_to(
    model, tokenizer, sources: Sequence[str], target_lang: str, **translate_kwargs
) -> list[str]:
    """Translate `sources` into `target_lang` (its tag prepended to each source) with `translate`
    (`hf_layerfusion.translation.translate`); keyword arguments go to it (batch size, beams, generate options)."""
    return translate(model, tokenizer, sources, tgt_lang=target_lang, **translate_kwargs)


def evaluate_directions(
    model,
    tokenizer,
    test_sets: Mapping[str, tuple[Sequence[str], Sequence[str]]],
    score: Callable[[list[str], list[str]], float],
    **translate_kwargs,
) -> dict[str, float]:
    """`{direction: score(hypotheses, references)}` for `test_sets = {"de-en": (sources, references), ...}`."""
    scores = {}
    for name, (sources, references) in test_sets.items():
        _, target_lang = split_direction(name)
        hypotheses = translate_to(model, tokenizer, list(sources), target_lang, **translate_kwargs)
        scores[name] = score(hypotheses, list(references))
    return scores


def resource_group(train_size: int, thresholds: tuple[int, int] = OPUS100_RESOURCE_THRESHOLDS) -> str:
    """`"high"` (>= thresholds[0] training pairs), `"low"` (< thresholds[1]) or `"medium"`."""
    high, low = thresholds
    if low > high:
        raise ValueError(f"`thresholds` are (high, low) with high >= low, got {thresholds}.")
    if train_size >= high:
        return "high"
    return "low" if train_size < low else "medium"


def translation_side(name: str, pivot: str = PIVOT_LANGUAGE) -> str:
    """Table V's sides: `"X->en"`, `"en->X"`; directions not involving the pivot are `"X->Y"`."""
    source_lang, target_lang = split_direction(name)
    if target_lang == pivot:
        return f"X->{pivot}"
    return f"{pivot}->X" if source_lang == pivot else "X->Y"


def win_ratio(scores: Mapping[str, float], baseline_scores: Mapping[str, float]) -> float:
    """Percentage of the directions of `scores` where the model is strictly better than the baseline (Table V's WR)."""
    missing = sorted(set(scores) - set(baseline_scores))
    if missing or not scores:
        raise ValueError(f"The win ratio needs a baseline score for every direction; missing: {missing or 'all'}.")
    return 100.0 * sum(scores[name] > baseline_scores[name] for name in scores) / len(scores)


def summarize_directions(
    scores: Mapping[str, float],
    train_sizes: Mapping[str, int],
    baseline_scores: Mapping[str, float] | None = None,
    thresholds: tuple[int, int] = OPUS100_RESOURCE_THRESHOLDS,
    pivot: str = PIVOT_LANGUAGE,
) -> dict[str, dict]:
    """Table V per side: `{side: {"high": avg, "medium": avg, "low": avg, "avg": avg, "counts": {...}, "wr": %}}`.

    `train_sizes[direction]` is the training size of the direction's language pair; groups without a direction
    are `None`; `"wr"` is present only with `baseline_scores`.
    """
    missing = sorted(set(scores) - set(train_sizes))
    if missing:
        raise ValueError(f"No training size for directions {missing}: resource groups need them.")
    order = [f"X->{pivot}", f"{pivot}->X", "X->Y"]  # Table V's column order
    sides: dict[str, list[str]] = {side: [] for side in order}
    for name in sorted(scores):
        sides[translation_side(name, pivot)].append(name)
    sides = {side: names for side, names in sides.items() if names}
    summary = {}
    for side, names in sides.items():
        groups = {group: [] for group in RESOURCE_GROUPS}
        for name in names:
            groups[resource_group(train_sizes[name], thresholds)].append(scores[name])
        row = {group: (mean(values) if values else None) for group, values in groups.items()}
        row["avg"] = mean(scores[name] for name in names)
        row["counts"] = {group: len(values) for group, values in groups.items()}
        if baseline_scores is not None:
            row["wr"] = win_ratio({name: scores[name] for name in names}, baseline_scores)
        summary[side] = row
    return summary


def format_summary(summary: Mapping[str, dict]) -> str:
    """A Table V-like text table of `summarize_directions`' result."""
    lines = ["\t".join(["side", *(f"{group} (n)" for group in RESOURCE_GROUPS), "avg", "WR %"])]
    for side, row in summary.items():
        cells = [side]
        for group in RESOURCE_GROUPS:
            value = row[group]
            cells.append(
                f"{value:.2f} ({row['counts'][group]})" if value is not None else f"- ({row['counts'][group]})"
            )
        cells.append(f"{row['avg']:.2f}")
        cells.append(f"{row['wr']:.1f}" if "wr" in row else "-")
        lines.append("\t".join(cells))
    return "\n".join(lines)
