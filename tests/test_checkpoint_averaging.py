"""Checkpoint averaging: the averaged model is the element-wise mean of the newest N checkpoints."""

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from huggingface_hub.utils import filter_repo_objects
from safetensors.torch import load_file
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedTokenizerFast

from hf_layerfusion import GTransConfig, GTransForConditionalGeneration
from hf_layerfusion.hub.remote_code import UPLOAD_IGNORE_PATTERNS
from hf_layerfusion.training.checkpoint_averaging import last_checkpoints, main


def tiny_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    words = ["<s>", "<pad>", "</s>", "<unk>"] + [f"w{i}" for i in range(vocab_size - 4)]
    tokenizer = Tokenizer(WordLevel({word: i for i, word in enumerate(words)}, unk_token="<unk>"))
    tokenizer.pre_tokenizer = WhitespaceSplit()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )


@pytest.fixture
def trainer_output_dir(tmp_path, tiny_backbone):
    """checkpoint-9, checkpoint-10 and checkpoint-100 (numeric, not lexicographic order matters) of one GTrans
    whose weights differ per checkpoint; the newest also holds a tokenizer and a custom generation config."""
    model = GTransForConditionalGeneration(GTransConfig(**tiny_backbone, encoder_group_size=1, decoder_group_size=1))
    for step in (9, 10, 100):
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.add_(torch.randn_like(parameter))
        model.generation_config.num_beams = 3
        model.save_pretrained(tmp_path / f"checkpoint-{step}")
    tiny_tokenizer(tiny_backbone["vocab_size"]).save_pretrained(tmp_path / "checkpoint-100")
    (tmp_path / "checkpoint-final").mkdir()  # not a checkpoint-<step> dir: ignored
    return tmp_path


def test_last_checkpoints_sorted_by_step(trainer_output_dir):
    assert [p.name for p in last_checkpoints(trainer_output_dir, 2)] == ["checkpoint-10", "checkpoint-100"]
    with pytest.raises(ValueError, match="holds 3"):
        last_checkpoints(trainer_output_dir, 4)
    with pytest.raises(ValueError, match="at least 1, got 0"):
        last_checkpoints(trainer_output_dir, 0)


def test_average_is_elementwise_mean(trainer_output_dir, tmp_path_factory):
    output_dir = tmp_path_factory.mktemp("averaged")
    main(["--checkpoint_dir", str(trainer_output_dir), "--num_checkpoints", "2", "--output_dir", str(output_dir)])

    # reference: the raw safetensors files of the two newest checkpoints, averaged here
    newest = [load_file(trainer_output_dir / f"checkpoint-{step}" / "model.safetensors") for step in (10, 100)]
    averaged_file = load_file(output_dir / "model.safetensors")
    assert set(averaged_file) == set(newest[0])
    for name, tensor in averaged_file.items():
        torch.testing.assert_close(tensor, (newest[0][name] + newest[1][name]) / 2, rtol=0, atol=1e-6)
    oldest = load_file(trainer_output_dir / "checkpoint-9" / "model.safetensors")
    assert not torch.allclose(
        averaged_file["model.shared.weight"], (oldest["model.shared.weight"] + newest[1]["model.shared.weight"]) / 2
    )

    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    assert isinstance(model, GTransForConditionalGeneration)
    # tied weights stay one tensor: output projection = shared embedding = encoder/decoder embeddings
    assert model.lm_head.weight.data_ptr() == model.model.shared.weight.data_ptr()
    torch.testing.assert_close(model.lm_head.weight, averaged_file["model.shared.weight"])
    assert model.generation_config.num_beams == 3
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    assert tokenizer.pad_token_id == 1 and len(tokenizer) == model.config.vocab_size


