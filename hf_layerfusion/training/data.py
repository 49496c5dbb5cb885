"""Translation data: the built-in number corpus, local and Hub loaders, and seq2seq preprocessing.

Every loader returns a `datasets.DatasetDict` whose rows have one column, `translation`, a
`datasets.Translation` dict `{src_lang: source sentence, tgt_lang: target sentence}`: the schema of the Hugging Face
translation datasets (WMT, OPUS-100, ...), so that `preprocess_translation` and the training scripts handle all of
them alike.
"""

import difflib
import json
import logging
import os
import random
from collections.abc import Iterable, Mapping
from pathlib import Path

import datasets
from num2words import CONVERTER_CLASSES, num2words

from ..file_checks import looks_like_local_path, read_utf8
from ..modeling.input_checks import check_positive_int

logger = logging.getLogger(__name__)

# File-name stems of common corpus releases -> the split names used by `datasets` and the training scripts.
# Multi30k (`train`, `val`, `test_2016_flickr`) maps to train / validation / test; other stems (e.g.
# `test_2017_flickr`) keep their own name as split name.
SPLIT_NAME_ALIASES = {
    "train": "train",
    "val": "validation",
    "valid": "validation",
    "dev": "validation",
    "validation": "validation",
    "test": "test",
    "test_2016_flickr": "test",
}

NUMBER_KINDS = ("cardinal", "ordinal", "year")
# Years are verbalised as years ("nineteen eighty-seven") only in this range; other kinds draw their magnitude.
YEAR_RANGE = (1000, 2099)

JSON_LINES_SUFFIXES = (".jsonl", ".json")


def _translation_features(src_lang: str, tgt_lang: str) -> datasets.Features:
    return datasets.Features({"translation": datasets.Translation(languages=[src_lang, tgt_lang])})


def _dataset_from_pairs(sources: list[str], targets: list[str], src_lang: str, tgt_lang: str) -> datasets.Dataset:
    rows = [{src_lang: source, tgt_lang: target} for source, target in zip(sources, targets, strict=True)]
    return datasets.Dataset.from_dict({"translation": rows}, features=_translation_features(src_lang, tgt_lang))


def _check_language_pair(src_lang: str, tgt_lang: str):
    if src_lang == tgt_lang:
        raise ValueError(f"`src_lang` and `tgt_lang` must differ, got {src_lang!r} for both.")


def _translation_languages(dataset: datasets.Dataset) -> list[str]:
    """Languages of the `translation` column of `dataset` (raises `ValueError` if there is no such column)."""
    if "translation" not in dataset.column_names:
        raise ValueError(
            f"Expected a `translation` column ({{src_lang: ..., tgt_lang: ...}}), got columns {dataset.column_names}."
        )
    feature = dataset.features["translation"]
    return list(feature.languages) if isinstance(feature, datasets.Translation) else list(feature)


def _require_languages(dataset: datasets.Dataset, src_lang: str, tgt_lang: str, origin: str):
    languages = _translation_languages(dataset)
    missing = [language for language in (src_lang, tgt_lang) if language not in languages]
    if missing:
        raise ValueError(f"{origin} has no language(s) {missing} in its `translation` column; it has {languages}.")


# ---------------------------------------------------------------------------------------------------------------
# Built-in corpus
# ---------------------------------------------------------------------------------------------------------------


def _verbalise(number: int, language: str, kind: str) -> str:
    try:
        return num2words(number, lang=language, to=kind)
    except NotImplementedError as error:
        raise ValueError(f"num2words cannot write {kind} numbers in language {language!r} ({number}).") from error


