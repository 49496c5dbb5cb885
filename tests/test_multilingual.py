"""Many-to-many multilingual pieces: language tags, OPUS-100 data, temperature sampling, Table V's summaries."""

import json
from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from transformers import XLMRobertaTokenizer

from hf_layerfusion import PlainTransformerConfig, PlainTransformerForConditionalGeneration
from hf_layerfusion.training.multilingual import (
    both_directions,
    evaluate_directions,
    format_summary,
    interleave_directions,
    load_opus100,
    opus100_config_name,
    resource_group,
    sampling_probabilities,
    summarize_directions,
    tokenize_direction,
    win_ratio,
)
from hf_layerfusion.translation.language_tags import add_language_tags, language_tag

WORDS = ["hello", "world", "hallo", "welt", "bonjour", "monde"]


@pytest.fixture
def tokenizer():
    """A tiny XLM-R tokenizer: <s> 0, <pad> 1, </s> 2, <unk> 3, one piece per word from id 4, <mask> last."""
    pieces = [(token, 0.0) for token in ("<s>", "<pad>", "</s>", "<unk>")]
    pieces += [(f"▁{word}", -float(i + 1)) for i, word in enumerate(WORDS)]
    return XLMRobertaTokenizer(vocab=pieces + [("<mask>", 0.0)])


def word_id(word):
    return 4 + WORDS.index(word)


# ------------------------------------------------------------------------------------------------- tags
def test_language_tags_are_unsplit_special_tokens_and_grow_the_model(tokenizer, tiny_backbone):
    vocab = len(tokenizer)  # 11
    model = PlainTransformerForConditionalGeneration(PlainTransformerConfig(**{**tiny_backbone, "vocab_size": vocab}))
    old_embeddings = model.get_input_embeddings().weight.detach().clone()

    tag_ids = add_language_tags(tokenizer, ["de", "fr"], model=model)

    assert tag_ids == {"de": vocab, "fr": vocab + 1}
    assert language_tag("de") == "<2de>"
    assert tokenizer.tokenize("<2de> hello world") == ["<2de>", "▁hello", "▁world"]
    assert model.config.vocab_size == vocab + 2
    assert model.get_input_embeddings().weight.shape[0] == vocab + 2
    assert model.lm_head.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()  # still tied
    assert torch.equal(model.get_input_embeddings().weight[:vocab], old_embeddings)
    # adding the same tags again changes nothing
    assert add_language_tags(tokenizer, ["de"], model=model) == {"de": vocab}
    assert len(tokenizer) == vocab + 2


def test_tokenized_direction_puts_the_target_tag_first_in_the_source(tokenizer):
    tag_ids = add_language_tags(tokenizer, ["de", "fr"])
    pair = Dataset.from_dict(
        {"translation": [{"en": "hello world", "de": "hallo welt"}, {"en": "hello", "de": "hallo"}]}
    )
    bos, eos = 0, 2

    en_de = tokenize_direction(pair, tokenizer, "en", "de", max_source_length=16, max_target_length=16)
    assert en_de.column_names == ["input_ids", "attention_mask", "labels"]
    assert en_de["input_ids"] == [
        [bos, tag_ids["de"], word_id("hello"), word_id("world"), eos],
        [bos, tag_ids["de"], word_id("hello"), eos],
    ]
    # targets are `y </s>`: no <s>, no tag
    assert en_de["labels"] == [[word_id("hallo"), word_id("welt"), eos], [word_id("hallo"), eos]]

    with pytest.raises(ValueError, match="no <2en> token"):
        tokenize_direction(pair, tokenizer, "de", "en")
    tag_ids.update(add_language_tags(tokenizer, ["en"]))
    de_en = tokenize_direction(pair, tokenizer, "de", "en", max_source_length=16, max_target_length=2)
    assert de_en["input_ids"][0] == [bos, tag_ids["en"], word_id("hallo"), word_id("welt"), eos]
    # truncation keeps the final </s> of the labels
    assert de_en["labels"] == [[word_id("hello"), eos], [word_id("hello"), eos]]
    assert tokenizer.decode(en_de["input_ids"][0], skip_special_tokens=True) == "hello world"


