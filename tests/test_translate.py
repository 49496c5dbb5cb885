"""`hf_layerfusion.translate()` against `generate()` itself: hypotheses land on their own sentence, and the model's
training mode is left as it was (issue 40); the translate command reads its lines and writes its output as the
shell asked (issue 73)."""

from __future__ import annotations

import logging
import sys

import pytest
import torch

import hf_layerfusion
from hf_layerfusion.cli import translate as translate_command
from helpers import SOURCES, piped_stdin, stdout_redirected_to, tiny_model, tiny_tokenizer, varied_gtrans


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "generate"])
def test_num_return_sequences_gives_each_sentence_its_own_hypotheses(tokenizer, fast):
    """`generate()` returns the n hypotheses of each sentence one after the other; `translate()` returns them as one
    list per sentence, in input order, whatever its length-sorted batches were (batch_size=3 splits the 4 sources)."""
    model = tiny_model("gtrans")
    settings = dict(num_beams=4, num_return_sequences=2, max_new_tokens=6)
    with torch.no_grad():
        outputs = model.generate(**tokenizer(SOURCES, padding=True, return_tensors="pt"), **settings)
    texts = [text.strip() for text in tokenizer.batch_decode(outputs, skip_special_tokens=True)]
    expected = [texts[2 * i : 2 * i + 2] for i in range(len(SOURCES))]
    assert len(set(map(tuple, expected))) > 1  # the sentences' hypotheses differ: a shuffle would show
    assert hf_layerfusion.translate(model, tokenizer, SOURCES, batch_size=3, fast=fast, **settings) == expected
    single = hf_layerfusion.translate(model, tokenizer, SOURCES, batch_size=3, fast=fast, num_beams=4, max_new_tokens=6)
    assert single == [hypotheses[0] for hypotheses in expected]  # one hypothesis: one string per sentence


@pytest.mark.parametrize("training", [True, False])
def test_translate_leaves_the_training_mode_as_it_was(tokenizer, training):
    model = tiny_model("plain_transformer").train(training)
    hf_layerfusion.translate(model, tokenizer, SOURCES[:2], max_new_tokens=2)
    assert model.training is training
    assert all(module.training is training for module in model.modules())


@pytest.mark.parametrize("fast", [True, False], ids=["fast", "generate"])
def test_a_left_padding_tokenizer_gives_each_sentence_its_own_translation(fast):
    """Fault round: with a tokenizer that pads on the left, a sentence's translation depended on the longer sentences
    sorted into its batch (left padding shifts a source's positions, as in Marian). translate() pads on the right
    whatever the tokenizer's side: batched and one by one agree, and equal the right-padding tokenizer's."""
    left = tiny_tokenizer()
    left.padding_side = "left"
    model = tiny_model("gtrans")
    settings = dict(num_beams=2, max_new_tokens=6, fast=fast)
    batched = hf_layerfusion.translate(model, left, SOURCES, batch_size=len(SOURCES), **settings)
    assert batched == [hf_layerfusion.translate(model, left, [source], **settings)[0] for source in SOURCES]
    assert batched == hf_layerfusion.translate(model, tiny_tokenizer(), SOURCES, batch_size=len(SOURCES), **settings)
    assert left.padding_side == "left"  # the caller's tokenizer is left as it was


def test_stop_strings_stop_fast_generate_and_translate_as_they_stop_generate():
    """Fault round: `stop_strings` failed in `fast_generate` and `translate()` ("could not locate a tokenizer"), since
    transformers' `custom_generate` hook does not pass the tokenizer on. The fast path now runs `generate()` for
    them, and `translate()` hands `generate()` its tokenizer.

    The stop string is the first word of a greedy translation of two words or more, so that greedy search must stop
    there: the check that the string took effect holds for any weights. (A beam search may still prefer a beam
    that never met the string, so beams are compared with generate() only.)"""
    model, tokenizer, sources = varied_gtrans()
    batch = tokenizer(sources, padding=True, return_tensors="pt")
    greedy = hf_layerfusion.translate(model, tokenizer, sources, fast=False, num_beams=1, max_new_tokens=10)
    stop = next(text for text in greedy if len(text.split()) > 1).split()[0]
    for num_beams in (1, 2):
        settings = dict(num_beams=num_beams, max_new_tokens=10)
        with torch.no_grad():
            expected = model.generate(**batch, stop_strings=[stop], tokenizer=tokenizer, **settings)
        assert torch.equal(hf_layerfusion.fast_generate(model, **batch, stop_strings=[stop], tokenizer=tokenizer,
                                                        **settings), expected)
        texts = [text.strip() for text in tokenizer.batch_decode(expected, skip_special_tokens=True)]
        if num_beams == 1:
            assert texts != greedy  # the stop string stopped a translation
        for fast in (True, False):
            assert hf_layerfusion.translate(model, tokenizer, sources, batch_size=len(sources), fast=fast,
                                            stop_strings=[stop], **settings) == texts