def builtin_number_corpus(
    src_lang: str = "en",
    tgt_lang: str = "de",
    num_train: int = 10000,
    num_valid: int = 500,
    num_test: int = 500,
    seed: int = 0,
    max_digits: int = 7,
    kinds: Iterable[str] = NUMBER_KINDS,
) -> datasets.DatasetDict:
    """The package's default corpus: numbers written out in words, translated between two languages.

    Each example is one integer verbalised by `num2words` in both languages as a cardinal ("three hundred and
    twenty-one" -> "dreihunderteinundzwanzig"), an ordinal ("twenty-first" -> "einundzwanzigste") or a year
    ("nineteen eighty-seven" -> "neunzehnhundertsiebenundachtzig"). The corpus is generated at call time, so it is
    not copied data; it is a real, if narrow, translation task (compounding, reordering of tens and units, ordinal
    and year forms).

    Cardinals and ordinals draw their number of digits uniformly from 1..`max_digits`, then a number with that many
    digits, so small and large magnitudes are equally frequent; years lie in `YEAR_RANGE`. Every number occurs at
    most once in the whole corpus, so train, validation and test are disjoint by the underlying number. A year
    whose source wording equals the source cardinal (French "mille neuf cent ...") while the targets differ would
    have two correct translations; such years are drawn again.

    Args:
        src_lang, tgt_lang: `num2words` language codes ("en", "de", "fr", "es", "it", "nl", "pt", "ru", ...).
        num_train, num_valid, num_test: number of examples per split.
        seed: the corpus is a deterministic function of all arguments.
        max_digits: largest number of digits of cardinals and ordinals.
        kinds: subset of `NUMBER_KINDS`.

    Returns:
        `DatasetDict` with splits `train`, `validation`, `test` and a `translation` column.
    """
    _check_language_pair(src_lang, tgt_lang)
    for language in (src_lang, tgt_lang):
        if language not in CONVERTER_CLASSES:
            raise ValueError(
                f"num2words does not support language {language!r}; supported: {sorted(CONVERTER_CLASSES)}."
            )
    kinds = tuple(kinds)
    if not kinds or any(kind not in NUMBER_KINDS for kind in kinds):
        raise ValueError(f"`kinds` must be a non-empty subset of {NUMBER_KINDS}, got {kinds}.")
    split_sizes = {"train": num_train, "validation": num_valid, "test": num_test}
    for split, size in split_sizes.items():
        if not isinstance(size, int) or size < 0:
            raise ValueError(f"The size of split {split!r} must be a non-negative integer, got {size!r}.")
    if not isinstance(max_digits, int) or max_digits < 1:
        raise ValueError(f"`max_digits` must be a positive integer, got {max_digits!r}.")
    total = sum(split_sizes.values())
    # Numbers must be distinct: keep the request well below the number of available numbers (a lower bound of it
    # here) so that redrawing a used number terminates quickly.
    year_count = YEAR_RANGE[1] - YEAR_RANGE[0] + 1 if "year" in kinds else 0
    magnitude_count = 10**max_digits if set(kinds) - {"year"} else 0
    available = max(year_count, magnitude_count)
    if total > available // 2:
        raise ValueError(
            f"{total} examples need {total} distinct numbers, more than half of the {available} available with "
            f"kinds={kinds} and max_digits={max_digits}; raise `max_digits` or ask for fewer examples."
        )

    rng = random.Random(seed)
    used_numbers = set()
    examples = []
    max_draws, draws = 100 * total + 1000, 0
    while len(examples) < total:
        if draws == max_draws:
            raise ValueError(
                f"Could not draw {total} unambiguous examples of kinds {kinds} for {src_lang}->{tgt_lang} "
                f"in {max_draws} draws (got {len(examples)})."
            )
        draws += 1
        kind = rng.choice(kinds)
        if kind == "year":
            number = rng.randint(*YEAR_RANGE)
        else:
            digits = rng.randint(1, max_digits)
            smallest = 10 ** (digits - 1) if digits > 1 else (0 if kind == "cardinal" else 1)  # no "zeroth"
            number = rng.randint(smallest, 10**digits - 1)
        if number in used_numbers:
            continue
        source, target = _verbalise(number, src_lang, kind), _verbalise(number, tgt_lang, kind)
        if kind == "year" and source == _verbalise(number, src_lang, "cardinal"):
            if target != _verbalise(number, tgt_lang, "cardinal"):
                continue
        used_numbers.add(number)
        examples.append((source, target))

    # Small magnitudes run out first; shuffling before splitting spreads them evenly over the splits.
    rng.shuffle(examples)
    splits = {}
    start = 0
    for split, size in split_sizes.items():
        sources, targets = zip(*examples[start : start + size], strict=True) if size else ((), ())
        splits[split] = _dataset_from_pairs(list(sources), list(targets), src_lang, tgt_lang)
        start += size
    return datasets.DatasetDict(splits)