def test_a_failed_save_leaves_the_output_dir_as_it_was(trainer_output_dir, tmp_path_factory, monkeypatch):
    """The averaged model is saved in a temporary directory beside `output_dir` and moved in only when complete: a
    save that fails halfway (here the tokenizer's, after the model's) leaves `output_dir`'s files and nothing else."""
    parent = tmp_path_factory.mktemp("parent")
    output_dir = parent / "averaged"
    output_dir.mkdir()
    (output_dir / "notes.txt").write_text("keep me\n", encoding="utf-8")

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(PreTrainedTokenizerFast, "save_pretrained", full_disk)
    with pytest.raises(OSError, match=r"averaged.*disk is full.*No space left"):
        main(["--checkpoint_dir", str(trainer_output_dir), "--num_checkpoints", "2", "--output_dir", str(output_dir),
              "--overwrite_output_dir"])
    assert sorted(path.name for path in parent.iterdir()) == ["averaged"]  # no staging dir left behind
    assert sorted(path.name for path in output_dir.iterdir()) == ["notes.txt"]
    monkeypatch.undo()
    main(["--checkpoint_dir", str(trainer_output_dir), "--num_checkpoints", "2", "--output_dir", str(output_dir),
          "--overwrite_output_dir"])
    assert {"notes.txt", "model.safetensors", "config.json", "tokenizer.json"} <= {p.name for p in output_dir.iterdir()}
    assert sorted(path.name for path in parent.iterdir()) == ["averaged"]


def test_a_killed_averaging_leaves_nothing_push_to_hub_uploads_and_the_next_one_names_it(trainer_output_dir,
                                                                                          tmp_path_factory):
    """Issue 73: an averaging killed while saving (here the process exits in the tokenizer's save, after the model's,
    with no clean-up, as SIGKILL does) leaves its temporary dir beside `output_dir`, in the run dir as in the README.
    Pushing that run uploads none of it (upload_folder's own filter, with transformers' `Trainer.push_to_hub`
    patterns and the package's), and the next averaging into `output_dir` names it in a warning."""
    run = tmp_path_factory.mktemp("run")
    output_dir = run / "averaged"
    killed = textwrap.dedent(f"""
        import os
        from transformers import PreTrainedTokenizerFast
        PreTrainedTokenizerFast.save_pretrained = lambda *args, **kwargs: os._exit(9)
        from hf_layerfusion.training.checkpoint_averaging import main
        main(["--checkpoint_dir", {str(trainer_output_dir)!r}, "--num_checkpoints", "2", "--output_dir",
              {str(output_dir)!r}])
    """)
    result = subprocess.run([sys.executable, "-c", killed], capture_output=True, text=True, timeout=300)
    assert result.returncode == 9, result.stderr[-3000:]
    left = sorted(str(path.relative_to(run)) for path in run.rglob("*") if path.is_file())
    assert any(path.endswith("model.safetensors") for path in left), left
    for patterns in (["_*", "checkpoint-*"], UPLOAD_IGNORE_PATTERNS):
        assert list(filter_repo_objects(left, ignore_patterns=patterns)) == [], patterns
    (leftover,) = {Path(path).parts[0] for path in left}
    with pytest.warns(UserWarning, match=rf"{re.escape(leftover)}.*killed"):
        main(["--checkpoint_dir", str(trainer_output_dir), "--num_checkpoints", "2", "--output_dir", str(output_dir)])
    assert (output_dir / "model.safetensors").is_file()


@pytest.mark.parametrize("overwrite", ["no", 1, None])
def test_overwrite_must_be_a_switch(trainer_output_dir, tmp_path_factory, overwrite):
    """Before, `overwrite="no"` (truthy) averaged into a non-empty output dir; a non-bool is refused by name before
    anything is written."""
    from hf_layerfusion.training.checkpoint_averaging import average_last_checkpoints

    parent = tmp_path_factory.mktemp("parent")
    output_dir = parent / "averaged"
    output_dir.mkdir()
    (output_dir / "notes.txt").write_text("keep me\n", encoding="utf-8")
    with pytest.raises(TypeError, match=rf"`overwrite` must be True or False, got {overwrite!r}"):
        average_last_checkpoints(trainer_output_dir, 2, output_dir, overwrite=overwrite)
    assert sorted(path.name for path in output_dir.iterdir()) == ["notes.txt"]
    assert sorted(path.name for path in parent.iterdir()) == ["averaged"]  # no staging dir either