def test_max_new_tokens_beyond_the_position_table_is_refused_before_translating(tokenizer):
    """Fault round: a max_new_tokens the decoder's position table cannot hold failed only where a translation ran
    that long (the whole batch lost, the message naming max_length), or gave what stopped earlier. Refused up front
    by name; the table's own size decodes (the decoder reads the start token and all but the last new token)."""
    model = tiny_model("plain_transformer")
    positions = model.config.max_position_embeddings
    with pytest.raises(ValueError, match=rf"max_new_tokens={positions + 1} exceeds .*max_position_embeddings="
                                         rf"{positions}.*at most {positions}"):
        hf_layerfusion.translate(model, tokenizer, SOURCES, max_new_tokens=positions + 1)
    full = hf_layerfusion.translate(model, tokenizer, SOURCES, max_new_tokens=positions, min_new_tokens=positions,
                                    num_beams=1)
    assert len(full) == len(SOURCES)


def test_sources_cut_at_the_length_limit_are_counted_in_one_warning_per_call(tokenizer, caplog):
    """Issue 73: sources longer than `max_source_length` (default: the position table) were cut without a word. Each
    call that cuts says so once, naming how many sentences and the limit; a sentence exactly at the limit is whole."""
    model = tiny_model("plain_transformer")
    lengths = [len(tokenizer(source)["input_ids"]) for source in SOURCES]

    def cut_warnings(sentences, **kwargs) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="hf_layerfusion.translation.translate"):
            hf_layerfusion.translate(model, tokenizer, sentences, batch_size=1, num_beams=1, max_new_tokens=4, **kwargs)
        return [record.getMessage() for record in caplog.records if "longer than" in record.getMessage()]

    assert cut_warnings(SOURCES, max_source_length=max(lengths)) == []
    warnings = cut_warnings(SOURCES, max_source_length=max(lengths) - 1)
    assert len(warnings) == 1, warnings  # one for the call, not one per sentence or batch
    assert f"{lengths.count(max(lengths))} of 4 sentence(s) are longer than max_source_length={max(lengths) - 1} " \
        "tokens" in warnings[0]
    positions = model.config.max_position_embeddings  # the default limit
    long_sentence = " ".join(["abba baab"] * positions)
    warnings = cut_warnings([long_sentence, SOURCES[0], long_sentence])
    assert len(warnings) == 1 and f"2 of 3 sentence(s) are longer than max_source_length={positions}" in warnings[0]


def test_a_multilingual_model_translates_into_the_target_language_it_is_given():
    """Fault round: `translate()` with a multilingual model (its tokenizer holds `<2xx>` tags) and untagged sentences
    answered in whichever language the model drifted to. `tgt_lang` prepends the tag (as `translate_to` and the
    pipeline do); without it every sentence must carry its own tag, and the first that does not is named."""
    tokenizer, model = tiny_tokenizer(language_tags=True), tiny_model("gtrans")
    settings = dict(num_beams=2, max_new_tokens=6)
    into_german = hf_layerfusion.translate(model, tokenizer, SOURCES, tgt_lang="de", **settings)
    assert into_german == hf_layerfusion.translate(model, tokenizer, [f"<2de> {s}" for s in SOURCES], **settings)
    assert into_german != hf_layerfusion.translate(model, tokenizer, SOURCES, tgt_lang="en", **settings)
    with pytest.raises(ValueError, match=r"Sentence 1 \('abba baab ab'\) has no target-language tag.*tgt_lang="):
        hf_layerfusion.translate(model, tokenizer, ["<2en> ab", SOURCES[1]], **settings)
    with pytest.raises(ValueError, match=r"no <2fr> token \(its target languages: de, en\)"):
        hf_layerfusion.translate(model, tokenizer, SOURCES, tgt_lang="fr", **settings)
    # a one-direction model's tokenizer has no tags: nothing to choose, and tgt_lang names a tag it lacks
    with pytest.raises(ValueError, match=r"no <2de> token \(its target languages: none\)"):
        hf_layerfusion.translate(model, tiny_tokenizer(), SOURCES, tgt_lang="de", **settings)


# the translate command decoding with generate() itself: no kernels to compile
COMMAND_SETTINGS = ["--generate", "--num_beams=1", "--max_new_tokens=4", "--device=cpu"]


def saved_gtrans(tokenizer, directory):
    model = tiny_model("gtrans")
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return model


