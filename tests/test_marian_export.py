"""`to_marian` and `export_ctranslate2`: a plain Transformer of this package leaves it as the `MarianMTModel` (and
the CTranslate2 model) that computes the same translations."""

import errno
import re
from pathlib import Path

import pytest
import torch
from helpers import EOS, PAD, tiny_marian, tiny_model, tiny_tokenizer
from transformers import MarianMTModel

import hf_layerfusion


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_to_marian_computes_what_the_plain_model_computes(attn_implementation):
    model = tiny_model("plain_transformer", attn_implementation=attn_implementation)
    marian = hf_layerfusion.to_marian(model)
    assert isinstance(marian, MarianMTModel) and not marian.training
    assert marian.config._attn_implementation == attn_implementation
    # two sources, the second padded: padding must be masked alike
    batch = dict(
        input_ids=torch.tensor([[5, 9, 13, 7, EOS], [11, 4, EOS, PAD, PAD]]),
        attention_mask=torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]),
    )
    decoder_input_ids = torch.tensor([[EOS, 5, 7, 9], [EOS, 11, 4, 6]])
    with torch.no_grad():
        expected = model(**batch, decoder_input_ids=decoder_input_ids).logits
        logits = marian(**batch, decoder_input_ids=decoder_input_ids).logits
    assert expected.abs().max() > 1.0
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=0)
    kwargs = dict(num_beams=3, max_new_tokens=6, min_new_tokens=6)
    assert marian.generate(**batch, **kwargs).tolist() == model.generate(**batch, **kwargs).tolist()

    # a copy: training the model further does not change the exported one
    with torch.no_grad():
        model.model.shared.weight.add_(1.0)
    torch.testing.assert_close(marian(**batch, decoder_input_ids=decoder_input_ids).logits, logits)


def test_from_marian_of_to_marian_gives_the_weights_back(tmp_path):
    marian = tiny_marian("eager")
    model = hf_layerfusion.from_marian(marian, model_type="plain_transformer")
    exported = hf_layerfusion.to_marian(model)
    exported.save_pretrained(tmp_path)
    reloaded = MarianMTModel.from_pretrained(tmp_path)
    for key, value in marian.state_dict().items():
        torch.testing.assert_close(reloaded.state_dict()[key], value, atol=0, rtol=0, msg=key)
    assert reloaded.generation_config.to_diff_dict() == model.generation_config.to_diff_dict()