def test_language_tag_rejects_bad_codes():
    for bad in ("", "d e", "<de>"):
        with pytest.raises(ValueError, match="Invalid language code"):
            language_tag(bad)


# ------------------------------------------------------------------------------------------------- data
def _write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"translation": row}) + "\n" for row in rows))


def test_opus100_schema_from_local_files(tmp_path):
    assert (opus100_config_name("de"), opus100_config_name("fr"), opus100_config_name("zh")) == (
        "de-en",
        "en-fr",
        "en-zh",
    )
    _write_jsonl(tmp_path / "de-en" / "train.jsonl", [{"de": f"hallo {i}", "en": f"hello {i}"} for i in range(3)])
    _write_jsonl(tmp_path / "de-en" / "test.jsonl", [{"de": "welt", "en": "world"}])
    _write_jsonl(tmp_path / "en-fr" / "train.jsonl", [{"en": f"hello {i}", "fr": f"bonjour {i}"} for i in range(2)])

    pairs = load_opus100(["de", "fr"], data_dir=tmp_path)

    assert sorted(pairs) == ["de-en", "en-fr"]
    assert sorted(pairs["de-en"]) == ["test", "train"] and list(pairs["en-fr"]) == ["train"]
    assert pairs["de-en"]["train"][1] == {"translation": {"de": "hallo 1", "en": "hello 1"}}
    assert pairs["en-fr"]["train"][0] == {"translation": {"fr": "bonjour 0", "en": "hello 0"}}
    assert both_directions(list(pairs)) == ["de-en", "en-de", "en-fr", "fr-en"]
    with pytest.raises(FileNotFoundError, match="en-es"):
        load_opus100(["es"], data_dir=tmp_path)
    with pytest.raises(ValueError, match="'en'"):
        opus100_config_name("en")


# ------------------------------------------------------------------------------------------------- sampling
def test_sampling_probabilities_match_the_formula():
    sizes = {"de-en": 1_000_000, "en-de": 10_000, "sw-en": 100}
    # p_l = n_l^(1/T) / sum_k n_k^(1/T) with T = 5: 10^1.2, 10^0.8, 10^0.4
    weights = [10**1.2, 10**0.8, 10**0.4]
    expected = [w / sum(weights) for w in weights]
    assert list(sampling_probabilities(sizes, temperature=5).values()) == pytest.approx(expected, abs=1e-12)
    assert list(sampling_probabilities(sizes, temperature=5).values()) == pytest.approx(
        [0.6424, 0.2558, 0.1018], abs=1e-4
    )
    # T = 1: proportional to the sizes; very large T: close to uniform
    total = 1_010_100
    assert list(sampling_probabilities(sizes, temperature=1).values()) == pytest.approx(
        [1_000_000 / total, 10_000 / total, 100 / total], abs=1e-12
    )
    assert list(sampling_probabilities(sizes, temperature=1e6).values()) == pytest.approx([1 / 3] * 3, abs=1e-4)
    with pytest.raises(ValueError, match="temperature"):
        sampling_probabilities(sizes, temperature=0)
    with pytest.raises(ValueError, match="positive sizes"):
        sampling_probabilities({"de-en": 0})


def test_interleaved_stream_follows_the_sampling_probabilities():
    sizes = {"de-en": 400, "fr-en": 100, "cs-en": 25}
    directions = {
        name: Dataset.from_dict(
            {"source": [f"{name} {i}" for i in range(n)], "target_lang": ["en"] * n, "direction": [name] * n}
        )
        for name, n in sizes.items()
    }
    stream = interleave_directions(directions, temperature=5, seed=0)
    counts = Counter(stream["direction"])
    # every example of every direction is seen at least once ("all_exhausted"); small ones are oversampled
    seen = set(stream["source"])
    for name, n in sizes.items():
        assert {f"{name} {i}" for i in range(n)} <= seen
    weights = {name: n ** (1 / 5) for name, n in sizes.items()}
    for name in sizes:
        assert counts[name] / len(stream) == pytest.approx(weights[name] / sum(weights.values()), abs=0.04)
    assert counts["cs-en"] > 3 * sizes["cs-en"]


