"""Joint tokenizers on real Multi30k text: exact round trip, Marian's `</s>` convention, ids, save/load, the same
tokenizer in every process, SentencePiece's own segmentation."""

import hashlib
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest
from helpers import MULTI30K_DIR, require_shared
from transformers import AutoTokenizer

from hf_layerfusion.training.tokenization import train_joint_tokenizer, train_unigram_model

TRAIN_LINES_PER_LANGUAGE = 3000
CHECK_LINES_PER_LANGUAGE = 200
LANGUAGE_TAGS = ["<2de>", "<2en>"]


def read_lines(path, count: int) -> list[str]:
    with open(path, encoding="utf-8") as file:
        return [next(file).rstrip("\n") for _ in range(count)]


@pytest.fixture(scope="module")
def multi30k_text() -> dict[str, list[str]]:
    """Training text (train.en + train.de) and held-out check sentences (val.en + val.de)."""
    require_shared(MULTI30K_DIR / "train.en", "Multi30k data")
    return {
        split: [line for lang in ("en", "de") for line in read_lines(MULTI30K_DIR / f"{stem}.{lang}", count)]
        for split, stem, count in (
            ("train", "train", TRAIN_LINES_PER_LANGUAGE),
            ("check", "val", CHECK_LINES_PER_LANGUAGE),
        )
    }


