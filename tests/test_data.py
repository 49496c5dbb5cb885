"""Data loaders and preprocessing against references built here: num2words tables, the raw files, tokenizer calls."""

import json

import datasets
import pytest
from num2words import num2words

from hf_layerfusion.training.data import (
    YEAR_RANGE,
    builtin_number_corpus,
    load_json_lines_translation,
    load_parallel_text,
    load_translation_dataset,
    preprocess_translation,
)
from hf_layerfusion.training.tokenization import train_joint_tokenizer

MAX_DIGITS = 3


def wording_table(language: str, max_digits: int = MAX_DIGITS) -> dict[str, set[tuple[int, str]]]:
    """Every wording num2words can produce for the corpus' numbers -> the (number, kind) pairs it verbalises."""
    table = {}
    candidates = [
        (number, kind)
        for number in range(10**max_digits)
        for kind in ("cardinal", "ordinal")
        if number or kind == "cardinal"
    ]
    candidates += [(number, "year") for number in range(YEAR_RANGE[0], YEAR_RANGE[1] + 1)]
    for number, kind in candidates:
        table.setdefault(num2words(number, lang=language, to=kind), set()).add((number, kind))
    return table


def read_lines(path) -> list[str]:
    with open(path, encoding="utf-8", newline="") as file:
        return [line.removesuffix("\n") for line in file]


def test_number_corpus_pairs_are_num2words_translations_and_splits_are_disjoint_by_number():
    corpus = builtin_number_corpus("en", "de", num_train=300, num_valid=60, num_test=60, seed=3, max_digits=MAX_DIGITS)
    assert list(corpus) == ["train", "validation", "test"]
    assert [len(corpus[split]) for split in corpus] == [300, 60, 60]
    assert corpus["train"].features["translation"] == datasets.Translation(languages=["en", "de"])

    english = wording_table("en")
    numbers_by_split, kinds = {}, set()
    for split, dataset in corpus.items():
        numbers_by_split[split] = set()
        for row in dataset["translation"]:
            readings = english[row["en"]]  # KeyError if the source is not a num2words wording
            matching = {
                (number, kind) for number, kind in readings if num2words(number, lang="de", to=kind) == row["de"]
            }
            assert matching, f"{row} is not a num2words translation"
            (number,) = {number for number, _ in matching}
            numbers_by_split[split].add(number)
            kinds.update(kind for _, kind in matching)
    all_numbers = [number for numbers in numbers_by_split.values() for number in numbers]
    assert len(all_numbers) == len(set(all_numbers)) == 420  # distinct within and across splits
    assert kinds == {"cardinal", "ordinal", "year"}
    assert {len(str(number)) for number in all_numbers} == {1, 2, 3, 4}  # every magnitude, plus years


def test_number_corpus_is_deterministic_in_the_seed():
    first = builtin_number_corpus("en", "fr", num_train=50, num_valid=5, num_test=5, seed=1)
    again = builtin_number_corpus("en", "fr", num_train=50, num_valid=5, num_test=5, seed=1)
    other = builtin_number_corpus("en", "fr", num_train=50, num_valid=5, num_test=5, seed=2)
    assert first["train"]["translation"] == again["train"]["translation"]
    assert first["test"]["translation"] == again["test"]["translation"]
    assert first["train"]["translation"] != other["train"]["translation"]


def test_number_corpus_drops_years_whose_source_reads_as_a_cardinal_with_another_translation():
    # French years are written as cardinals ("mille neuf cent ..."), German years are not: such a source would have
    # two correct targets, so the corpus must always translate a French cardinal wording as the German cardinal.
    corpus = builtin_number_corpus(
        "fr", "de", num_train=300, num_valid=0, num_test=0, seed=0, kinds=("cardinal", "year"), max_digits=3
    )
    french_cardinals = {num2words(number, lang="fr"): number for number in range(YEAR_RANGE[1] + 1)}
    rows = corpus["train"]["translation"]
    assert all(row["fr"] in french_cardinals for row in rows)
    assert all(row["de"] == num2words(french_cardinals[row["fr"]], lang="de") for row in rows)
    assert any(french_cardinals[row["fr"]] >= YEAR_RANGE[0] for row in rows)  # years were drawn
    # Only the years whose German year and cardinal wordings coincide (1000-1099, 2000-2099) remain.
    years = builtin_number_corpus("fr", "de", num_train=150, num_valid=0, num_test=0, kinds=("year",))["train"]
    numbers = [french_cardinals[row["fr"]] for row in years["translation"]]
    assert len(set(numbers)) == 150 and all(number // 100 in (10, 20) for number in numbers)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(src_lang="xx"), "'xx'"),
        (dict(tgt_lang="en"), "must differ"),
        (dict(kinds=("fraction",)), "fraction"),
        (dict(num_train=-1), "'train'"),
        (dict(num_train=600, max_digits=3), "distinct numbers"),
        (dict(src_lang="cs", kinds=("ordinal",)), "ordinal numbers in language 'cs'"),
    ],
)
def test_number_corpus_rejects_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        builtin_number_corpus(**{"num_train": 10, "num_valid": 2, "num_test": 2, **kwargs})