# ---------------------------------------------------------------------------------------------------------------
# Local files
# ---------------------------------------------------------------------------------------------------------------


def _read_lines(path: Path) -> list[str]:
    # Split on "\n" only: `str.splitlines` also splits on characters such as U+2028 that may occur inside a
    # sentence and would break the line alignment of the two sides.
    # A byte order mark, as Windows editors write one, is no part of the first sentence.
    text = read_utf8(path, "Text file").removeprefix("\ufeff")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def _languages_of(prefix: Path) -> list[str]:
    """The language codes `<lang>` of the existing files `<prefix>.<lang>` (a code has no dot)."""
    if not prefix.parent.is_dir():
        return []
    start = f"{prefix.name}."
    suffixes = [path.name[len(start) :] for path in prefix.parent.iterdir() if path.name.startswith(start)]
    return sorted(suffix for suffix in suffixes if suffix and "." not in suffix and Path(f"{prefix}.{suffix}").is_file())


def _check_not_a_directory(path: Path, what: str):
    if path.is_dir():
        raise IsADirectoryError(f"{what} {str(path)!r} is a directory, not a file; pass the file.")


def _warn_of_one_sided_empty_lines(source_file: Path, target_file: Path, sources: list[str], targets: list[str]):
    """Log once per file pair how many lines are empty on one side only: kept (real corpora have them, and the
    Hugging Face and fairseq loaders keep them), but such a pair teaches the model to drop or invent a sentence."""
    one_sided = [
        number
        for number, (source, target) in enumerate(zip(sources, targets), start=1)
        if (source == "") != (target == "")
    ]
    if one_sided:
        logger.warning(
            "%s / %s: %d line(s) empty on one side only (first: line %d); kept as pairs with an empty sentence.",
            source_file, target_file, len(one_sided), one_sided[0],
        )


def _load_text_pair(source_file: Path, target_file: Path, src_lang: str, tgt_lang: str) -> datasets.Dataset:
    for path in (source_file, target_file):
        _check_not_a_directory(path, "Parallel text file")
    missing = [str(path) for path in (source_file, target_file) if not path.is_file()]
    if missing:
        # a mistyped language code: say which ones the corpus has
        prefix = source_file.with_name(source_file.name.removesuffix(f".{src_lang}"))
        raise FileNotFoundError(
            f"Missing parallel text file(s): {missing}; the files {prefix}.<lang> there have the languages "
            f"{_languages_of(prefix)}."
        )
    sources, targets = _read_lines(source_file), _read_lines(target_file)
    if len(sources) != len(targets):
        raise ValueError(
            f"Parallel files differ in line count: {source_file} has {len(sources)} lines, "
            f"{target_file} has {len(targets)}."
        )
    _warn_of_one_sided_empty_lines(source_file, target_file, sources, targets)
    return _dataset_from_pairs(sources, targets, src_lang, tgt_lang)


def _no_corpus_message(path: Path, src_lang: str, tgt_lang: str) -> str:
    """Why `path` is neither a corpus directory nor the prefix of parallel files: the first missing directory of
    the path (a mistyped directory name), and the close names that do exist."""
    missing = path
    while not missing.parent.exists() and missing.parent != missing:
        missing = missing.parent
    message = (
        f"{str(path)!r} is neither a directory nor the prefix of {path.name}.{src_lang} / {path.name}.{tgt_lang}: "
    )
    if missing != path:
        return message + f"no such directory {str(missing)!r} ({missing.absolute()})."
    message += f"no such directory ({path.absolute()}) and no such files in {str(path.parent)!r}."
    siblings = [child.name for child in path.parent.iterdir() if child.is_dir()] if path.parent.is_dir() else []
    close = difflib.get_close_matches(path.name, siblings, n=3)
    return message + (f" Did you mean {[str(path.with_name(name)) for name in close]}?" if close else "")


def _split_name(stem: str) -> str:
    return SPLIT_NAME_ALIASES.get(stem, stem)


def _ordered(splits: dict) -> datasets.DatasetDict:
    """`DatasetDict` listing train, validation, test first, then any other split by name."""
    order = {"train": 0, "validation": 1, "test": 2}
    return datasets.DatasetDict(
        {split: splits[split] for split in sorted(splits, key=lambda split: (order.get(split, len(order)), split))}
    )