@pytest.fixture(scope="module", params=["unigram", "bpe"])
def trained(request, multi30k_text, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp(request.param)
    tokenizer = train_joint_tokenizer(
        iter(multi30k_text["train"]),  # a one-pass iterator is enough
        vocab_size=1000,
        model=request.param,
        save_dir=save_dir,
        model_max_length=64,
        extra_special_tokens=LANGUAGE_TAGS,
    )
    return tokenizer, save_dir


def test_special_token_ids_match_the_config_defaults(trained):
    tokenizer, _ = trained
    assert (tokenizer.bos_token, tokenizer.pad_token, tokenizer.eos_token, tokenizer.unk_token) == (
        "<s>",
        "<pad>",
        "</s>",
        "<unk>",
    )
    assert (tokenizer.bos_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0,
        1,
        2,
        3,
    )
    assert tokenizer.convert_tokens_to_ids(LANGUAGE_TAGS) == [4, 5]
    assert len(tokenizer) == 1000
    assert tokenizer.model_max_length == 64


def test_decoding_reproduces_held_out_sentences_exactly(trained, multi30k_text):
    tokenizer, _ = trained
    seen_characters = set("".join(multi30k_text["train"]))
    covered = [line for line in multi30k_text["check"] if set(line) <= seen_characters]
    assert len(covered) > 0.95 * len(multi30k_text["check"])  # the check is not vacuous
    encoded = tokenizer(covered)["input_ids"]
    assert tokenizer.unk_token_id not in {token for ids in encoded for token in ids}
    assert tokenizer.batch_decode(encoded, skip_special_tokens=True) == covered
    # Sentences with spacing the clean-up heuristics would alter ("a ." -> "a.", "do n't" -> "don't").
    for text in ["A dog , running .", "They do n't stop !", "Zwei  Männer ( rechts ) ."]:
        assert tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text


def test_pieces_are_sentencepiece_style_and_every_sequence_ends_with_eos(trained, multi30k_text):
    tokenizer, _ = trained
    sentence, other = multi30k_text["check"][0], multi30k_text["check"][1]
    plain = tokenizer(sentence, add_special_tokens=False)["input_ids"]
    # Metaspace: the pieces are the text with spaces written "▁" and one "▁" prepended.
    assert "".join(tokenizer.convert_ids_to_tokens(plain)) == "▁" + sentence.replace(" ", "▁")
    # Marian: no <s>; </s> appended to sources, targets and pairs alike.
    assert tokenizer(sentence)["input_ids"] == plain + [2]
    assert tokenizer(text_target=sentence)["input_ids"] == plain + [2]
    other_plain = tokenizer(other, add_special_tokens=False)["input_ids"]
    assert tokenizer(sentence, other)["input_ids"] == plain + other_plain + [2]
    # Truncation keeps the final </s> and respects model_max_length.
    long_ids = tokenizer(" ".join(multi30k_text["check"][:20]), truncation=True)["input_ids"]
    assert len(long_ids) == 64 and long_ids[-1] == 2
    assert long_ids[:-1] == tokenizer(" ".join(multi30k_text["check"][:20]), add_special_tokens=False)["input_ids"][:63]


def test_language_tags_are_never_split_and_are_skipped_when_decoding(trained):
    tokenizer, _ = trained
    ids = tokenizer("<2de> A man sleeps.")["input_ids"]
    assert ids[0] == 4 and ids[-1] == 2
    assert ids[1:] == tokenizer("A man sleeps.")["input_ids"]
    assert tokenizer.decode(ids, skip_special_tokens=True) == "A man sleeps."
    assert tokenizer.extra_special_tokens == LANGUAGE_TAGS


def test_saved_tokenizer_loads_with_auto_tokenizer(trained, multi30k_text):
    tokenizer, save_dir = trained
    loaded = AutoTokenizer.from_pretrained(save_dir)
    sample = multi30k_text["check"][:50] + ["<2en> Ein Hund , der rennt ."]
    assert loaded(sample)["input_ids"] == tokenizer(sample)["input_ids"]
    assert loaded(text_target=sample)["input_ids"] == tokenizer(text_target=sample)["input_ids"]
    assert (loaded.bos_token_id, loaded.pad_token_id, loaded.eos_token_id, loaded.unk_token_id) == (0, 1, 2, 3)
    assert loaded.model_max_length == 64 and loaded.extra_special_tokens == LANGUAGE_TAGS
    assert (
        loaded.decode(loaded("Ein Hund , der rennt .")["input_ids"], skip_special_tokens=True)
        == "Ein Hund , der rennt ."
    )


def tokenizer_digest(tokenizer) -> str:
    return hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest()


@pytest.mark.parametrize("model", ["unigram", "bpe"])
def test_the_same_texts_give_the_same_tokenizer_in_every_process(model, multi30k_text, tmp_path):
    """A run that trains its own tokenizer (`hf-layerfusion-train` without `--tokenizer_name`) must be the same run
    when repeated. The `tokenizers` UnigramTrainer walks hash maps seeded per process: the same texts gave pieces
    of equal score other ids, and other scores in the 11th digit, in every new process (three processes, three
    tokenizers), so the same seed initialised other embeddings. Each process here trains on the same text."""
    texts = tmp_path / "texts.txt"
    texts.write_text("\n".join(multi30k_text["train"]), encoding="utf-8")
    script = textwrap.dedent(
        f"""
        import hashlib
        from hf_layerfusion.training.tokenization import train_joint_tokenizer
        texts = open({str(texts)!r}, encoding="utf-8").read().split("\\n")
        tokenizer = train_joint_tokenizer(texts, vocab_size=1000, model={model!r},
                                          extra_special_tokens={LANGUAGE_TAGS!r})
        print(hashlib.sha256(tokenizer.backend_tokenizer.to_str().encode()).hexdigest())
        """
    )
    digests = {
        subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout.strip()
        for _ in range(2)
    }
    here = train_joint_tokenizer(multi30k_text["train"], vocab_size=1000, model=model,
                                 extra_special_tokens=LANGUAGE_TAGS)
    assert digests == {tokenizer_digest(here)}


@pytest.mark.parametrize("trained", ["unigram"], indirect=True)
def test_unigram_tokenizer_segments_text_as_sentencepiece_does(trained, multi30k_text):
    """The unigram vocabulary is SentencePiece's; the fast tokenizer serving it must split text as SentencePiece's
    own processor does (Metaspace for its whitespace handling, the package's specials before its pieces)."""
    tokenizer, _ = trained
    reference = train_unigram_model(multi30k_text["train"], 1000 - 4 - len(LANGUAGE_TAGS))
    first_piece = 4 + len(LANGUAGE_TAGS)  # SentencePiece's piece 1 (0 is its <unk>)
    sentences = multi30k_text["check"] + ["Ünïcödé ☃ .", "tab\there", "two  spaces"]
    for sentence in sentences:
        pieces = reference.encode(sentence)
        expected = [tokenizer.unk_token_id if piece == 0 else piece - 1 + first_piece for piece in pieces]
        assert tokenizer(sentence, add_special_tokens=False)["input_ids"] == expected, sentence
    assert tokenizer.convert_ids_to_tokens(first_piece) == reference.id_to_piece(1)


def test_a_failing_text_source_raises_its_own_error():
    """SentencePiece turns an exception inside the iterator it reads into a RuntimeError "INTERNAL: ..."; the
    reader's error reaches the caller unchanged, as it did from the `tokenizers` trainer."""

    def lines():
        yield "a dog runs"
        raise OSError("texts.txt: input/output error")

    for model in ("unigram", "bpe"):
        with pytest.raises(OSError, match="input/output error"):
            train_joint_tokenizer(lines(), vocab_size=50, model=model)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(model="wordpiece"), "'wordpiece'"),
        (dict(vocab_size=4), "vocab_size"),
        # "a b c": three letters and "▁" beside four special tokens
        (dict(vocab_size=7), r"`vocab_size` 7 cannot hold the 4 distinct characters .* pass at least 8"),
        (dict(extra_special_tokens=["<2de>", "<2de>"]), "<2de>"),
        (dict(extra_special_tokens=["</s>"]), "</s>"),
        (dict(model_max_length=0), "model_max_length"),
        # True is 1 to `isinstance(_, int)`: a limit of one token
        (dict(model_max_length=True), r"`model_max_length`.*got True"),
        (dict(vocab_size=True), r"`vocab_size`.*got True"),
    ],
)
def test_bad_arguments_are_rejected(kwargs, message):
    with pytest.raises(ValueError, match=message):
        train_joint_tokenizer(["a b c"], **{"vocab_size": 50, **kwargs})