# ------------------------------------------------------------------------------------------------- evaluation
SCORES = {
    "de-en": 30.0,
    "fr-en": 20.0,
    "cs-en": 10.0,
    "sw-en": 5.0,
    "en-de": 25.0,
    "en-fr": 18.0,
    "en-cs": 8.0,
    "en-sw": 3.0,
}
BASELINE = {
    "de-en": 29.0,
    "fr-en": 20.0,
    "cs-en": 11.0,
    "sw-en": 4.0,
    "en-de": 24.0,
    "en-fr": 17.0,
    "en-cs": 8.5,
    "en-sw": 2.0,
}
PAIR_SIZES = {"de": 1_000_000, "fr": 900_000, "cs": 100_000, "sw": 99_999}  # high, high (boundary), medium, low
# a direction has the training size of its language pair
TRAIN_SIZES = {name: PAIR_SIZES[next(lang for lang in name.split("-") if lang != "en")] for name in SCORES}


def test_resource_groups_use_opus100_thresholds():
    assert [resource_group(n) for n in (1_000_000, 900_000, 899_999, 100_000, 99_999, 1)] == [
        "high",
        "high",
        "medium",
        "medium",
        "low",
        "low",
    ]
    assert resource_group(50, thresholds=(100, 10)) == "medium"


def test_win_ratio_counts_strict_wins():
    # X->en: de wins, fr ties (not a win), cs loses, sw wins -> 2/4
    x_to_en = {name: SCORES[name] for name in ("de-en", "fr-en", "cs-en", "sw-en")}
    assert win_ratio(x_to_en, BASELINE) == 50.0
    assert win_ratio(SCORES, BASELINE) == 100.0 * 5 / 8
    with pytest.raises(ValueError, match="missing"):
        win_ratio(SCORES, {"de-en": 1.0})


def test_summary_matches_hand_computed_table():
    summary = summarize_directions(SCORES, TRAIN_SIZES, baseline_scores=BASELINE)
    assert list(summary) == ["X->en", "en->X"]  # Table V order
    x_en, en_x = summary["X->en"], summary["en->X"]
    assert (x_en["high"], x_en["medium"], x_en["low"], x_en["avg"]) == (25.0, 10.0, 5.0, 16.25)
    assert (en_x["high"], en_x["medium"], en_x["low"], en_x["avg"]) == (21.5, 8.0, 3.0, 13.5)
    assert x_en["counts"] == en_x["counts"] == {"high": 2, "medium": 1, "low": 1}
    assert (x_en["wr"], en_x["wr"]) == (50.0, 75.0)
    # a non-English direction gets its own side; an empty group is None; no baseline -> no WR
    summary = summarize_directions({"de-fr": 12.0}, {"de-fr": 10})
    assert summary == {
        "X->Y": {"high": None, "medium": None, "low": 12.0, "avg": 12.0, "counts": {"high": 0, "medium": 0, "low": 1}}
    }
    table = format_summary(summarize_directions(SCORES, TRAIN_SIZES, baseline_scores=BASELINE))
    assert "X->en\t25.00 (2)\t10.00 (1)\t5.00 (1)\t16.25\t50.0" in table.splitlines()
    with pytest.raises(ValueError, match="training size"):
        summarize_directions({"de-en": 1.0}, {})


class _EchoModel:
    """Stands in for a model: `generate` returns its input ids, so the 'translation' shows what the model read."""

    device = torch.device("cpu")
    config = SimpleNamespace(max_position_embeddings=64)
    training = False  # `translate()` restores the mode it found

    def __init__(self):
        self.inputs = []

    def eval(self):
        return self

    def train(self, mode: bool = True):
        self.training = mode
        return self

    def generate(self, input_ids, attention_mask, **kwargs):
        self.inputs.append(input_ids)
        return input_ids