def _add_split(splits: dict, split: str, dataset: datasets.Dataset, origin: str, origins: dict):
    if split in splits:
        raise ValueError(f"Both {origins[split]} and {origin} map to split {split!r}; pass an explicit mapping.")
    splits[split] = dataset
    origins[split] = origin


def load_parallel_text(
    prefix_or_files: str | os.PathLike | Mapping[str, str | os.PathLike | tuple],
    src_lang: str,
    tgt_lang: str,
) -> datasets.DatasetDict:
    """Load line-aligned plain-text files (one sentence per line, `<prefix>.<lang>`) as a translation `DatasetDict`.

    `prefix_or_files` is one of:
      - a directory: every `<stem>.<src_lang>` in it, paired with `<stem>.<tgt_lang>`, becomes split
        `SPLIT_NAME_ALIASES.get(stem, stem)`. For Multi30k, `load_parallel_text("data/multi30k", "en", "de")` gives
        `train` (train.*), `validation` (val.*) and `test` (test_2016_flickr.*);
      - a prefix `path/name`: the files `path/name.<src_lang>` and `path/name.<tgt_lang>`, as split
        `SPLIT_NAME_ALIASES.get(name, name)`;
      - a mapping `{split: prefix}` or `{split: (source_file, target_file)}`, split names used as given.

    Files are UTF-8 (a leading byte order mark is dropped); `\r\n` and `\r` end a line as `\n` does. A line empty
    on one side only is kept as a pair with an empty sentence, and logged as a warning once per file pair.

    Raises:
        FileNotFoundError: naming the missing files.
        IsADirectoryError: naming a directory given as a file.
        ValueError: if the two sides of a split differ in line count, or two files map to the same split.
    """
    _check_language_pair(src_lang, tgt_lang)
    splits, origins = {}, {}
    if isinstance(prefix_or_files, Mapping):
        for split, files in prefix_or_files.items():
            if isinstance(files, (tuple, list)):
                source_file, target_file = (Path(path) for path in files)
            else:
                source_file, target_file = Path(f"{files}.{src_lang}"), Path(f"{files}.{tgt_lang}")
            _add_split(
                splits, split, _load_text_pair(source_file, target_file, src_lang, tgt_lang), str(files), origins
            )
    elif Path(prefix_or_files).is_dir():
        directory = Path(prefix_or_files)
        source_files = sorted(directory.glob(f"*.{src_lang}"))
        if not source_files:
            # the languages of the parallel files (a <name> with two or more <lang>), not of README.md & co.
            per_name = [_languages_of(path.with_suffix("")) for path in directory.iterdir() if path.is_file()]
            languages = sorted({language for found in per_name if len(found) > 1 for language in found})
            raise FileNotFoundError(
                f"No '*.{src_lang}' files in directory {directory}; its parallel <name>.<lang> files have the "
                f"languages {languages}."
            )
        for source_file in source_files:
            stem = source_file.name.removesuffix(f".{src_lang}")
            dataset = _load_text_pair(source_file, directory / f"{stem}.{tgt_lang}", src_lang, tgt_lang)
            _add_split(splits, _split_name(stem), dataset, str(source_file), origins)
    else:
        prefix = Path(prefix_or_files)
        if not _languages_of(prefix):
            raise FileNotFoundError(_no_corpus_message(prefix, src_lang, tgt_lang))
        dataset = _load_text_pair(Path(f"{prefix}.{src_lang}"), Path(f"{prefix}.{tgt_lang}"), src_lang, tgt_lang)
        splits[_split_name(prefix.name)] = dataset
    return _ordered(splits)


def _load_json_lines_file(path: Path, src_lang: str, tgt_lang: str) -> datasets.Dataset:
    _check_not_a_directory(path, "JSON lines file")
    if not path.is_file():
        raise FileNotFoundError(f"Missing JSON lines file: {path}.")
    sources, targets = [], []
    for line_number, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{line_number}: not a JSON object ({error}).") from error
        pair = record.get("translation") if isinstance(record, dict) else None
        if not isinstance(pair, dict) or src_lang not in pair or tgt_lang not in pair:
            raise ValueError(
                f'{path}:{line_number}: expected {{"translation": {{{src_lang!r}: ..., {tgt_lang!r}: ...}}}}, '
                f"got {line[:200]}"
            )
        for language in (src_lang, tgt_lang):
            if not isinstance(pair[language], str):
                # null, numbers or lists would fail later (or load as text) naming neither file nor line
                raise ValueError(
                    f"{path}:{line_number}: the {language!r} sentence is {type(pair[language]).__name__} "
                    f"{json.dumps(pair[language])[:100]}, not a string."
                )
        sources.append(pair[src_lang])
        targets.append(pair[tgt_lang])
    return _dataset_from_pairs(sources, targets, src_lang, tgt_lang)