@pytest.mark.parametrize(
    "tokens, message",
    [
        # a bare string made each character a special token: every "d" and "e" vanished when decoding
        ("<2de>", r"`extra_special_tokens` must be a list of tokens, got str '<2de>'; pass \['<2de>'\]"),
        ([5], r"`extra_special_tokens\[0\]` is int 5"),
        (["<2de>", ""], r"`extra_special_tokens\[1\]` is str ''"),
    ],
)
def test_extra_special_tokens_must_be_a_list_of_non_empty_strings(tokens, message):
    with pytest.raises(TypeError, match=message):
        train_joint_tokenizer(["a b c"], vocab_size=50, model="bpe", extra_special_tokens=tokens)


def test_save_dir_is_checked_before_training(tmp_path, monkeypatch):
    """A file as `save_dir` (or a path under one): transformers only logged "should be a directory" and saved
    nothing, after training; a directory holding a tokenizer is replaced only with `overwrite=True`. All refused
    before the trainer runs, the files left as they were."""
    import hf_layerfusion.training.tokenization as tokenization

    def no_training(*args, **kwargs):
        raise AssertionError("trained before the save_dir was checked")

    monkeypatch.setattr(tokenization, "train_unigram_model", no_training)
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me", encoding="utf-8")
    with pytest.raises(NotADirectoryError, match=r"`save_dir` '.*a_file' is a file"):
        train_joint_tokenizer(["a b c"], vocab_size=50, save_dir=a_file)
    with pytest.raises(NotADirectoryError, match=r"a_file' is a file"):
        train_joint_tokenizer(["a b c"], vocab_size=50, save_dir=a_file / "tokenizer")
    assert a_file.read_text(encoding="utf-8") == "keep me"
    held = tmp_path / "held"
    held.mkdir()
    (held / "tokenizer.json").write_text("{}", encoding="utf-8")
    with pytest.raises(FileExistsError, match=r"held' already holds a tokenizer \(\['tokenizer.json'\]\).*overwrite"):
        train_joint_tokenizer(["a b c"], vocab_size=50, save_dir=held, overwrite=False)
    with pytest.raises(TypeError, match=r"`overwrite` must be True or False, got 'no'"):
        train_joint_tokenizer(["a b c"], vocab_size=50, save_dir=held, overwrite="no")
    assert [path.name for path in held.iterdir()] == ["tokenizer.json"]


def test_saving_replaces_only_the_tokenizer_files_through_a_temporary_dir(tmp_path, caplog):
    """`overwrite=True` replaces an earlier tokenizer (saying so) and keeps the directory's other files; a save that
    fails leaves the earlier tokenizer as it was and no temporary directory behind."""
    save_dir = tmp_path / "run"
    first = train_joint_tokenizer(["a b c"] * 3, vocab_size=20, model="bpe", save_dir=save_dir, overwrite=False)
    (save_dir / "config.json").write_text("{}", encoding="utf-8")
    saved = {name: (save_dir / name).read_bytes() for name in ("tokenizer.json", "tokenizer_config.json")}
    with caplog.at_level("WARNING", logger="hf_layerfusion.training.tokenization"):
        second = train_joint_tokenizer(["x y z"] * 3, vocab_size=20, model="bpe", save_dir=save_dir, overwrite=True)
    assert "Replacing the tokenizer in" in caplog.text
    assert sorted(path.name for path in save_dir.iterdir()) == ["config.json", *saved]
    assert AutoTokenizer.from_pretrained(save_dir).get_vocab() == second.get_vocab() != first.get_vocab()

    for name, data in saved.items():
        (save_dir / name).write_bytes(data)

    def failing_save(self, directory, *args, **kwargs):
        (Path(directory) / "tokenizer.json").write_text("{partial", encoding="utf-8")
        raise OSError("disk trouble")

    with mock.patch.object(type(second), "save_pretrained", failing_save), pytest.raises(OSError, match="disk trouble"):
        train_joint_tokenizer(["x y z"] * 3, vocab_size=20, model="bpe", save_dir=save_dir, overwrite=True)
    assert {name: (save_dir / name).read_bytes() for name in saved} == saved
    assert sorted(path.name for path in save_dir.iterdir()) == ["config.json", *saved]