def test_the_translate_command_ends_lines_alike_in_a_file_and_on_stdin(tokenizer, tmp_path, monkeypatch):
    """Issue 73: a lone `\\r` ended a line of an --input file (read with universal newlines) but not of stdin, which
    gave one sentence where the file gave three. Both now give the lines `translate()` translates."""
    model = saved_gtrans(tokenizer, tmp_path / "model")
    text = b"ab ba\rb\r\nabba\n"
    (tmp_path / "input.txt").write_bytes(text)
    translate_command.main([str(tmp_path / "model"), f"--input={tmp_path / 'input.txt'}",
                            f"--output={tmp_path / 'from_file.txt'}", *COMMAND_SETTINGS])
    monkeypatch.setattr(sys, "stdin", piped_stdin(text))
    translate_command.main([str(tmp_path / "model"), f"--output={tmp_path / 'from_stdin.txt'}", *COMMAND_SETTINGS])
    expected = hf_layerfusion.translate(model, tokenizer, ["ab ba", "b", "abba"], fast=False, num_beams=1,
                                        max_new_tokens=4)
    for output in ("from_file.txt", "from_stdin.txt"):
        assert (tmp_path / output).read_text(encoding="utf-8") == "".join(f"{line}\n" for line in expected), output


def test_the_translate_command_appends_to_the_file_its_stdout_is_appended_to(tokenizer, tmp_path):
    """Issue 73: `--output /dev/stdout --overwrite` with stdout appended to a file (`>> log.txt`) renamed a temporary
    file over log.txt, whose earlier lines were lost. The translations now go where the shell's `>>` asked, with
    `--overwrite` or without it (a special file is written into, nothing is replaced)."""
    model = saved_gtrans(tokenizer, tmp_path / "model")
    (tmp_path / "input.txt").write_text("ab ba\nb\n", encoding="utf-8")
    log = tmp_path / "log.txt"
    log.write_text("an earlier run\n", encoding="utf-8")
    for overwrite in (["--overwrite"], []):
        with open(log, "ab") as appended, stdout_redirected_to(appended.fileno()):
            translate_command.main([str(tmp_path / "model"), f"--input={tmp_path / 'input.txt'}",
                                    "--output=/dev/stdout", *overwrite, *COMMAND_SETTINGS])
    expected = hf_layerfusion.translate(model, tokenizer, ["ab ba", "b"], fast=False, num_beams=1, max_new_tokens=4)
    assert log.read_text(encoding="utf-8") == "an earlier run\n" + "".join(f"{line}\n" for line in expected) * 2


@pytest.mark.parametrize(
    "engine", [dict(fast=True), dict(fast=True, quantization="int8"), dict(fast=False)], ids=["fast", "int8", "generate"]
)
def test_batches_translated_side_by_side_give_the_translations_of_one_at_a_time(tokenizer, engine):
    """`inter_threads=3`: 6 batches of one sentence in 3 threads at once, each with one of torch's 3 threads (the same
    thread count as one at a time with `torch.set_num_threads(1)`): the same translations, in input order, and
    torch's thread count set back afterwards."""
    model = tiny_model("gtrans")
    sources = SOURCES + ["ba ab", "aab b"]
    settings = dict(batch_size=1, num_beams=2, max_new_tokens=6, **engine)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one_at_a_time = hf_layerfusion.translate(model, tokenizer, sources, **settings)
        torch.set_num_threads(3)
        side_by_side = hf_layerfusion.translate(model, tokenizer, sources, inter_threads=3, **settings)
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
    assert len(set(one_at_a_time)) > 1  # the sentences' translations differ: a shuffle would show
    assert side_by_side == one_at_a_time


@pytest.mark.parametrize("inter_threads", [0, -1, 1.5, True])
def test_inter_threads_must_be_a_positive_int(tokenizer, inter_threads):
    with pytest.raises((TypeError, ValueError), match="inter_threads"):
        hf_layerfusion.translate(tiny_model("plain_transformer"), tokenizer, SOURCES, inter_threads=inter_threads)


def test_the_kernels_release_the_gil_while_they_compute(kernels):
    """A Python thread runs while the kernels compute (`translate(..., inter_threads=N)` needs it): it counts during
    one long int8 product on one thread; a kernel holding the GIL would let it count nothing."""
    import threading

    from hf_layerfusion.inference.inference_copies import Int8Linear

    linear, x = Int8Linear(torch.randn(2048, 1024), torch.randn(2048)), torch.randn(4096, 1024)
    started, done, counted = threading.Event(), threading.Event(), [0]

    def count():
        started.set()
        while not done.is_set():
            counted[0] += 1

    before = torch.get_num_threads()
    counter = threading.Thread(target=count)
    try:
        torch.set_num_threads(1)
        counter.start()
        started.wait()
        at_start = counted[0]
        linear(x)
        during = counted[0] - at_start
    finally:
        done.set()
        counter.join()
        torch.set_num_threads(before)
    assert during > 1000, during