def load_json_lines_translation(
    path_or_files: str | os.PathLike | Mapping[str, str | os.PathLike],
    src_lang: str,
    tgt_lang: str,
) -> datasets.DatasetDict:
    """Load JSON lines files whose rows are `{"translation": {src_lang: ..., tgt_lang: ...}}` (other keys and
    languages ignored, blank lines skipped, a leading byte order mark dropped as for `load_parallel_text`); `.json`
    files must be JSON lines too. A row whose sentence is not a string (null, a number, a list) is refused naming
    its file, line and language.

    `path_or_files` is a file (split named `SPLIT_NAME_ALIASES.get(stem, stem)`), a directory (every `*.jsonl` in
    it, named likewise) or a mapping `{split: file}`.
    """
    _check_language_pair(src_lang, tgt_lang)
    if isinstance(path_or_files, Mapping):
        named_files = [(split, Path(file)) for split, file in path_or_files.items()]
    else:
        path = Path(path_or_files)
        files = sorted(path.glob("*.jsonl")) if path.is_dir() else [path]
        if not files:
            raise FileNotFoundError(f"No '*.jsonl' files in directory {path}.")
        named_files = [(_split_name(file.stem), file) for file in files]
    splits, origins = {}, {}
    for split, file in named_files:
        _add_split(splits, split, _load_json_lines_file(file, src_lang, tgt_lang), str(file), origins)
    return _ordered(splits)


# ---------------------------------------------------------------------------------------------------------------
# Dispatch (local files or the Hugging Face Hub)
# ---------------------------------------------------------------------------------------------------------------


def _is_json_lines(path: Path) -> bool:
    return path.suffix in JSON_LINES_SUFFIXES


def _is_local(name_or_path, src_lang: str, tgt_lang: str) -> bool:
    path = Path(name_or_path).expanduser()
    return (
        path.exists()
        or Path(f"{path}.{src_lang}").exists()
        or Path(f"{path}.{tgt_lang}").exists()
        # A file-system path that does not exist must fail as a missing file, not as a Hub lookup.
        or looks_like_local_path(name_or_path)
        or _is_json_lines(path)
    )


def _keep_language_pair(dataset: datasets.Dataset, src_lang: str, tgt_lang: str, origin: str) -> datasets.Dataset:
    """Reduce a Hub translation dataset to the `translation` column with exactly the two languages."""
    _require_languages(dataset, src_lang, tgt_lang, origin)
    if dataset.column_names == ["translation"] and set(_translation_languages(dataset)) == {src_lang, tgt_lang}:
        return dataset
    return dataset.map(
        lambda batch: {"translation": [{src_lang: p[src_lang], tgt_lang: p[tgt_lang]} for p in batch["translation"]]},
        batched=True,
        remove_columns=dataset.column_names,
        features=_translation_features(src_lang, tgt_lang),
    )