@pytest.mark.parametrize("num_beams", [1, 4])
def test_ctranslate2_float32_translates_as_generate(tmp_path, num_beams):
    ctranslate2 = pytest.importorskip("ctranslate2")
    tokenizer = tiny_tokenizer()
    # seed 5: a tiny random model whose translations differ between sentences and positions (checked below)
    model = tiny_model("plain_transformer", seed=5, vocab_size=len(tokenizer))
    path = hf_layerfusion.export_ctranslate2(model, tokenizer, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(path), device="cpu")
    sources = ["ab ba abba", "baab ab", "a b"]
    batch = tokenizer(sources, padding=True, return_tensors="pt")
    new_tokens = 7  # every engine decodes exactly this many tokens: the comparison covers 7 steps per sentence
    generated = model.generate(**batch, num_beams=num_beams, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
    expected = [tokenizer.convert_ids_to_tokens(row[1:]) for row in generated.tolist()]  # without the start token
    results = translator.translate_batch(
        [tokenizer.convert_ids_to_tokens(tokenizer(s)["input_ids"]) for s in sources],
        beam_size=num_beams, max_decoding_length=new_tokens, min_decoding_length=new_tokens, return_end_token=True,
    )
    assert [result.hypotheses[0] for result in results] == expected
    assert len({tuple(row) for row in expected}) > 1 and len({token for row in expected for token in row}) > 1


def test_ctranslate2_int8_export_loads(tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    tokenizer = tiny_tokenizer()
    model = tiny_model("plain_transformer", vocab_size=len(tokenizer))
    (tmp_path / "empty").mkdir()  # an existing empty directory is accepted
    path = hf_layerfusion.export_ctranslate2(model, tokenizer, tmp_path / "empty", quantization="int8")
    translator = ctranslate2.Translator(str(path), device="cpu", compute_type="int8")
    result = translator.translate_batch([["ab", "▁ba", "</s>"]], max_decoding_length=5)
    assert len(result[0].hypotheses[0]) > 0


def test_ctranslate2_export_command_line(tmp_path, capsys):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from hf_layerfusion.inference import ctranslate2_export

    tokenizer = tiny_tokenizer()
    model = tiny_model("plain_transformer", seed=3, vocab_size=len(tokenizer))
    model.save_pretrained(tmp_path / "plain")
    tokenizer.save_pretrained(tmp_path / "plain")
    ctranslate2_export.main(["--model_dir", str(tmp_path / "plain"), "--output_dir", str(tmp_path / "ct2")])
    assert "Wrote the CTranslate2 model" in capsys.readouterr().out
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu")
    batch = tokenizer(["baab ab"], return_tensors="pt")
    generated = model.generate(**batch, max_new_tokens=5, min_new_tokens=5)
    result = translator.translate_batch([tokenizer.convert_ids_to_tokens(batch["input_ids"][0])], max_decoding_length=5,
                                        min_decoding_length=5, return_end_token=True)
    assert result[0].hypotheses[0] == tokenizer.convert_ids_to_tokens(generated[0, 1:])


@pytest.mark.parametrize("target_exists", [True, False], ids=["link-to-empty-dir", "dangling-link"])
def test_ctranslate2_export_writes_through_a_symbolic_link(tmp_path, target_exists):
    """Issue 73: an output dir that is a symbolic link (to an empty directory, or to one not made yet) failed once
    the whole conversion was done (CTranslate2 replaces its output dir with `shutil.rmtree`, which refuses a link);
    the model is now written into the directory the link points at, and the link stays."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    tokenizer = tiny_tokenizer()
    model = tiny_model("plain_transformer", seed=3, vocab_size=len(tokenizer))
    target, link = tmp_path / "models" / "ct2", tmp_path / "ct2-link"
    if target_exists:
        target.mkdir(parents=True)
    link.symlink_to(target)
    assert hf_layerfusion.export_ctranslate2(model, tokenizer, link) == link
    assert link.is_symlink() and (target / "model.bin").is_file()
    translator = ctranslate2.Translator(str(link), device="cpu")
    batch = tokenizer(["baab ab"], return_tensors="pt")
    generated = model.generate(**batch, max_new_tokens=5, min_new_tokens=5)
    result = translator.translate_batch([tokenizer.convert_ids_to_tokens(batch["input_ids"][0])], max_decoding_length=5,
                                        min_decoding_length=5, return_end_token=True)
    assert result[0].hypotheses[0] == tokenizer.convert_ids_to_tokens(generated[0, 1:])


@pytest.mark.parametrize("existing", [False, True], ids=["new-dir", "empty-dir"])
def test_a_failed_ctranslate2_save_leaves_the_output_dir_as_it_was(tmp_path, monkeypatch, existing):
    """Before, the converter saved straight into the output dir, so a save that failed halfway (a full disk) left a
    partial model there, and the retry was refused with advice to pass an option (--overwrite_output_dir) the export
    does not have. It now saves beside it and moves the files in only when complete: a failure leaves the output dir
    as it was and no temporary directory, names the reason, and the retry writes the model."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from ctranslate2.specs import model_spec

    tokenizer = tiny_tokenizer()
    model = tiny_model("plain_transformer", seed=3, vocab_size=len(tokenizer))
    parent = tmp_path / "models"
    output_dir = parent / "ct2"
    if existing:
        output_dir.mkdir(parents=True)

    def full_disk(self, directory):
        (Path(directory) / "config.json").write_text("{}")  # a first file written, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(model_spec.ModelSpec, "save", full_disk)
    with pytest.raises(OSError, match=r"CTranslate2 model '.*ct2'.*disk is full.*Nothing of it is left there"):
        hf_layerfusion.export_ctranslate2(model, tokenizer, output_dir)
    assert sorted(path.name for path in parent.iterdir()) == (["ct2"] if existing else [])
    assert not existing or list(output_dir.iterdir()) == []
    monkeypatch.undo()
    assert hf_layerfusion.export_ctranslate2(model, tokenizer, output_dir) == output_dir
    assert sorted(path.name for path in parent.iterdir()) == ["ct2"]
    ctranslate2.Translator(str(output_dir), device="cpu")


def test_a_non_empty_ctranslate2_output_dir_is_refused_without_naming_an_option_it_lacks(tmp_path):
    """The refusal said "pass --overwrite_output_dir", an option neither `export_ctranslate2` nor its command has."""
    tokenizer = tiny_tokenizer()
    model = tiny_model("plain_transformer", seed=3, vocab_size=len(tokenizer))
    model.save_pretrained(tmp_path / "plain")
    tokenizer.save_pretrained(tmp_path / "plain")
    (tmp_path / "ct2").mkdir()
    (tmp_path / "ct2" / "notes.txt").write_text("keep me\n")
    from hf_layerfusion.inference import ctranslate2_export

    for call in (
        lambda: hf_layerfusion.export_ctranslate2(model, tokenizer, tmp_path / "ct2"),
        lambda: ctranslate2_export.main(
            ["--model_dir", str(tmp_path / "plain"), "--output_dir", str(tmp_path / "ct2")]),
    ):
        with pytest.raises(FileExistsError) as raised:
            call()
        assert re.search(r"ct2' already exists and is not empty \(\['notes\.txt'\]\); choose another directory or "
                         r"empty it\.$", str(raised.value)), raised.value
    assert [path.name for path in (tmp_path / "ct2").iterdir()] == ["notes.txt"]