def test_multi30k_directory_maps_file_stems_to_splits(multi30k_dir):
    corpus = load_parallel_text(multi30k_dir, "en", "de")
    assert list(corpus) == ["train", "validation", "test"]
    for split, stem in (("train", "train"), ("validation", "val"), ("test", "test_2016_flickr")):
        english, german = read_lines(multi30k_dir / f"{stem}.en"), read_lines(multi30k_dir / f"{stem}.de")
        assert len(corpus[split]) == len(english) == len(german)
        rows = corpus[split]["translation"]
        for index in (0, 1, len(english) // 2, len(english) - 1):
            assert rows[index] == {"en": english[index], "de": german[index]}


def test_parallel_text_prefix_and_mapping(tmp_path):
    (tmp_path / "news.en").write_text("one\r\ntwo\u2028 halves\nthree\n", encoding="utf-8")  # CRLF, U+2028 in a line
    (tmp_path / "news.de").write_text("eins\nzwei\ndrei", encoding="utf-8")  # no final newline
    expected = [{"en": "one", "de": "eins"}, {"en": "two\u2028 halves", "de": "zwei"}, {"en": "three", "de": "drei"}]

    by_prefix = load_parallel_text(tmp_path / "news", "en", "de")
    assert list(by_prefix) == ["news"] and by_prefix["news"]["translation"] == expected
    by_files = load_parallel_text({"test": (tmp_path / "news.en", tmp_path / "news.de")}, "en", "de")
    assert by_files["test"]["translation"] == expected
    by_split_prefix = load_parallel_text({"train": str(tmp_path / "news")}, "en", "de")
    assert by_split_prefix["train"]["translation"] == expected


def test_parallel_text_errors_name_the_files(tmp_path):
    (tmp_path / "train.en").write_text("a\nb\n", encoding="utf-8")
    with pytest.raises(FileNotFoundError, match="train.de"):
        load_parallel_text(tmp_path, "en", "de")
    (tmp_path / "train.de").write_text("a\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"train.en has 2 lines.*train.de has 1"):
        load_parallel_text(tmp_path / "train", "en", "de")
    with pytest.raises(FileNotFoundError, match=r"\.fr"):
        load_parallel_text(tmp_path, "fr", "de")
    (tmp_path / "train.de").write_text("a\nb\n", encoding="utf-8")
    for stem in ("test", "test_2016_flickr"):
        (tmp_path / f"{stem}.en").write_text("x\n", encoding="utf-8")
        (tmp_path / f"{stem}.de").write_text("x\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'test'"):
        load_parallel_text(tmp_path, "en", "de")


def test_json_lines_keep_the_two_languages(tmp_path):
    rows = [{"en": "a cat", "de": "eine Katze", "fr": "un chat"}, {"en": "a dog", "de": "ein Hund", "fr": "un chien"}]
    lines = [json.dumps({"id": index, "translation": row}, ensure_ascii=False) for index, row in enumerate(rows)]
    (tmp_path / "valid.jsonl").write_text("\n".join(lines) + "\n\n", encoding="utf-8")
    expected = [{"en": row["en"], "de": row["de"]} for row in rows]

    corpus = load_json_lines_translation(tmp_path / "valid.jsonl", "en", "de")
    assert list(corpus) == ["validation"] and corpus["validation"]["translation"] == expected
    assert corpus["validation"].column_names == ["translation"]
    assert load_translation_dataset(tmp_path, src_lang="en", tgt_lang="de")["validation"]["translation"] == expected
    assert (
        load_translation_dataset({"dev": tmp_path / "valid.jsonl"}, src_lang="en", tgt_lang="de")["dev"]["translation"]
        == expected
    )

    (tmp_path / "bad.jsonl").write_text(
        lines[0] + "\n" + json.dumps({"translation": {"en": "x"}}) + "\n", encoding="utf-8"
    )
    with pytest.raises(ValueError, match=r"bad.jsonl:2"):
        load_json_lines_translation(tmp_path / "bad.jsonl", "en", "de")


def test_load_translation_dataset_dispatch(tmp_path, multi30k_dir, monkeypatch):
    assert len(load_translation_dataset(multi30k_dir, src_lang="de", tgt_lang="en")["validation"]) == 1014
    (tmp_path / "train.en").write_text("hi\n", encoding="utf-8")
    (tmp_path / "train.de").write_text("hallo\n", encoding="utf-8")
    assert load_translation_dataset(tmp_path / "train", src_lang="en", tgt_lang="de")["train"]["translation"] == [
        {"en": "hi", "de": "hallo"}
    ]
    # A file-system path that does not exist is a missing file, never a Hub lookup.
    with pytest.raises(FileNotFoundError, match="missing"):
        load_translation_dataset(tmp_path / "missing", src_lang="en", tgt_lang="de")

    # Hub names go to `datasets.load_dataset(name, config)`; stand in for the Hub with a local DatasetDict.
    hub_rows = [{"de": "eins", "en": "one", "fr": "un"}, {"de": "zwei", "en": "two", "fr": "deux"}]
    hub_features = datasets.Features(
        {"id": datasets.Value("string"), "translation": datasets.Translation(languages=["de", "en", "fr"])}
    )
    hub_split = datasets.Dataset.from_dict({"id": ["0", "1"], "translation": hub_rows}, features=hub_features)
    calls = []

    def fake_load_dataset(name, config, **kwargs):
        calls.append((name, config, kwargs))
        return datasets.DatasetDict({"train": hub_split, "dev": hub_split})

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    corpus = load_translation_dataset("some-org/numbers", "de-en-fr", src_lang="en", tgt_lang="de", revision="main")
    assert calls == [("some-org/numbers", "de-en-fr", {"revision": "main"})]
    assert list(corpus) == ["train", "validation"]
    assert corpus["validation"].column_names == ["translation"]
    assert corpus["train"]["translation"] == [{"en": "one", "de": "eins"}, {"en": "two", "de": "zwei"}]
    with pytest.raises(ValueError, match=r"\['cs'\]"):
        load_translation_dataset("some-org/numbers", src_lang="en", tgt_lang="cs")


def test_preprocess_translation_tokenizes_sources_and_targets_with_truncation(tmp_path):
    corpus = builtin_number_corpus("en", "de", num_train=40, num_valid=4, num_test=4, seed=0)
    texts = [text for row in corpus["train"]["translation"] for text in row.values()]
    tokenizer = train_joint_tokenizer(texts, vocab_size=120, model="bpe", extra_special_tokens=["<2de>"])
    max_source_length, max_target_length = 6, 4

    tokenized = preprocess_translation(
        corpus,
        tokenizer,
        "en",
        "de",
        max_source_length=max_source_length,
        max_target_length=max_target_length,
        source_prefix="<2de> ",
    )
    assert list(tokenized) == ["train", "validation", "test"]
    assert tokenized["train"].column_names == ["input_ids", "attention_mask", "labels"]
    eos, tag = tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<2de>")
    for row, pair in zip(tokenized["train"], corpus["train"]["translation"], strict=True):
        # Reference: tokens of the raw text without special tokens, cut to leave room for </s>.
        source_tokens = tokenizer(pair["en"], add_special_tokens=False)["input_ids"]
        target_tokens = tokenizer(pair["de"], add_special_tokens=False)["input_ids"]
        assert row["input_ids"] == ([tag] + source_tokens)[: max_source_length - 1] + [eos]
        assert row["labels"] == target_tokens[: max_target_length - 1] + [eos]
        assert row["attention_mask"] == [1] * len(row["input_ids"])

    with pytest.raises(ValueError, match=r"\['fr'\]"):
        preprocess_translation(corpus["test"], tokenizer, "fr", "de")
    with pytest.raises(ValueError, match="max_target_length"):
        preprocess_translation(corpus["test"], tokenizer, "en", "de", max_target_length=0)


def test_a_byte_order_mark_is_no_part_of_the_first_sentence(tmp_path):
    """Windows editors start UTF-8 files with a byte order mark; it was kept as '\\ufeffone'."""
    (tmp_path / "b.en").write_bytes(b"\xef\xbb\xbfone\r\ntwo\r\n")
    (tmp_path / "b.de").write_bytes(b"\xef\xbb\xbfeins\nzwei\n")
    assert load_parallel_text(tmp_path / "b", "en", "de")["b"]["translation"] == [
        {"en": "one", "de": "eins"}, {"en": "two", "de": "zwei"}
    ]
    (tmp_path / "b.jsonl").write_bytes(b'\xef\xbb\xbf{"translation": {"en": "one", "de": "eins"}}\n')
    assert load_json_lines_translation(tmp_path / "b.jsonl", "en", "de")["b"]["translation"] == [
        {"en": "one", "de": "eins"}
    ]


@pytest.mark.parametrize(
    "pair, message",
    [
        ('{"en": "a", "de": null}', r"bad.jsonl:2: the 'de' sentence is NoneType null, not a string"),
        ('{"en": 5, "de": 6}', r"bad.jsonl:2: the 'en' sentence is int 5"),  # loaded as "5" / "6"
        ('{"en": ["a"], "de": "b"}', r"bad.jsonl:2: the 'en' sentence is list \[\"a\"\]"),
    ],
)
def test_json_lines_sentences_must_be_strings(tmp_path, pair, message):
    (tmp_path / "bad.jsonl").write_text(
        '{"translation": {"en": "a", "de": "b"}}\n{"translation": ' + pair + "}\n", encoding="utf-8"
    )
    with pytest.raises(ValueError, match=message):
        load_json_lines_translation(tmp_path / "bad.jsonl", "en", "de")


def test_a_directory_given_as_a_file_is_named_a_directory(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.de").write_text("x\n", encoding="utf-8")
    with pytest.raises(IsADirectoryError, match=r"Parallel text file '.*sub' is a directory"):
        load_parallel_text({"train": (tmp_path / "sub", tmp_path / "a.de")}, "en", "de")
    (tmp_path / "p.en").mkdir()
    (tmp_path / "p.de").write_text("x\n", encoding="utf-8")
    with pytest.raises(IsADirectoryError, match=r"p\.en' is a directory"):
        load_parallel_text(tmp_path / "p", "en", "de")
    with pytest.raises(IsADirectoryError, match=r"JSON lines file '.*sub' is a directory"):
        load_json_lines_translation({"train": tmp_path / "sub"}, "en", "de")


def test_lines_empty_on_one_side_are_kept_with_one_warning_per_file_pair(tmp_path, caplog):
    """Real corpora have such lines and the Hugging Face / fairseq loaders keep them: kept, but no longer silently."""
    (tmp_path / "a.en").write_text("one\ntwo\n\nfour\nfive\n", encoding="utf-8")
    (tmp_path / "a.de").write_text("eins\n\n\n\nfünf\n", encoding="utf-8")
    with caplog.at_level("WARNING", logger="hf_layerfusion.training.data"):
        rows = load_parallel_text(tmp_path / "a", "en", "de")["a"]["translation"]
    assert rows[1] == {"en": "two", "de": ""} and rows[2] == {"en": "", "de": ""} and len(rows) == 5
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 1, warnings
    assert "a.en" in warnings[0] and "a.de" in warnings[0]
    assert "2 line(s) empty on one side only (first: line 2)" in warnings[0]


def test_preprocess_translation_refuses_bools_and_a_non_string_prefix():
    corpus = builtin_number_corpus("en", "de", num_train=4, num_valid=0, num_test=0, seed=0)
    tokenizer = train_joint_tokenizer(
        [text for row in corpus["train"]["translation"] for text in row.values()], vocab_size=80, model="bpe"
    )
    # True was a length of 1: every source cut to </s>
    with pytest.raises(ValueError, match=r"`max_source_length` must be a positive integer, got True"):
        preprocess_translation(corpus, tokenizer, "en", "de", max_source_length=True)
    with pytest.raises(ValueError, match=r"`max_target_length` must be a positive integer, got True"):
        preprocess_translation(corpus, tokenizer, "en", "de", max_target_length=True)
    with pytest.raises(TypeError, match=r"`source_prefix` must be a string.*got None"):
        preprocess_translation(corpus, tokenizer, "en", "de", source_prefix=None)