def load_translation_dataset(
    name_or_path: str | os.PathLike | Mapping,
    config: str | None = None,
    *,
    src_lang: str,
    tgt_lang: str,
    **load_dataset_kwargs,
) -> datasets.DatasetDict:
    """Load a translation corpus from local files or the Hugging Face Hub, in the `translation` schema.

    Local inputs (an existing path, a `<prefix>` with `<prefix>.<lang>` files, an absolute or `./`-relative path,
    or a mapping of splits to files) go to `load_json_lines_translation` for `.jsonl`/`.json` files or directories
    of `*.jsonl` files and to `load_parallel_text` otherwise. Anything else is a Hub dataset name:
    `datasets.load_dataset(name_or_path, config, **load_dataset_kwargs)` (e.g. `("wmt14", "de-en")`,
    `("Helsinki-NLP/opus-100", "de-en")`), whose split names are normalised with `SPLIT_NAME_ALIASES` and whose
    `translation` column is reduced to the two languages.
    """
    _check_language_pair(src_lang, tgt_lang)
    if isinstance(name_or_path, Mapping):
        files = list(name_or_path.values())
        if files and all(isinstance(file, (str, os.PathLike)) and _is_json_lines(Path(file)) for file in files):
            return load_json_lines_translation(name_or_path, src_lang, tgt_lang)
        return load_parallel_text(name_or_path, src_lang, tgt_lang)
    if _is_local(name_or_path, src_lang, tgt_lang):
        path = Path(name_or_path).expanduser()
        if _is_json_lines(path) or (
            path.is_dir() and not any(path.glob(f"*.{src_lang}")) and any(path.glob("*.jsonl"))
        ):
            return load_json_lines_translation(path, src_lang, tgt_lang)
        return load_parallel_text(path, src_lang, tgt_lang)

    try:
        loaded = datasets.load_dataset(str(name_or_path), config, **load_dataset_kwargs)
    except (FileNotFoundError, ConnectionError, OSError) as error:
        raise FileNotFoundError(
            f"Dataset {str(name_or_path)!r} is not a local path (no {Path(name_or_path).absolute()}, no "
            f"'{name_or_path}.{src_lang}' files) and could not be loaded from the Hugging Face Hub: {error}"
        ) from error
    if not isinstance(loaded, datasets.DatasetDict):
        raise ValueError(
            f"Expected `datasets.load_dataset({str(name_or_path)!r}, {config!r})` to return a DatasetDict of "
            f"splits, got {type(loaded).__name__}; do not pass `split` or `streaming`."
        )
    splits, origins = {}, {}
    for split, dataset in loaded.items():
        origin = f"{name_or_path}[{config}] split {split!r}"
        _add_split(
            splits, _split_name(split), _keep_language_pair(dataset, src_lang, tgt_lang, origin), origin, origins
        )
    return _ordered(splits)


# ---------------------------------------------------------------------------------------------------------------
# Tokenisation for seq2seq training
# ---------------------------------------------------------------------------------------------------------------


def preprocess_translation(
    dataset: datasets.Dataset | datasets.DatasetDict,
    tokenizer,
    src_lang: str,
    tgt_lang: str,
    max_source_length: int = 128,
    max_target_length: int = 128,
    source_prefix: str = "",
    num_proc: int | None = None,
) -> datasets.Dataset | datasets.DatasetDict:
    """Tokenise a translation dataset for `Seq2SeqTrainer`: `input_ids`, `attention_mask` and `labels`.

    Sources (with `source_prefix` prepended, e.g. a target-language tag "<2de> ") and targets (through
    `text_target=`, so a tokenizer with distinct target settings uses them) are truncated to `max_source_length` /
    `max_target_length` tokens, special tokens included (the final `</s>` is kept). Padding is left to the data
    collator (`DataCollatorForSeq2Seq` pads labels with -100). The original columns are removed.
    """
    check_positive_int(max_source_length, "max_source_length")
    check_positive_int(max_target_length, "max_target_length")
    if not isinstance(source_prefix, str):
        raise TypeError(f"`source_prefix` must be a string (\"\" for none), got {source_prefix!r}.")
    if isinstance(dataset, datasets.DatasetDict):
        return datasets.DatasetDict(
            {
                split: preprocess_translation(
                    split_dataset,
                    tokenizer,
                    src_lang,
                    tgt_lang,
                    max_source_length=max_source_length,
                    max_target_length=max_target_length,
                    source_prefix=source_prefix,
                    num_proc=num_proc,
                )
                for split, split_dataset in dataset.items()
            }
        )
    _require_languages(dataset, src_lang, tgt_lang, "The dataset")

    def tokenize(batch):
        sources = [source_prefix + pair[src_lang] for pair in batch["translation"]]
        targets = [pair[tgt_lang] for pair in batch["translation"]]
        model_inputs = tokenizer(sources, max_length=max_source_length, truncation=True)
        model_inputs["labels"] = tokenizer(text_target=targets, max_length=max_target_length, truncation=True)[
            "input_ids"
        ]
        return model_inputs

    return dataset.map(tokenize, batched=True, remove_columns=dataset.column_names, num_proc=num_proc)