def test_evaluate_directions_tags_each_direction_with_its_target(tokenizer):
    tag_ids = add_language_tags(tokenizer, ["de", "fr"])
    model = _EchoModel()
    test_sets = {"en-de": (["hello world", "hello"], ["hallo welt", "hallo"]), "en-fr": (["world"], ["monde"])}
    seen = {}

    def score(hypotheses, references):
        seen[tuple(references)] = hypotheses
        return float(len(hypotheses))

    scores = evaluate_directions(model, tokenizer, test_sets, score, batch_size=1)
    assert scores == {"en-de": 2.0, "en-fr": 1.0}
    assert [ids[0, 1].item() for ids in model.inputs] == [tag_ids["de"], tag_ids["de"], tag_ids["fr"]]
    # the tag is a special token: decoding drops it
    assert seen[("hallo welt", "hallo")] == ["hello world", "hello"]


# ------------------------------------------------------------------------------------------------- the command
def _multilingual_corpus(directory):
    """A two-language Multi30k stand-in (en, de) of two sentences per split."""
    directory.mkdir()
    for split in ("train", "val", "test_2016_flickr"):
        (directory / f"{split}.en").write_text("a man rides a bike\ntwo dogs play\n", encoding="utf-8")
        (directory / f"{split}.de").write_text("ein mann fährt rad\nzwei hunde spielen\n", encoding="utf-8")
    return directory


def _multilingual_args(tmp_path, *extra, train=True, output_dir="run"):
    """A tiny en<->de run: a tiny random XLM-R built in tmp_path/xlmr, one training step, greedy evaluation."""
    return [
        "--dataset=multi30k", f"--multi30k_dir={tmp_path / 'corpus'}", "--languages=en,de", "--preset=none",
        f"--output_dir={tmp_path / output_dir}", "--num_beams=1", "--max_new_tokens=6", "--use_cpu=True",
        "--report_to=none", *(["--do_train", "--max_steps=1", f"--tiny_random_xlmr={tmp_path / 'xlmr'}",
                               "--tiny_vocab_size=40", "--config_overrides=encoder_group_size=1,decoder_group_size=1",
                               "--tiny_xlmr_config=hidden_size=16,num_hidden_layers=2,num_attention_heads=2,"
                               "intermediate_size=32,max_position_embeddings=24"] if train else []),
        *extra,
    ]