def test_the_translate_command_keeps_blank_lines_blank_without_translating_them(tokenizer, tmp_path, monkeypatch):
    """Audit: a blank input line was translated into whatever the model invents for an empty source. As with Marian
    or CTranslate2, a blank line (empty, or spaces only) gives an empty line, the lines stay aligned, and an input of
    blank lines only gives as many empty lines without loading the model."""
    model = saved_gtrans(tokenizer, tmp_path / "model")
    settings = dict(fast=False, num_beams=1, max_new_tokens=4)
    assert hf_layerfusion.translate(model, tokenizer, [""], **settings) != [""]  # what the model makes of nothing
    (tmp_path / "input.txt").write_text("ab ba\n\n  \nb\n", encoding="utf-8")
    translate_command.main([str(tmp_path / "model"), f"--input={tmp_path / 'input.txt'}",
                            f"--output={tmp_path / 'output.txt'}", *COMMAND_SETTINGS])
    first, second = hf_layerfusion.translate(model, tokenizer, ["ab ba", "b"], **settings)
    assert (tmp_path / "output.txt").read_text(encoding="utf-8") == f"{first}\n\n\n{second}\n"

    def no_model(*args, **kwargs):
        raise AssertionError("the model was loaded for blank lines")

    monkeypatch.setattr(translate_command.AutoModelForSeq2SeqLM, "from_pretrained", no_model)
    (tmp_path / "blank.txt").write_text("\n \n", encoding="utf-8")
    translate_command.main([str(tmp_path / "model"), f"--input={tmp_path / 'blank.txt'}",
                            f"--output={tmp_path / 'blank_out.txt'}", *COMMAND_SETTINGS])
    assert (tmp_path / "blank_out.txt").read_text(encoding="utf-8") == "\n\n"


@pytest.mark.parametrize("through_link", [False, True], ids=["same-path", "symlink"])
def test_the_translate_command_refuses_to_write_the_file_its_stdin_reads(tokenizer, tmp_path, monkeypatch,
                                                                         through_link):
    """Before, `--output src.txt --overwrite < src.txt` replaced the source with its translations, while `--input
    src.txt --output src.txt` was refused. stdin redirected from the output file (or a link to it) is refused alike,
    and the source is left as it was."""
    saved_gtrans(tokenizer, tmp_path / "model")
    source = tmp_path / "src.txt"
    source.write_text("ab ba\nb\n", encoding="utf-8")
    output = source
    if through_link:
        output = tmp_path / "link.txt"
        output.symlink_to(source)
    with open(source, encoding="utf-8") as stdin:
        monkeypatch.setattr(sys, "stdin", stdin)
        with pytest.raises(ValueError, match=rf"--output '.*{output.name}' is the file stdin is read from"):
            translate_command.main([str(tmp_path / "model"), f"--output={output}", "--overwrite", *COMMAND_SETTINGS])
    assert source.read_text(encoding="utf-8") == "ab ba\nb\n"
    # another file of the same directory is no input
    monkeypatch.setattr(sys, "stdin", open(source, encoding="utf-8"))
    try:
        translate_command.main([str(tmp_path / "model"), f"--output={tmp_path / 'other.txt'}", *COMMAND_SETTINGS])
    finally:
        sys.stdin.close()
    assert len((tmp_path / "other.txt").read_text(encoding="utf-8").splitlines()) == 2


@pytest.mark.parametrize("option, default", [("--input", "read stdin"), ("--output", "write to stdout")])
def test_the_translate_command_refuses_an_empty_path(tokenizer, tmp_path, capsys, option, default):
    """Before, `--output ""` wrote to stdout and `--input ""` read stdin without a word, as if the option were left
    out. An empty path is refused naming the option."""
    saved_gtrans(tokenizer, tmp_path / "model")
    (tmp_path / "input.txt").write_text("ab ba\n", encoding="utf-8")
    args = {"--input": str(tmp_path / "input.txt"), "--output": str(tmp_path / "output.txt"), option: ""}
    with pytest.raises(SystemExit):
        translate_command.main([str(tmp_path / "model"), *(f"{name}={value}" for name, value in args.items()),
                                *COMMAND_SETTINGS])
    assert f"{option} is an empty path: name a file, or leave {option} out to {default}." in capsys.readouterr().err
    assert not (tmp_path / "output.txt").exists()