def _replace_arg(args, name, value):
    return [f"{name}={value}" if arg.startswith(f"{name}=") else arg for arg in args]


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"scores": {"en-de": 1.0}}', r"no score for the direction\(s\) \['de-en'\] of this run"),
        ("not json", r"is not valid JSON"),
        ('["en-de"]', r'has no "scores" object'),
        ('{"scores": {"en-de": 1.0, "de-en": NaN}}', r"\{'de-en': nan\} are not finite numbers"),
        ('{"scores": {"en-de": 1.0, "de-en": "12"}}', r"\{'de-en': '12'\} are not finite numbers"),
    ],
    ids=["direction-missing", "not-json", "no-scores", "nan", "string"],
)
def test_a_bad_baseline_is_refused_before_the_run_writes_anything(tmp_path, content, message):
    """Before, --baseline_scores was parsed only after training and the whole evaluation, so a file that did not parse
    or lacked a direction lost the scores (direction_scores.json never written). It is read and checked first."""
    from hf_layerfusion.cli import run_multilingual

    _multilingual_corpus(tmp_path / "corpus")
    baseline = tmp_path / "baseline.json"
    baseline.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=rf"--baseline_scores '.*baseline\.json'.*{message}"):
        run_multilingual.main(_multilingual_args(tmp_path, f"--baseline_scores={baseline}"))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["baseline.json", "corpus"]


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--tiny_xlmr_config", "hidden_size=16,num_hidden_layers=2,num_attention_heads=2,intermediate_size=32,"
         "hidden_dropout_prob=nan", r"--tiny_xlmr_config '.*hidden_dropout_prob=nan': \{'hidden_dropout_prob': nan\} "
         "are not finite"),
        ("--tiny_xlmr_config", "hidden_size=64,num_hidden_layers=2,num_attention_heads=3,intermediate_size=32",
         r"--tiny_xlmr_config '.*num_attention_heads=3.*': The hidden size \(64\) is not a multiple of the number of "
         r"attention heads \(3\)"),
        ("--config_overrides", "encoder_group_size=0,dropout=nan", r"--config_overrides 'encoder_group_size=0,"
         r"dropout=nan': \{'dropout': nan\} are not finite"),
        ("--config_overrides", "encoder_group_size=0", r"--config_overrides 'encoder_group_size=0' .*"
         r"`encoder_group_size` must lie in \[1, encoder_layers=2\], got 0"),
        ("--config_overrides", "d_model=32", r"--config_overrides 'd_model=32' .*`d_model=32` does not match the "
         r"XLM-R checkpoint"),
        ("--temperature", "inf", r"--temperature must be a positive finite number, got inf"),
        ("--temperature", "nan", r"--temperature must be a positive finite number, got nan"),
    ],
    ids=["tiny-nan", "tiny-heads", "override-nan", "override-group-size", "override-xlmr-key", "temperature-inf",
         "temperature-nan"],
)
def test_bad_model_settings_are_refused_by_option_before_the_tiny_xlmr_is_written(tmp_path, option, value, message):
    """Before, the values of --tiny_xlmr_config and --config_overrides were checked only when the model was built,
    after the tiny XLM-R was written (so the corrected rerun was refused: the directory is not empty), and the error
    did not name the option; --temperature took inf."""
    from hf_layerfusion.cli import run_multilingual

    _multilingual_corpus(tmp_path / "corpus")
    args = _multilingual_args(tmp_path)
    given = any(arg.startswith(f"{option}=") for arg in args)
    args = _replace_arg(args, option, value) if given else [*args, option, value]
    with pytest.raises(ValueError, match=message):
        run_multilingual.main(args)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus"]


def test_a_run_without_do_train_evaluates_the_trained_model_in_its_output_dir(tmp_path):
    """Before, a run without --do_train built an untrained model from XLM-R and wrote its scores beside the trained
    model it ignored. It evaluates the model saved in --output_dir: the training run's own scores again; the options
    that build a model, and an output dir without a model, are refused before anything is written."""
    from hf_layerfusion.cli import run_multilingual

    _multilingual_corpus(tmp_path / "corpus")
    trained = run_multilingual.main(_multilingual_args(tmp_path))
    scores_file = tmp_path / "run" / "direction_scores.json"
    scores_file.unlink()
    evaluated = run_multilingual.main(_multilingual_args(tmp_path, f"--xlmr={tmp_path / 'xlmr'}", train=False))
    assert evaluated["hypotheses"] == trained["hypotheses"] and evaluated["scores"] == trained["scores"]
    assert json.loads(scores_file.read_text(encoding="utf-8"))["hypotheses"] == trained["hypotheses"]

    with pytest.raises(ValueError, match=r"\['--tiny_random_xlmr', '--config_overrides'\] build a model for training"):
        run_multilingual.main([a for a in _multilingual_args(tmp_path, "--overwrite_output_dir=True")
                               if a not in ("--do_train", "--max_steps=1")])
    with pytest.raises(FileNotFoundError, match=r"--output_dir '.*empty' holds no trained model"):
        run_multilingual.main(_multilingual_args(tmp_path, train=False, output_dir="empty"))
    with pytest.raises(ValueError, match=r"holds a 'gtrans' model, not --model_type 'plain_transformer'"):
        run_multilingual.main(_multilingual_args(tmp_path, "--model_type=plain_transformer",
                                                 "--overwrite_output_dir=True", train=False))
    assert not (tmp_path / "empty").exists()
