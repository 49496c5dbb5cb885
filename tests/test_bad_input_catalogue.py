"""Catalogue of bad inputs (issue 11): one row per mistake a user can make through the API or the command-line
scripts. Every row must raise the given error type with a message that names the bad value, and must leave every
file of the shared workspace (tiny models, checkpoints, corpora, the model dir a CLI is pointed at) unchanged: no
file written, replaced or deleted.
"""

from __future__ import annotations

import ast
import copy
import errno
import hashlib
import json
import os
import re
import shutil
import socket
import stat
import sys
import tempfile
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import huggingface_hub.constants
import pytest
import safetensors.torch
import torch
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    MarianConfig,
    MarianMTModel,
    Seq2SeqTrainingArguments,
    TrainerState,
    XLMRobertaConfig,
    XLMRobertaModel,
)

import hf_layerfusion
from hf_layerfusion import (
    DeepRepresentationsConfig,
    GTransConfig,
    GTransForConditionalGeneration,
    LayerFusionConfig,
    LayerwiseCoordinationConfig,
    PlainTransformerConfig,
    PlainTransformerForConditionalGeneration,
    ReTransformerConfig,
    RTALConfig,
    from_marian,
    from_xlmr,
    load_xlmr_tokenizer,
    train_joint_tokenizer,
    translate,
)
from hf_layerfusion import file_checks
from hf_layerfusion.file_checks import (
    check_local_or_hub,
    check_not_in_use,
    check_output_dir,
    check_output_file,
    check_result_files,
    check_save_directory,
    lock_output_dir,
    read_utf8,
    write_file_atomically,
)
from hf_layerfusion.modeling import input_checks
from hf_layerfusion.modeling.input_checks import check_decoder_groups, check_model_inputs, check_positive_int
from hf_layerfusion.modeling.registry import check_model_type
from hf_layerfusion.inference import ctranslate2_export
from hf_layerfusion.inference.cpu_kernels import KERNEL_DIRECTORY, build_kernels
from hf_layerfusion.training import checkpoint_averaging
from hf_layerfusion.training.callbacks import plot_logged_series
from hf_layerfusion.training.checkpoint_averaging import average_last_checkpoints, last_checkpoints
from hf_layerfusion.training.trainer import LayerFusionSeq2SeqTrainer
from hf_layerfusion.training.data import (
    builtin_number_corpus,
    load_json_lines_translation,
    load_parallel_text,
    load_translation_dataset,
    preprocess_translation,
)
from hf_layerfusion.translation.language_tags import add_language_tags
from hf_layerfusion.translation.tokenizer import load_tokenizer

from helpers import TINY_BACKBONE

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
import run_multilingual  # noqa: E402
import run_translation  # noqa: E402
import translate as translate_script  # noqa: E402

SENTENCES = ["a man rides a bike", "two dogs play", "ein mann fährt rad", "zwei hunde spielen"] * 5
GROUPS = dict(encoder_group_size=1, decoder_group_size=1)  # 2 + 2 layers: 2 decoder groups
SCORES = "direction_scores.json"  # run_multilingual.py's result file


def _tiny(config_class, vocab_size, **overrides):
    return config_class(**{**TINY_BACKBONE, "vocab_size": vocab_size, **overrides})


def _with(config, **attributes):
    """`config` with attributes set after it was built (no check runs until a model is built from it)."""
    for key, value in attributes.items():
        setattr(config, key, value)
    return config


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """The shared workspace: tiny models and tokenizer saved in dirs, checkpoints, corpora, and a few files."""
    root = tmp_path_factory.mktemp("catalogue")
    tokenizer = train_joint_tokenizer(SENTENCES, 40)
    vocab = len(tokenizer)
    gtrans = GTransForConditionalGeneration(_tiny(GTransConfig, vocab, **GROUPS)).eval()
    plain = PlainTransformerForConditionalGeneration(_tiny(PlainTransformerConfig, vocab)).eval()
    gtrans_dir, plain_dir = root / "gtrans", root / "plain"
    for model, directory in ((gtrans, gtrans_dir), (plain, plain_dir)):
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)
    marian_dir = root / "marian"
    MarianMTModel(
        MarianConfig(
            vocab_size=vocab, decoder_vocab_size=vocab, d_model=16, encoder_layers=2, decoder_layers=2,
            encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
            max_position_embeddings=32, pad_token_id=1, decoder_start_token_id=2, eos_token_id=2,
        )
    ).save_pretrained(marian_dir)
    xlmr_dir = root / "xlmr"
    XLMRobertaModel(
        XLMRobertaConfig(
            vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=24, type_vocab_size=1, layer_norm_eps=1e-5,
        ),
        add_pooling_layer=False,
    ).save_pretrained(xlmr_dir)
    checkpoints = root / "run"
    for step in (1, 2):
        gtrans.save_pretrained(checkpoints / f"checkpoint-{step}")
    corpus = root / "corpus"
    corpus.mkdir()
    (corpus / "train.en").write_text("a man\ntwo dogs\n", encoding="utf-8")
    (corpus / "train.de").write_text("ein mann\n", encoding="utf-8")  # one line short
    (corpus / "latin1.en").write_bytes("caf\xe9\n".encode("latin-1"))
    (corpus / "latin1.de").write_text("cafe\n", encoding="utf-8")
    (corpus / "bad.jsonl").write_text('{"translation": {"en": "a", "de": "b"}}\n{"en": "a"}\n', encoding="utf-8")
    texts = root / "texts"  # plain text only (a corpus dir with *.jsonl files is read as JSON lines)
    texts.mkdir()
    for name, text in (("train.en", "a man\n"), ("train.de", "ein mann\n"), ("README.md", "not a language\n")):
        (texts / name).write_text(text, encoding="utf-8")
    (root / "input.en").write_text("a man\ntwo dogs\n", encoding="utf-8")
    (root / "empty.en").write_text("", encoding="utf-8")
    (root / "full").mkdir()
    (root / "full" / "notes.txt").write_text("keep me\n", encoding="utf-8")
    (root / "a_file").write_text("not a directory\n", encoding="utf-8")
    broken_config_dir = root / "broken_config"
    plain.save_pretrained(broken_config_dir)
    (broken_config_dir / "config.json").write_text("{not json", encoding="utf-8")
    finished = root / "finished"  # a finished run: its model, tokenizer and result files
    gtrans.save_pretrained(finished)
    tokenizer.save_pretrained(finished)
    for name in ("bleu_results.json", SCORES):
        (finished / name).write_text('{"scores": {}}\n', encoding="utf-8")
    damaged = _damaged_files(root, plain, tokenizer)
    inconsistent = _inconsistent_checkpoints(root, plain, gtrans)
    carded = root / "carded"  # a published model dir: its card and a plot of the run (issue 40)
    gtrans.save_pretrained(carded)
    (carded / "README.md").write_text("the previous card\n", encoding="utf-8")
    (carded / "fusion_weights.png").write_bytes(b"the previous plot")
    card_linked = root / "card_linked"  # README.md a link to the model's own config.json
    gtrans.save_pretrained(card_linked)
    (card_linked / "README.md").symlink_to("config.json")
    multilingual_dir = root / "multilingual"  # a model whose tokenizer holds target-language tags
    tagged_tokenizer = copy.deepcopy(tokenizer)
    add_language_tags(tagged_tokenizer, ["de", "fr"])
    gtrans.save_pretrained(multilingual_dir)
    tagged_tokenizer.save_pretrained(multilingual_dir)
    busy = root / "busy"  # an output dir that a run is writing into, held for the whole module
    busy_lock = lock_output_dir(busy)
    busy_lock.__enter__()
    return SimpleNamespace(
        root=root, tokenizer=tokenizer, vocab=vocab, gtrans=gtrans, plain=plain, gtrans_dir=gtrans_dir,
        plain_dir=plain_dir, marian_dir=marian_dir, xlmr_dir=xlmr_dir, checkpoints=checkpoints, corpus=corpus,
        texts=texts, input=root / "input.en", empty_input=root / "empty.en", full=root / "full", a_file=root / "a_file",
        broken_config_dir=broken_config_dir, finished=finished, busy=busy, busy_lock=busy_lock, carded=carded,
        card_linked=card_linked, multilingual_dir=multilingual_dir, tagged_tokenizer=tagged_tokenizer, **damaged,
        **inconsistent,
    )


def _snapshot(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        for path in sorted(root.rglob("*"))
    }


@dataclass
class Row:
    id: str
    call: Callable
    error: type
    message: str  # regex the message must match: it names the bad value


def _offline(function, *args):
    """Call with the Hub in offline mode: a Hub lookup fails at once instead of retrying a network that the tests do
    not have."""
    with mock.patch.object(huggingface_hub.constants, "HF_HUB_OFFLINE", True):
        return function(*args)


def _batch(ws, **overrides):
    batch = ws.tokenizer(["a man", "two dogs play"], padding=True, return_tensors="pt")
    return {**batch, "labels": batch["input_ids"], **overrides}


# ---------------------------------------------------------------------------------------------- the CLIs' argv
def _rt_args(ws, *extra, output_dir=None):
    return [
        "--builtin_corpus", "--builtin_num_train=20", "--builtin_num_valid=4", "--builtin_num_test=4",
        f"--output_dir={output_dir or ws.root / 'new_run'}", "--do_train", "--max_steps=1", "--use_cpu=True",
        "--report_to=none", "--tokenizer_vocab_size=40", *extra,
    ]


def _ml_args(ws, *extra, output_dir=None):
    return [
        "--dataset=multi30k", f"--multi30k_dir={ws.corpus}", f"--xlmr={ws.xlmr_dir}", "--preset=none",
        f"--output_dir={output_dir or ws.root / 'new_ml'}", "--do_train", "--use_cpu=True", "--report_to=none", *extra,
    ]


def _tr_args(ws, *extra):
    return [str(ws.gtrans_dir), f"--input={ws.input}", *extra]


def _launched_on_gpus(main, argv):
    """`main(argv)` in a process that a launcher (`accelerate launch`, `torchrun`) started as one of 64 processes
    on this machine (LOCAL_WORLD_SIZE; no LOCAL_RANK, so nothing tries to join a process group): more than any
    machine running the suite has GPUs. tests/test_readme.py runs the real `accelerate launch` command."""
    with mock.patch.dict(os.environ, {"LOCAL_WORLD_SIZE": "64"}):
        return main([arg for arg in argv if arg != "--use_cpu=True"])


def _read_only(directory, call):
    """`call()` while `directory` reports itself read-only to `os.access`, as on a read-only mount (the tests run
    as root, whom permission bits do not stop)."""
    access = os.access

    def read_only_access(path, mode, **kwargs):
        return False if Path(path).resolve() == Path(directory).resolve() else access(path, mode, **kwargs)

    with mock.patch("os.access", read_only_access):
        return call()


def _disk_full(call):
    """`call()` on a disk that fills before a written file's data reaches it (`fsync` fails with ENOSPC)."""
    with mock.patch("os.fsync", side_effect=OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))):
        return call()


def _rt_eval_args(ws, *extra, model=None, output_dir=None):
    """run_translation.py arguments of a run that only evaluates `model` (default: the GTrans dir), with
    generate()'s own loop (no kernels to compile should the check be missing)."""
    argv = _rt_args(ws, f"--model_name_or_path={model or ws.gtrans_dir}", "--do_eval", "--fast_generation=False",
                    "--max_new_tokens=4", *extra, output_dir=output_dir)
    return [arg for arg in argv if arg != "--do_train"]


def _trainer_checkpoint(ws) -> Path:
    """A checkpoint the Trainer wrote (with trainer_state.json) of a GTrans run, outside the workspace."""
    return _loading_dirs(ws).trainer_run / "checkpoint-2"


def _rt_data_args(ws, *extra):
    """run_translation.py arguments with a local corpus instead of the built-in one."""
    return [arg for arg in _rt_args(ws, "--model_type=gtrans") if "builtin" not in arg] + list(extra)


def _damaged_files(root: Path, plain, tokenizer) -> dict[str, Path]:
    """Model dirs with a damaged file (a weight file cut short or with overwritten header bytes, a `tokenizer.json`
    cut short, no tokenizer at all) and Trainer output dirs whose checkpoints are not of one model (issue 40)."""
    dirs = {name: root / name for name in ("truncated_weights", "corrupt_weights", "truncated_tokenizer", "no_tokenizer")}
    for directory in dirs.values():
        plain.save_pretrained(directory)
        if directory.name != "no_tokenizer":
            tokenizer.save_pretrained(directory)
    weights = (dirs["truncated_weights"] / "model.safetensors").read_bytes()
    (dirs["truncated_weights"] / "model.safetensors").write_bytes(weights[:-100])
    (dirs["corrupt_weights"] / "model.safetensors").write_bytes(weights[:8] + b"\xff" * 16 + weights[24:])
    text = (dirs["truncated_tokenizer"] / "tokenizer.json").read_text(encoding="utf-8")
    (dirs["truncated_tokenizer"] / "tokenizer.json").write_text(text[: len(text) // 2], encoding="utf-8")
    vocab = plain.config.vocab_size
    runs = {  # checkpoint-1, checkpoint-2 of each run
        "mixed_families_run": (plain, GTransForConditionalGeneration(_tiny(GTransConfig, vocab, **GROUPS))),
        "mixed_activations_run": (plain, PlainTransformerForConditionalGeneration(
            _tiny(PlainTransformerConfig, vocab, activation_function="gelu"))),
        "mixed_sizes_run": (plain, PlainTransformerForConditionalGeneration(
            _tiny(PlainTransformerConfig, vocab, encoder_ffn_dim=48))),
        "damaged_weights_run": (plain, plain),
        "damaged_tokenizer_run": (plain, plain),
    }
    for name, models in runs.items():
        for step, model in enumerate(models, start=1):
            model.save_pretrained(root / name / f"checkpoint-{step}")
            tokenizer.save_pretrained(root / name / f"checkpoint-{step}")
        dirs[name] = root / name
    (root / "damaged_weights_run" / "checkpoint-1" / "model.safetensors").write_bytes(weights[:-100])
    (root / "damaged_tokenizer_run" / "checkpoint-2" / "tokenizer.json").write_text(text[:100], encoding="utf-8")
    dirs["adapter_run"] = root / "adapter_run"  # a PEFT run's checkpoints: adapter files, no model config
    for step in (1, 2):
        checkpoint = dirs["adapter_run"] / f"checkpoint-{step}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "adapter_config.json").write_text('{"peft_type": "LORA"}', encoding="utf-8")
    dirs["step_typo_run"] = root / "step_typo_run"  # `checkpoint-5x`: transformers reads it as step 5
    plain.save_pretrained(dirs["step_typo_run"] / "checkpoint-1")
    plain.save_pretrained(dirs["step_typo_run"] / "checkpoint-5x")
    return dirs


def _inconsistent_checkpoints(root: Path, plain, gtrans) -> dict[str, Path]:
    """Model dirs that load without transformers refusing them but are not the model they claim (issue 40): a NaN
    weight, a tensor gone, a config.json edited after saving (`model_type` gtrans -> plain_transformer with or
    without GTrans' keys, `normalize_before` flipped on a post-norm model, a misspelt key) and a
    `generation_config.json` cut short."""
    def edited(name: str, model, edit_weights=None, **config_changes) -> Path:
        directory = root / name
        model.save_pretrained(directory)
        if edit_weights is not None:
            weights = safetensors.torch.load_file(directory / "model.safetensors")
            edit_weights(weights)
            safetensors.torch.save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})
        if config_changes:
            config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
            for key, value in config_changes.items():
                if value is None:
                    config.pop(key, None)
                else:
                    config[key] = value
            (directory / "config.json").write_text(json.dumps(config), encoding="utf-8")
        return directory

    fc1 = "model.encoder.layers.0.ffn.fc1.weight"
    dirs = {
        "nan_weights": edited("nan_weights", plain, lambda weights: weights[fc1].view(-1)[3].fill_(float("nan"))),
        "missing_tensor": edited("missing_tensor", plain, lambda weights: weights.pop(fc1)),
        "model_type_edited": edited("model_type_edited", gtrans, model_type="plain_transformer"),
        "model_type_edited_plain": edited(
            "model_type_edited_plain", gtrans, model_type="plain_transformer", auto_map=None,
            architectures=["PlainTransformerForConditionalGeneration"],
            **dict.fromkeys(set(gtrans.config.to_dict()) - set(plain.config.to_dict())),
        ),
        "normalize_before_flipped": edited("normalize_before_flipped", plain, normalize_before=True),
        "misspelt_config_key": edited("misspelt_config_key", gtrans, decoder_fusoin=False),
        "truncated_generation_config": edited("truncated_generation_config", plain),
    }
    generation_config = dirs["truncated_generation_config"] / "generation_config.json"
    generation_config.write_text(generation_config.read_text(encoding="utf-8")[:20], encoding="utf-8")
    return dirs


def _train_onto_full_disk(ws, full_disk=RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos "
                                                     "191616 vs 191504")):
    """Train a tiny model one step with a checkpoint save that meets a full disk: `torch.save` fails as it does on a
    full file system (this message seen on a full tmpfs; or with `full_disk`, another refusal of the file system),
    in a directory outside the workspace."""
    model = PlainTransformerForConditionalGeneration(_tiny(PlainTransformerConfig, ws.vocab))
    pairs = [{"input_ids": torch.tensor([4, 5, 2]), "labels": torch.tensor([5, 4, 2])}] * 2
    with tempfile.TemporaryDirectory() as output_dir, torch.enable_grad(), mock.patch("torch.save", side_effect=full_disk):
        args = Seq2SeqTrainingArguments(output_dir, max_steps=1, save_steps=1, per_device_train_batch_size=2,
                                        report_to="none", use_cpu=True)
        LayerFusionSeq2SeqTrainer(model=model, args=args, train_dataset=pairs).train()


def _loading_dirs(ws) -> SimpleNamespace:
    """Issue 73's dirs for loading, averaging and resuming, built at their first use beside the workspace (the rows
    only read them): a weight saved as integers, a GTrans checkpoint lacking a fusion tensor, a GTrans config.json
    typed 'rtal', a Trainer run (checkpoints with trainer_state.json), copies of it holding as `checkpoint-3` an
    averaged model or a model saved by hand, and a run whose two checkpoints have different tokenizers."""
    if hasattr(ws, "loading"):
        return ws.loading
    root = ws.root.with_name(f"{ws.root.name}_loading")
    dirs = SimpleNamespace(**{name: root / name for name in (
        "integer_weight", "missing_fusion_tensor", "typed_rtal", "trainer_run", "averaged_in_run", "hand_saved_in_run",
        "mixed_tokenizers_run")})

    def edit_weights(directory: Path, edit) -> None:
        weights = safetensors.torch.load_file(directory / "model.safetensors")
        edit(weights)
        safetensors.torch.save_file(weights, directory / "model.safetensors", metadata={"format": "pt"})

    fc1 = "model.encoder.layers.0.ffn.fc1.weight"
    ws.plain.save_pretrained(dirs.integer_weight)
    edit_weights(dirs.integer_weight, lambda weights: weights.update({fc1: (weights[fc1] * 100).round().long()}))
    ws.gtrans.save_pretrained(dirs.missing_fusion_tensor)
    edit_weights(dirs.missing_fusion_tensor, lambda weights: weights.pop("model.decoder.readout.group_weight"))
    ws.gtrans.save_pretrained(dirs.typed_rtal)
    config = json.loads((dirs.typed_rtal / "config.json").read_text(encoding="utf-8"))
    (dirs.typed_rtal / "config.json").write_text(json.dumps({**config, "model_type": "rtal"}), encoding="utf-8")
    for step in (1, 2):
        checkpoint = dirs.trainer_run / f"checkpoint-{step}"
        ws.gtrans.save_pretrained(checkpoint)
        ws.tokenizer.save_pretrained(checkpoint)
        TrainerState(global_step=step).save_to_json(str(checkpoint / "trainer_state.json"))
    shutil.copytree(dirs.trainer_run, dirs.hand_saved_in_run)
    ws.gtrans.save_pretrained(dirs.hand_saved_in_run / "checkpoint-3")
    shutil.copytree(dirs.trainer_run, dirs.averaged_in_run)
    average_last_checkpoints(dirs.trainer_run, 2, root / "averaged")
    (root / "averaged").rename(dirs.averaged_in_run / "checkpoint-3")
    other_tokenizer = train_joint_tokenizer(["three cats sleep", "drei katzen schlafen"] * 5, 30)
    for step, tokenizer in ((1, ws.tokenizer), (2, other_tokenizer)):
        ws.gtrans.save_pretrained(dirs.mixed_tokenizers_run / f"checkpoint-{step}")
        tokenizer.save_pretrained(dirs.mixed_tokenizers_run / f"checkpoint-{step}")
    ws.loading = dirs
    return dirs


def _io73_with_special_file(kind: str, call):
    """`call(path)` of a FIFO or a Unix socket made in a directory of its own (the workspace's snapshot reads
    regular files only)."""
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / kind
        if kind == "fifo":
            os.mkfifo(path)
        else:
            with socket.socket(socket.AF_UNIX) as server:
                server.bind(str(path))
        return call(path)


def _io73_output_into_read_only_descriptor(ws):
    """`--output /dev/fd/N` where descriptor N holds the workspace's input, opened for reading."""
    with open(ws.input, "rb") as source:
        return check_output_file(f"/dev/fd/{source.fileno()}")


def _io73_write_into_pipe_without_reader():
    """`write_file_atomically` of /dev/fd/N, the writing end of a pipe whose reader is gone (a device such as
    /dev/full would be replaced by a regular file if the check went missing: the suite runs as root)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return write_file_atomically(f"/dev/fd/{write_end}", "new text\n")
    finally:
        os.close(write_end)


def _io73_translate_stdin(data: bytes, argv):
    from helpers import piped_stdin

    with mock.patch("sys.stdin", piped_stdin(data)):
        return translate_script.main(argv)


def _io73_push(ws, cut_hub_code=False):
    """`push_to_hub` of a complete model repository (made outside the workspace; its Hub code cut in the middle of
    the file if asked) to an endpoint where nothing listens: port 9 on this machine refuses at once."""
    with tempfile.TemporaryDirectory() as directory, \
            mock.patch.object(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9"):
        ws.gtrans.save_pretrained(directory)
        ws.tokenizer.save_pretrained(directory)
        hf_layerfusion.write_model_card(directory, ws.gtrans, "en", "de", "tiny")
        if cut_hub_code:  # cut after an opening parenthesis past the middle: never valid Python, whatever the code
            code = Path(directory) / "modeling_layerfusion.py"
            text = code.read_bytes()
            code.write_bytes(text[: text.index(b"(", len(text) // 2) + 1])
        return hf_layerfusion.push_to_hub(directory, "you/gtrans-en-de", token="hf_test_token")


def _fastpath_before_any_copy(call):
    """`call()` where making an inference copy fails: a search setting is refused before the copy (int8: the whole
    model quantized) is made."""
    copying = mock.Mock(side_effect=RuntimeError("an inference copy was made before the arguments were checked"))
    with mock.patch.object(hf_layerfusion.inference.fast_generation, "prepare_for_inference", copying), \
            mock.patch.object(hf_layerfusion.translation.translate, "prepare_for_inference", copying), \
            mock.patch.object(hf_layerfusion.hub.pipeline, "prepare_for_inference", copying):
        return call()


ROWS = [
    # ------------------------------------------------------------------ decoder groups (validation unit rows)
    Row("groups-str", lambda ws: check_decoder_groups("12", 3), ValueError, r"'12'"),
    Row("groups-float", lambda ws: check_decoder_groups([1.7], 3), ValueError, r"1\.7"),
    Row("groups-bool", lambda ws: check_decoder_groups([True], 3), ValueError, r"True"),
    Row("groups-empty", lambda ws: check_decoder_groups([], 3), ValueError, r"empty"),
    Row("groups-zero", lambda ws: check_decoder_groups([0, 1], 3), ValueError, r"\[0\]"),
    Row("groups-too-high", lambda ws: check_decoder_groups([4], 3), ValueError, r"\[1, 3\].*\[4\]"),
    Row("groups-repeated", lambda ws: check_decoder_groups([2, 2], 3), ValueError, r"repeats.*\[2\]"),
    Row("groups-scalar", lambda ws: check_decoder_groups(2, 3), ValueError, r"got 2 \(int\)"),
    Row("groups-float-tensor", lambda ws: check_decoder_groups(torch.tensor([1.5]), 3), ValueError, r"1\.5"),
    Row("groups-none-item", lambda ws: check_decoder_groups([None], 3), ValueError, r"None"),
    Row("groups-str-item", lambda ws: check_decoder_groups(["1"], 3), ValueError, r"'1'"),
    Row("groups-negative", lambda ws: check_decoder_groups((-1,), 3), ValueError, r"-1"),
    # ------------------------------------------------------------------ model inputs (validation unit rows)
    Row("ids-1d", lambda ws: check_model_inputs(ws.gtrans.config, torch.tensor([4, 5, 2])), ValueError,
        r"shape \(3,\).*unsqueeze"),
    Row("ids-3d", lambda ws: check_model_inputs(ws.gtrans.config, torch.ones(1, 2, 3, dtype=torch.long)),
        ValueError, r"\(1, 2, 3\)"),
    Row("ids-float", lambda ws: check_model_inputs(ws.gtrans.config, torch.ones(2, 3)), TypeError, r"float32"),
    Row("ids-bool", lambda ws: check_model_inputs(ws.gtrans.config, torch.ones(2, 3, dtype=torch.bool)),
        TypeError, r"torch\.bool"),
    Row("ids-list", lambda ws: check_model_inputs(ws.gtrans.config, [[4, 5]]), TypeError, r"list"),
    Row("ids-empty-batch", lambda ws: check_model_inputs(ws.gtrans.config, torch.ones(0, 5, dtype=torch.long)),
        ValueError, r"empty batch.*\(0, 5\)"),
    Row("ids-zero-length", lambda ws: check_model_inputs(ws.gtrans.config, torch.ones(2, 0, dtype=torch.long)),
        ValueError, r"empty batch.*\(2, 0\)"),
    Row("ids-out-of-vocab", lambda ws: check_model_inputs(ws.gtrans.config, torch.tensor([[4, ws.vocab]])),
        ValueError, r"token id {vocab}.*\[0, {vocab}\)"),
    Row("ids-negative", lambda ws: check_model_inputs(ws.gtrans.config, torch.tensor([[4, -1]])), ValueError,
        r"token id -1"),
    Row("decoder-ids-out-of-vocab",
        lambda ws: check_model_inputs(ws.gtrans.config, torch.tensor([[99]]), name="decoder_input_ids"),
        ValueError, r"decoder_input_ids.*token id 99"),
    Row("mask-batch", lambda ws: check_model_inputs(ws.gtrans.config, torch.ones(3, 4, dtype=torch.long),
                                                    torch.ones(2, 4)), ValueError, r"\(2, 4\).*\(3, 4\)"),
    Row("mask-length", lambda ws: check_model_inputs(ws.gtrans.config, torch.ones(3, 4, dtype=torch.long),
                                                     torch.ones(3, 5)), ValueError, r"\(3, 5\)"),
    Row("mask-past-length",
        lambda ws: check_model_inputs(ws.gtrans.config, torch.ones(3, 1, dtype=torch.long), torch.ones(3, 1),
                                      name="decoder_input_ids", past_length=4),
        ValueError, r"decoder_attention_mask.*\(3, 1\).*4 cached.*\(3, 5\)"),
    Row("mask-3d", lambda ws: check_model_inputs(ws.gtrans.config, torch.ones(3, 4, dtype=torch.long),
                                                 torch.ones(3, 4, 4)), ValueError, r"2-D or 4-D.*\(3, 4, 4\)"),
    Row("mask-4d-batch", lambda ws: check_model_inputs(ws.gtrans.config, torch.ones(3, 4, dtype=torch.long),
                                                       torch.ones(2, 1, 4, 4)), ValueError, r"batch size 2.*3"),
    Row("mask-list", lambda ws: check_model_inputs(ws.gtrans.config, torch.ones(1, 2, dtype=torch.long), [[1, 1]]),
        TypeError, r"attention_mask.*list"),
    Row("ids-and-embeds", lambda ws: check_model_inputs(ws.gtrans.config, torch.ones(1, 2, dtype=torch.long),
                                                        inputs_embeds=torch.ones(1, 2, 16)), ValueError, r"not both"),
    Row("embeds-width", lambda ws: check_model_inputs(ws.gtrans.config, inputs_embeds=torch.ones(1, 2, 8)),
        ValueError, r"width 8.*16"),
    Row("embeds-2d", lambda ws: check_model_inputs(ws.gtrans.config, inputs_embeds=torch.ones(2, 16)),
        ValueError, r"\(2, 16\)"),
    # ------------------------------------------------------------------ numbers and paths (validation unit rows)
    Row("int-zero", lambda ws: check_positive_int(0, "batch_size"), ValueError, r"batch_size.*got 0"),
    Row("int-negative", lambda ws: check_positive_int(-3, "num_beams"), ValueError, r"num_beams.*-3"),
    Row("int-bool", lambda ws: check_positive_int(True, "num_beams"), ValueError, r"True"),
    Row("int-float", lambda ws: check_positive_int(1.5, "num_beams"), ValueError, r"1\.5"),
    Row("int-str", lambda ws: check_positive_int("3", "num_beams"), ValueError, r"'3'"),
    Row("output-file-is-input", lambda ws: check_output_file(ws.input, [ws.input]), ValueError,
        r"input\.en.*destroy"),
    Row("output-file-missing-dir", lambda ws: check_output_file(ws.root / "no_dir" / "out.de"), FileNotFoundError,
        r"no_dir"),
    Row("output-file-is-dir", lambda ws: check_output_file(ws.full), IsADirectoryError, r"full"),
    Row("output-dir-is-file", lambda ws: check_output_dir(ws.a_file), NotADirectoryError, r"a_file"),
    Row("output-dir-not-empty", lambda ws: check_output_dir(ws.full), FileExistsError, r"full.*notes\.txt"),
    Row("output-dir-is-input", lambda ws: check_output_dir(ws.gtrans_dir, [ws.gtrans_dir], overwrite=True),
        ValueError, r"gtrans.*overlaps"),
    Row("output-dir-empty-string", lambda ws: check_output_dir(""), ValueError, r"''"),
    Row("save-directory-file", lambda ws: check_save_directory(ws.a_file), FileExistsError, r"a_file"),
    # issue 40: never destroy a file (a model's own file, a read-only or full destination, a dir in use)
    Row("output-file-of-model", lambda ws: check_output_file(ws.gtrans_dir / "config.json", [ws.gtrans_dir]),
        ValueError, r"config\.json.*is a file of.*gtrans"),
    Row("output-file-read-only-dir", lambda ws: _read_only(ws.root, lambda: check_output_file(ws.root / "out.de")),
        PermissionError, r"out\.de.*not writable"),
    Row("output-file-read-only", lambda ws: _read_only(ws.a_file, lambda: check_output_file(ws.a_file)),
        PermissionError, r"a_file.*read-only"),
    Row("output-dir-read-only", lambda ws: _read_only(ws.root, lambda: check_output_dir(ws.root / "new_dir")),
        PermissionError, r"new_dir.*not writable"),
    Row("output-dir-in-use", lambda ws: check_not_in_use(ws.busy), RuntimeError,
        r"busy.*in use by another run \(pid \d+"),
    # two runs that passed their checks at once: the second one's lock is refused
    Row("output-dir-lock-taken", lambda ws: lock_output_dir(ws.busy).__enter__(), RuntimeError,
        r"busy.*in use by another run \(pid \d+"),
    Row("result-files-exist", lambda ws: check_result_files(ws.finished, ["bleu_results.json", "new.txt"]),
        FileExistsError, r"finished.*\['bleu_results\.json'\].*--overwrite_output_dir"),
    Row("result-file-of-model",
        lambda ws: check_result_files(ws.finished, ["bleu_results.json"], [ws.finished], overwrite=True),
        ValueError, r"bleu_results\.json.*is a file of.*finished"),
    Row("write-disk-full", lambda ws: _disk_full(lambda: write_file_atomically(ws.a_file, "new text\n")),
        OSError, r"a_file.*No space left on device.*unchanged"),
    Row("local-dot-missing", lambda ws: check_local_or_hub("./no_such_model", "model"), FileNotFoundError,
        r"no_such_model"),
    Row("local-abs-missing", lambda ws: check_local_or_hub(ws.root / "no_such_model", "model"), FileNotFoundError,
        r"no_such_model.*no such local directory"),
    Row("local-nested-missing", lambda ws: check_local_or_hub("runs/x/no_such_model", "model"), FileNotFoundError,
        r"runs/x/no_such_model"),
    Row("local-existing-parent", lambda ws: check_local_or_hub("tests/no_such_model", "model"), FileNotFoundError,
        r"tests/no_such_model"),
    Row("local-is-file", lambda ws: check_local_or_hub(ws.a_file, "model"), NotADirectoryError, r"a_file"),
    Row("local-not-str", lambda ws: check_local_or_hub(3, "model"), TypeError, r"int 3"),
    Row("local-empty", lambda ws: check_local_or_hub("", "model"), ValueError, r"model is empty"),
    Row("read-not-utf8", lambda ws: read_utf8(ws.corpus / "latin1.en"), ValueError, r"latin1\.en.*UTF-8"),
    Row("family-typo", lambda ws: check_model_type("gtrns"), ValueError, r"'gtrns'.*'gtrans'"),
    Row("family-transformers-model", lambda ws: check_model_type("marian"), ValueError, r"'marian'"),
    Row("family-none", lambda ws: check_model_type(None), ValueError, r"None"),
    # ------------------------------------------------------------------ configs
    Row("config-misspelt", lambda ws: GTransConfig(encoder_grup_size=2), TypeError,
        r"encoder_grup_size.*did you mean 'encoder_group_size'"),
    Row("config-other-family-key", lambda ws: PlainTransformerConfig(encoder_group_size=2), TypeError,
        r"encoder_group_size"),
    Row("config-backbone-misspelt", lambda ws: LayerFusionConfig(d_modle=16), TypeError, r"d_modle.*'d_model'"),
    Row("config-preset-misspelt", lambda ws: GTransConfig.from_preset("multi30k", decoder_grup_size=1), TypeError,
        r"decoder_grup_size"),
    Row("config-preset-unknown", lambda ws: GTransConfig.from_preset("big"), ValueError, r"'big'"),
    Row("config-auto-misspelt", lambda ws: AutoConfig.for_model("gtrans", encoder_grup_size=2), TypeError,
        r"encoder_grup_size"),
    Row("config-gtrans-json-as-plain", lambda ws: PlainTransformerConfig.from_pretrained(ws.gtrans_dir), ValueError,
        r"'gtrans' config.*encoder_group_size"),
    Row("config-inconsistent", lambda ws: GTransConfig(d_model=17), ValueError, r"17"),
    # switches (keys declared bool) take only True / False; float knobs are finite (issue 17)
    Row("config-switch-str-false", lambda ws: LayerwiseCoordinationConfig(share_layer_parameters="false"), ValueError,
        r"`share_layer_parameters` is a switch and must be True or False, got 'false'"),
    Row("config-switch-str-rtal", lambda ws: RTALConfig(encoder_aggregation="false"), ValueError,
        r"`encoder_aggregation` is a switch and must be True or False, got 'false'"),
    Row("config-switch-none", lambda ws: LayerwiseCoordinationConfig(mixed_attention=None), ValueError,
        r"`mixed_attention` is a switch and must be True or False, got None"),
    Row("config-switch-int", lambda ws: GTransConfig(encoder_fusion=1), ValueError,
        r"`encoder_fusion` is a switch and must be True or False, got 1"),
    Row("config-backbone-switch", lambda ws: PlainTransformerConfig(normalize_before="yes"), ValueError,
        r"`normalize_before` is a switch and must be True or False, got 'yes'"),
    Row("config-switch-set-after-build",
        lambda ws: PlainTransformerForConditionalGeneration(
            _with(_tiny(PlainTransformerConfig, 40), scale_embedding=0)
        ),
        ValueError, r"`scale_embedding` is a switch and must be True or False, got 0"),
    Row("config-float-nan", lambda ws: DeepRepresentationsConfig(diversity_weight=float("nan")), ValueError,
        r"`diversity_weight` must be a finite number, got nan"),
    Row("config-float-inf", lambda ws: GTransConfig(probability_temperature=float("inf")), ValueError,
        r"`probability_temperature` must be a finite number, got inf"),
    Row("config-backbone-float-nan", lambda ws: PlainTransformerConfig(init_std=float("nan")), ValueError,
        r"`init_std` must be a finite number, got nan"),
    # float knobs float32 cannot hold: a temperature of 1e-46 is 0 there (the mixture divides by it), 1e39 is inf
    Row("config-float32-underflow", lambda ws: GTransConfig(probability_temperature=1e-46), ValueError,
        r"`probability_temperature` must be 0 or of magnitude in .*float32, where 1e-46 is zero or denormal"),
    Row("config-float32-overflow", lambda ws: GTransConfig(fusion_weight_init=1e39), ValueError,
        r"`fusion_weight_init` must be 0 or of magnitude in .*float32, where 1e\+39 is infinite"),
    # a key set after the config is built is checked at once: the GTrans guard reads `allow_external_loss` only when
    # the loss is computed, and "no" is truthy (session of 2026-12-08)
    Row("config-switch-assigned",
        lambda ws: setattr(copy.deepcopy(ws.gtrans.config), "allow_external_loss", "no"),
        ValueError, r"`allow_external_loss` is a switch and must be True or False, got 'no'"),
    Row("config-alias-assigned", lambda ws: setattr(_tiny(PlainTransformerConfig, 40), "hidden_size", 2.5),
        ValueError, r"`hidden_size` must be of type int, got 2\.5 \(float\)"),
    # keywords of from_pretrained are set by transformers after the constructor's checks
    Row("config-from-pretrained-keyword-nan",
        lambda ws: AutoConfig.from_pretrained(ws.gtrans_dir, dropout=float("nan")),
        ValueError, r"`dropout` must be a finite number, got nan"),
    Row("config-from-pretrained-keyword-range",
        lambda ws: GTransConfig.from_pretrained(ws.gtrans_dir, dropout=5.0),
        ValueError, r"`dropout` must lie in \[0, 1\), got 5\.0"),
    # transformers' own switches are the defaults of every forward call
    Row("config-transformers-switch-str", lambda ws: PlainTransformerConfig(output_hidden_states="no"), ValueError,
        r"`output_hidden_states` must be of type bool \| None, got 'no' \(str\)"),
    Row("config-multi-layer-attention-k-unused", lambda ws: DeepRepresentationsConfig(multi_layer_attention_k=-7),
        ValueError, r"`multi_layer_attention_k` must be at least 2.*got -7"),
    Row("config-eos-empty-list", lambda ws: PlainTransformerConfig(eos_token_id=[]), ValueError,
        r"`eos_token_id` is an empty list"),
    Row("config-number-bool", lambda ws: PlainTransformerConfig(dropout=True), ValueError,
        r"`dropout` must be of type float \| int, got True \(bool\)"),
    Row("config-int-str", lambda ws: PlainTransformerConfig(encoder_layers="6"), ValueError,
        r"`encoder_layers` must be of type int, got '6' \(str\)"),
    Row("config-embedding-init", lambda ws: PlainTransformerConfig(embedding_init="fairseq"), ValueError,
        r"Unknown `embedding_init` 'fairseq'.*'rsqrt_d_model'"),
    Row("config-layout-no-self-attention", lambda ws: ReTransformerConfig(encoder_layout="f-f"), ValueError,
        r"`encoder_layout` 'f-f' has no self-attention sub-layer"),
    Row("config-layerwise-unshared-mixed", lambda ws: LayerwiseCoordinationConfig(unshared_cross_attention=True),
        ValueError, r"`unshared_cross_attention=True`.*`mixed_attention=True`"),
    # numbers that must be positive, token ids within the vocabulary, keys no family has (issue 40): before, accepted
    Row("config-layer-norm-eps-negative", lambda ws: PlainTransformerConfig(layer_norm_eps=-1.0), ValueError,
        r"`layer_norm_eps` must be a positive number, got -1\.0"),
    Row("config-init-std-negative", lambda ws: PlainTransformerConfig(init_std=-0.02), ValueError,
        r"`init_std` must be a positive number, got -0\.02"),
    Row("config-eos-beyond-vocab", lambda ws: PlainTransformerConfig(vocab_size=10, eos_token_id=10), ValueError,
        r"`eos_token_id` \(10\) must be a token id in \[0, vocab_size=10\)"),
    Row("config-eos-list-beyond-vocab",
        lambda ws: PlainTransformerConfig(vocab_size=10, eos_token_id=[2, 11], decoder_start_token_id=2), ValueError,
        r"`eos_token_id` \(\[2, 11\]\) must be a token id in \[0, vocab_size=10\)"),
    Row("config-bos-negative", lambda ws: PlainTransformerConfig(bos_token_id=-1), ValueError,
        r"`bos_token_id` \(-1\) must be a token id"),
    Row("config-decoder-start-beyond-vocab", lambda ws: GTransConfig(vocab_size=10, decoder_start_token_id=12),
        ValueError, r"`decoder_start_token_id` \(12\) must be a token id in \[0, vocab_size=10\)"),
    Row("config-forced-eos-beyond-vocab", lambda ws: PlainTransformerConfig(vocab_size=10, forced_eos_token_id=12),
        ValueError, r"`forced_eos_token_id` \(12\) must be a token id in \[0, vocab_size=10\)"),
    Row("config-json-misspelt-key", lambda ws: AutoConfig.from_pretrained(ws.misspelt_config_key), TypeError,
        r"\['decoder_fusoin'\] in this config\.json; 'decoder_fusoin': did you mean 'decoder_fusion'\?"),
    Row("config-json-other-family-key",
        lambda ws: PlainTransformerConfig.from_dict({"model_type": "plain_transformer", "encoder_group_size": 3}),
        TypeError, r"'encoder_group_size' \(gtrans\).*model_type"),
    # ------------------------------------------------------------------ converters
    Row("to-marian-fusion-family", lambda ws: hf_layerfusion.to_marian(ws.gtrans), ValueError, r"'gtrans'"),
    Row("to-marian-pre-norm", lambda ws: hf_layerfusion.to_marian(
        PlainTransformerForConditionalGeneration(_tiny(PlainTransformerConfig, ws.vocab, normalize_before=True))
    ), ValueError, r"'normalize_before': True"),
    Row("to-marian-not-a-model", lambda ws: hf_layerfusion.to_marian(ws.plain_dir), TypeError, r"PosixPath"),
    Row("ctranslate2-export-into-full-dir", lambda ws: hf_layerfusion.export_ctranslate2(ws.plain, ws.tokenizer, ws.full),
        FileExistsError, r"full"),
    Row("ctranslate2-export-onto-file", lambda ws: hf_layerfusion.export_ctranslate2(ws.plain, ws.tokenizer, ws.a_file),
        NotADirectoryError, r"a_file"),
    Row("ctranslate2-export-bad-quantization", lambda ws: hf_layerfusion.export_ctranslate2(
        ws.plain, ws.tokenizer, ws.root / "ct2_new", quantization="int9"), ValueError, r"int9"),
    Row("ctranslate2-cli-into-model-dir",
        lambda ws: ctranslate2_export.main(["--model_dir", str(ws.plain_dir), "--output_dir", str(ws.plain_dir)]),
        ValueError, r"plain'.*overlaps"),
    Row("ctranslate2-cli-fusion-family",
        lambda ws: ctranslate2_export.main(["--model_dir", str(ws.gtrans_dir), "--output_dir", str(ws.root / "ct2")]),
        ValueError, r"'gtrans'"),
    Row("ctranslate2-cli-missing-model",
        lambda ws: ctranslate2_export.main(["--model_dir", str(ws.root / "no_model"), "--output_dir", str(ws.root / "c")]),
        FileNotFoundError, r"no_model"),
    Row("ctranslate2-export-fusion-family", lambda ws: hf_layerfusion.export_ctranslate2(
        ws.gtrans, ws.tokenizer, ws.root / "ct2_new"), ValueError, r"'gtrans'"),
    Row("ctranslate2-export-quantization-not-a-name", lambda ws: hf_layerfusion.export_ctranslate2(
        ws.plain, ws.tokenizer, ws.root / "ct2_new", quantization=8), TypeError, r"8"),
    # the refusal advised "--overwrite_output_dir", an option neither the export nor its command has
    Row("ctranslate2-cli-into-full-dir",
        lambda ws: ctranslate2_export.main(["--model_dir", str(ws.plain_dir), "--output_dir", str(ws.full)]),
        FileExistsError,
        r"--output_dir '.*full' already exists and is not empty.*choose another directory or empty it\.$"),
    Row("marian-from-xlmr-dir", lambda ws: from_marian(ws.xlmr_dir), ValueError, r"'xlm-roberta'"),
    Row("marian-from-gtrans-dir", lambda ws: from_marian(ws.gtrans_dir), ValueError, r"'gtrans'"),
    Row("marian-unknown-family", lambda ws: from_marian(ws.marian_dir, model_type="gtrns"), ValueError,
        r"'gtrns'.*'gtrans'"),
    Row("marian-transformers-family", lambda ws: from_marian(ws.marian_dir, model_type="bart"), ValueError,
        r"'bart'.*families: \["),
    Row("marian-missing-dir", lambda ws: from_marian(ws.root / "no_marian"), FileNotFoundError, r"no_marian"),
    Row("marian-missing-relative", lambda ws: from_marian("./no_marian"), FileNotFoundError, r"no_marian"),
    Row("marian-misspelt-key", lambda ws: from_marian(ws.marian_dir, encoder_grup_size=1), TypeError,
        r"encoder_grup_size"),
    Row("marian-not-a-model", lambda ws: from_marian(123), TypeError, r"int"),
    Row("marian-unknown-hub-id-offline", lambda ws: _offline(from_marian, "no-such-org/no-such-marian"), OSError,
        r"'no-such-org/no-such-marian' is not a local directory.*Hub repo id"),
    Row("marian-bad-group-size", lambda ws: from_marian(ws.marian_dir, encoder_group_size=9), ValueError,
        r"encoder_group_size.*got 9"),
    # weights the layout has no place for (issue 37): before, dropped with no word
    Row("marian-layerwise-shared-cross-attention",
        lambda ws: from_marian(ws.marian_dir, model_type="layerwise_coordination", mixed_attention=False,
                               share_layer_parameters=False),
        ValueError, r"8 weights.*decoder\.layers\.\{{0,1\}}\.encoder_attn .*unshared_cross_attention=True"
                    r".*allow_dropped_weights=True"),
    Row("marian-layerwise-shared-layers",
        lambda ws: from_marian(ws.marian_dir, model_type="layerwise_coordination", mixed_attention=False,
                               unshared_cross_attention=True),
        ValueError, r"decoder\.layers\.\{{0,1\}}\.self_attn .*tied to model\.encoder.*share_layer_parameters=False"),
    Row("marian-re-transformer-layout",
        lambda ws: from_marian(ws.marian_dir, model_type="re_transformer", encoder_layout="s-sf"),
        ValueError, r"encoder\.layers\.\{{0\}}\.ffn .*no such parameter.*encoder_layout"),
    Row("xlmr-from-marian-dir", lambda ws: from_xlmr(ws.marian_dir), ValueError, r"'marian'"),
    Row("xlmr-unknown-family", lambda ws: from_xlmr(ws.xlmr_dir, model_type="gtrns"), ValueError, r"'gtrns'"),
    Row("xlmr-missing-dir", lambda ws: from_xlmr(ws.root / "no_xlmr"), FileNotFoundError, r"no_xlmr"),
    Row("xlmr-fixed-key", lambda ws: from_xlmr(ws.xlmr_dir, d_model=32), ValueError, r"d_model=32"),
    Row("xlmr-misspelt-key", lambda ws: from_xlmr(ws.xlmr_dir, **GROUPS, decoder_grup_size=1), TypeError,
        r"decoder_grup_size"),
    Row("xlmr-model-type-none", lambda ws: from_xlmr(ws.xlmr_dir, model_type=None), ValueError, r"None"),
    Row("xlmr-tokenizer-missing", lambda ws: load_xlmr_tokenizer(ws.root / "no_tok"), FileNotFoundError, r"no_tok"),
    Row("xlmr-instance-wrong", lambda ws: from_xlmr(ws.gtrans), ValueError, r"GTransForConditionalGeneration"),
    # ------------------------------------------------------------------ translate()
    Row("translate-str", lambda ws: translate(ws.gtrans, ws.tokenizer, "zwei"), TypeError, r"'zwei'.*list"),
    Row("translate-non-str-item", lambda ws: translate(ws.gtrans, ws.tokenizer, ["a", 3]), TypeError,
        r"sentences\[1\].*3"),
    Row("translate-multilingual-untagged", lambda ws: translate(ws.gtrans, ws.tagged_tokenizer, ["<2de> a", "a man"]),
        ValueError, r"Sentence 1 \('a man'\) has no target-language tag.*tgt_lang= \(one of de, fr\)"),
    Row("translate-unknown-tgt-lang", lambda ws: translate(ws.gtrans, ws.tagged_tokenizer, ["a"], tgt_lang="cs"),
        ValueError, r"no <2cs> token \(its target languages: de, fr\)"),
    Row("translate-batch-size", lambda ws: translate(ws.gtrans, ws.tokenizer, ["a"], batch_size=0), ValueError,
        r"batch_size.*0"),
    Row("translate-groups-str", lambda ws: translate(ws.gtrans, ws.tokenizer, ["a"], decoder_groups="12"),
        ValueError, r"'12'"),
    Row("translate-groups-float", lambda ws: translate(ws.gtrans, ws.tokenizer, ["a"], decoder_groups=[1.7]),
        ValueError, r"1\.7"),
    Row("translate-groups-range", lambda ws: translate(ws.gtrans, ws.tokenizer, ["a"], decoder_groups=[5]),
        ValueError, r"\[1, 2\].*\[5\]"),
    Row("translate-plain-groups", lambda ws: translate(ws.plain, ws.tokenizer, ["a"], decoder_groups=[2]),
        ValueError, r"\[1, 1\].*\[2\]"),
    Row("translate-beams", lambda ws: translate(ws.gtrans, ws.tokenizer, ["a"], num_beams=0), ValueError,
        r"num_beams.*0"),
    Row("translate-new-tokens", lambda ws: translate(ws.gtrans, ws.tokenizer, ["a"], max_new_tokens=-1),
        ValueError, r"max_new_tokens.*-1"),
    # issue 40: before, an IndexError / transformers' error naming no argument (2.5 was already refused by
    # check_positive_int; the issue's probe, kept here)
    Row("translate-empty", lambda ws: translate(ws.gtrans, ws.tokenizer, []), ValueError,
        r"`sentences` is empty \(0 sentences\)"),
    Row("translate-new-tokens-float", lambda ws: translate(ws.gtrans, ws.tokenizer, ["a"], max_new_tokens=2.5),
        ValueError, r"`max_new_tokens`.*got 2\.5"),
    Row("translate-return-sequences-zero",
        lambda ws: translate(ws.gtrans, ws.tokenizer, ["a"], num_beams=2, num_return_sequences=0), ValueError,
        r"`num_return_sequences`.*got 0"),
    # ------------------------------------------------------------------ tokenizer training
    Row("tokenizer-empty", lambda ws: train_joint_tokenizer([], 50), ValueError, r"no text.*0 sentences"),
    Row("tokenizer-blank", lambda ws: train_joint_tokenizer(["", " "], 50), ValueError, r"no text.*2 sentences"),
    Row("tokenizer-str", lambda ws: train_joint_tokenizer("abc def", 50), TypeError, r"'abc def'"),
    Row("tokenizer-non-str", lambda ws: train_joint_tokenizer(["a b", None], 50), TypeError, r"texts\[1\].*None"),
    Row("tokenizer-vocab", lambda ws: train_joint_tokenizer(SENTENCES, 3), ValueError, r"got 3"),
    Row("tokenizer-model", lambda ws: train_joint_tokenizer(SENTENCES, 50, model="wordpiece"), ValueError,
        r"'wordpiece'"),
    Row("tokenizer-special", lambda ws: train_joint_tokenizer(SENTENCES, 50, extra_special_tokens=["<s>"]),
        ValueError, r"'<s>'"),
    # before: a bare string became one special token per character (every "d" and "e" dropped when decoding); True
    # was a length of 1; a file as save_dir only logged, after training, and saved nothing
    Row("tokenizer-special-str", lambda ws: train_joint_tokenizer(SENTENCES, 50, extra_special_tokens="<2de>"),
        TypeError, r"got str '<2de>'; pass \['<2de>'\]"),
    Row("tokenizer-max-length-bool", lambda ws: train_joint_tokenizer(SENTENCES, 50, model_max_length=True),
        ValueError, r"`model_max_length`.*got True"),
    Row("tokenizer-save-dir-file", lambda ws: train_joint_tokenizer(SENTENCES, 50, save_dir=ws.a_file),
        NotADirectoryError, r"`save_dir` '.*a_file' is a file"),
    Row("tokenizer-save-dir-holds-one",
        lambda ws: train_joint_tokenizer(SENTENCES, 50, save_dir=ws.finished, overwrite=False),
        FileExistsError, r"finished' already holds a tokenizer.*overwrite=True"),
    # ------------------------------------------------------------------ data
    Row("data-not-utf8", lambda ws: load_parallel_text(ws.corpus / "latin1", "en", "de"), ValueError,
        r"latin1\.en.*UTF-8"),
    Row("data-relative-missing", lambda ws: load_translation_dataset("tests/no_corpus", src_lang="en", tgt_lang="de"),
        FileNotFoundError, r"tests/no_corpus"),
    Row("data-nested-missing", lambda ws: load_translation_dataset("data/m30k/no", src_lang="en", tgt_lang="de"),
        FileNotFoundError, r"data/m30k/no"),
    Row("data-jsonl-missing", lambda ws: load_translation_dataset("corpus.jsonl", src_lang="en", tgt_lang="de"),
        FileNotFoundError, r"corpus\.jsonl"),
    Row("data-same-language", lambda ws: load_parallel_text(ws.corpus, "en", "en"), ValueError, r"'en'"),
    Row("data-line-count", lambda ws: load_parallel_text(ws.corpus / "train", "en", "de"), ValueError,
        r"train\.en has 2 lines.*train\.de has 1"),
    Row("data-jsonl-row", lambda ws: load_json_lines_translation(ws.corpus / "bad.jsonl", "en", "de"), ValueError,
        r"bad\.jsonl:2"),
    Row("data-builtin-language", lambda ws: builtin_number_corpus("en", "xx"), ValueError, r"'xx'"),
    Row("data-builtin-size", lambda ws: builtin_number_corpus(num_train=-1), ValueError, r"'train'.*-1"),
    Row("data-max-length", lambda ws: preprocess_translation(builtin_number_corpus(num_train=2, num_valid=0,
                                                                                   num_test=0), ws.tokenizer,
                                                             "en", "de", max_source_length=0),
        ValueError, r"max_source_length.*0"),
    # before: True cut every source to </s>; None failed inside `map` naming nothing; a directory was "missing"
    Row("data-max-length-bool", lambda ws: preprocess_translation(builtin_number_corpus(num_train=2, num_valid=0,
                                                                                        num_test=0), ws.tokenizer,
                                                                  "en", "de", max_source_length=True),
        ValueError, r"`max_source_length`.*got True"),
    Row("data-source-prefix-none", lambda ws: preprocess_translation(builtin_number_corpus(num_train=2, num_valid=0,
                                                                                           num_test=0), ws.tokenizer,
                                                                     "en", "de", source_prefix=None),
        TypeError, r"`source_prefix`.*got None"),
    Row("data-directory-as-file", lambda ws: load_parallel_text({"train": (ws.corpus, ws.corpus / "train.de")},
                                                                "en", "de"),
        IsADirectoryError, r"corpus' is a directory"),
    # ------------------------------------------------------------------ checkpoint averaging (API and CLI)
    Row("average-into-checkpoint",
        lambda ws: average_last_checkpoints(ws.checkpoints, 2, ws.checkpoints / "checkpoint-2"), ValueError,
        r"checkpoint-2.*overlaps"),
    Row("average-inside-checkpoint",
        lambda ws: average_last_checkpoints(ws.checkpoints, 2, ws.checkpoints / "checkpoint-1" / "avg"), ValueError,
        r"checkpoint-1/avg.*overlaps"),
    Row("average-into-run-dir", lambda ws: average_last_checkpoints(ws.checkpoints, 2, ws.checkpoints),
        ValueError, r"run'.*overlaps"),
    Row("average-non-empty", lambda ws: average_last_checkpoints(ws.checkpoints, 2, ws.full), FileExistsError,
        r"full.*not empty"),
    # before, "no" (truthy) averaged into the non-empty dir
    Row("average-overwrite-not-a-switch",
        lambda ws: average_last_checkpoints(ws.checkpoints, 2, ws.full, overwrite="no"), TypeError,
        r"`overwrite` must be True or False, got 'no' \(str\)"),
    Row("average-output-file", lambda ws: average_last_checkpoints(ws.checkpoints, 2, ws.a_file), NotADirectoryError,
        r"a_file"),
    Row("average-zero", lambda ws: last_checkpoints(ws.checkpoints, 0), ValueError, r"got 0"),
    Row("average-too-many", lambda ws: last_checkpoints(ws.checkpoints, 5), ValueError, r"5 checkpoints.*holds 2"),
    Row("average-missing-dir", lambda ws: last_checkpoints(ws.root / "no_run", 1), FileNotFoundError, r"no_run"),
    Row("average-cli-into-checkpoint",
        lambda ws: checkpoint_averaging.main(["--checkpoint_dir", str(ws.checkpoints), "--num_checkpoints", "1",
                                              "--output_dir", str(ws.checkpoints / "checkpoint-2")]),
        ValueError, r"checkpoint-2.*overlaps"),
    Row("average-cli-non-empty",
        lambda ws: checkpoint_averaging.main(["--checkpoint_dir", str(ws.checkpoints), "--output_dir", str(ws.full),
                                              "--num_checkpoints", "1"]),
        FileExistsError, r"full"),
    # checkpoints that are not of one model (issue 40): before, averaged (GTrans fusion weights halved with nothing)
    Row("average-different-families",
        lambda ws: average_last_checkpoints(ws.mixed_families_run, 2, ws.root / "new_average"), ValueError,
        r"checkpoint-1'.*checkpoint-2'.*different families \('plain_transformer' vs 'gtrans'"),
    Row("average-different-activations",
        lambda ws: average_last_checkpoints(ws.mixed_activations_run, 2, ws.root / "new_average"), ValueError,
        r"checkpoint-1'.*checkpoint-2'.*activation_function: 'relu' vs 'gelu'"),
    Row("average-different-sizes",
        lambda ws: average_last_checkpoints(ws.mixed_sizes_run, 2, ws.root / "new_average"), ValueError,
        r"checkpoint-1'.*checkpoint-2'.*encoder_ffn_dim: 32 vs 48"),
    Row("average-peft-adapters",
        lambda ws: average_last_checkpoints(ws.adapter_run, 2, ws.root / "new_average"), ValueError,
        r"adapter_run/checkpoint-2'.*PEFT adapter.*merge_and_unload"),
    Row("average-step-not-a-number", lambda ws: last_checkpoints(ws.step_typo_run, 1), ValueError,
        r"checkpoint-5x'.*'5x' is not a number"),
    Row("average-damaged-weights",
        lambda ws: average_last_checkpoints(ws.damaged_weights_run, 2, ws.root / "new_average"), ValueError,
        r"damaged_weights_run/checkpoint-1/model\.safetensors'.*damaged or incomplete"),
    Row("average-cli-damaged-tokenizer",
        lambda ws: checkpoint_averaging.main(["--checkpoint_dir", str(ws.damaged_tokenizer_run), "--output_dir",
                                              str(ws.root / "new_average"), "--num_checkpoints", "2"]),
        ValueError, r"checkpoint-2/tokenizer\.json'.*not valid JSON"),
    # ------------------------------------------------------------------ examples/translate.py
    Row("translate-cli-output-is-input", lambda ws: translate_script.main(_tr_args(ws, f"--output={ws.input}")),
        ValueError, r"input\.en.*destroy"),
    # fault round: any existing file outside the model dir was replaced (another model's config, say)
    Row("translate-cli-output-exists", lambda ws: translate_script.main(_tr_args(ws, f"--output={ws.empty_input}")),
        FileExistsError, r"empty.*exists; pass --overwrite"),
    Row("translate-cli-output-missing-dir",
        lambda ws: translate_script.main(_tr_args(ws, f"--output={ws.root / 'no_dir' / 'out.de'}")),
        FileNotFoundError, r"no_dir"),
    Row("translate-cli-output-is-dir", lambda ws: translate_script.main(_tr_args(ws, f"--output={ws.full}")),
        IsADirectoryError, r"full"),
    Row("translate-cli-input-missing",
        lambda ws: translate_script.main([str(ws.gtrans_dir), f"--input={ws.root / 'no_input.en'}"]),
        FileNotFoundError, r"no_input\.en"),
    Row("translate-cli-input-not-utf8",
        lambda ws: translate_script.main([str(ws.gtrans_dir), f"--input={ws.corpus / 'latin1.en'}"]),
        ValueError, r"latin1\.en.*UTF-8"),
    Row("translate-cli-input-empty",
        lambda ws: translate_script.main([str(ws.gtrans_dir), f"--input={ws.empty_input}"]),
        ValueError, r"--input '.*empty\.en' holds no sentence"),
    Row("translate-cli-multilingual-untagged",
        lambda ws: translate_script.main([str(ws.multilingual_dir), f"--input={ws.input}"]),
        ValueError, r"Sentence 0 \('a man'\) has no target-language tag.*--tgt_lang \(one of de, fr\)"),
    Row("translate-cli-unknown-tgt-lang",
        lambda ws: translate_script.main([str(ws.multilingual_dir), f"--input={ws.input}", "--tgt_lang=cs"]),
        ValueError, r"no <2cs> token"),
    Row("translate-cli-model-missing", lambda ws: translate_script.main([str(ws.root / "no_model")]),
        FileNotFoundError, r"no_model"),
    Row("translate-cli-groups", lambda ws: translate_script.main(_tr_args(ws, "--decoder_groups", "5")),
        ValueError, r"\[5\]"),
    Row("translate-cli-groups-repeated", lambda ws: translate_script.main(_tr_args(ws, "--decoder_groups", "1", "1")),
        ValueError, r"repeats.*\[1\]"),
    Row("translate-cli-batch-size", lambda ws: translate_script.main(_tr_args(ws, "--batch_size=0")), ValueError,
        r"--batch_size.*0"),
    Row("translate-cli-beams", lambda ws: translate_script.main(_tr_args(ws, "--num_beams=0")), ValueError,
        r"--num_beams.*0"),
    Row("translate-cli-output-model-config",
        lambda ws: translate_script.main(_tr_args(ws, "--generate", f"--output={ws.gtrans_dir / 'config.json'}")),
        ValueError, r"--output.*config\.json.*is a file of.*gtrans"),
    Row("translate-cli-output-model-weights",
        lambda ws: translate_script.main(_tr_args(ws, "--generate", f"--output={ws.gtrans_dir / 'model.safetensors'}")),
        ValueError, r"--output.*model\.safetensors.*is a file of.*gtrans"),
    Row("translate-cli-output-read-only-dir",
        lambda ws: _read_only(ws.root, lambda: translate_script.main(_tr_args(ws, "--generate",
                                                                              f"--output={ws.root / 'out.de'}"))),
        PermissionError, r"--output.*out\.de.*not writable"),
    # the old file stays whole (the snapshot), and the error names it and the reason
    Row("translate-cli-output-disk-full",
        lambda ws: _disk_full(lambda: translate_script.main(_tr_args(ws, "--generate", "--overwrite",
                                                                     f"--output={ws.a_file}"))),
        OSError, r"--output.*a_file.*No space left on device.*unchanged"),
    # ------------------------------------------------------------------ examples/run_translation.py
    Row("train-cli-family-typo-into-model-dir",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrns", "--overwrite_output_dir=True",
                                                 output_dir=ws.gtrans_dir)), ValueError, r"'gtrns'"),
    Row("train-cli-into-model-dir", lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans",
                                                                             output_dir=ws.gtrans_dir)),
        FileExistsError, r"gtrans.*not empty.*--overwrite_output_dir"),
    # `last` with nothing to resume starts over: not over a finished model saved without checkpoints
    Row("train-cli-resume-last-into-model-dir",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--resume_from_checkpoint=last",
                                                 output_dir=ws.gtrans_dir)),
        FileExistsError, r"gtrans.*not empty.*--overwrite_output_dir"),
    Row("train-cli-override-misspelt",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--config_overrides=encoder_grup_size=1")),
        ValueError, r"'encoder_grup_size'"),
    Row("train-cli-override-inconsistent",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--config_overrides=encoder_group_size=9")),
        ValueError, r"encoder_group_size.*got 9"),
    Row("train-cli-override-switch-off",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=layerwise_coordination",
                                                 "--config_overrides=share_layer_parameters=off")),
        ValueError, r"share_layer_parameters='off'.*switch; give true or false"),
    Row("train-cli-override-switch-1",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--config_overrides=encoder_fusion=1")),
        ValueError, r"encoder_fusion='1'.*switch; give true or false"),
    Row("train-cli-override-nan",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=deep_representations",
                                                 "--config_overrides=diversity_weight=nan")),
        ValueError, r"`diversity_weight` must be a finite number, got nan"),
    Row("train-cli-override-syntax",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--config_overrides=dropout")),
        ValueError, r"'dropout'.*key=value"),
    Row("train-cli-preset", lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--preset=big")),
        ValueError, r"'big'"),
    Row("train-cli-model-missing",
        lambda ws: run_translation.main(_rt_args(ws, f"--model_name_or_path={ws.root / 'no_model'}")),
        FileNotFoundError, r"no_model"),
    Row("train-cli-model-and-preset",
        lambda ws: run_translation.main(_rt_args(ws, f"--model_name_or_path={ws.gtrans_dir}", "--preset=multi30k")),
        ValueError, r"--preset"),
    Row("train-cli-model-as-smaller-family",
        lambda ws: run_translation.main(_rt_args(ws, f"--model_name_or_path={ws.gtrans_dir}",
                                                 "--model_type=plain_transformer")),
        ValueError, r"'gtrans' config with keys.*PlainTransformerConfig"),
    Row("train-cli-model-override-inconsistent",
        lambda ws: run_translation.main(_rt_args(ws, f"--model_name_or_path={ws.gtrans_dir}",
                                                 "--config_overrides=encoder_group_size=9")),
        ValueError, r"encoder_group_size.*got 9"),
    Row("train-cli-no-model", lambda ws: run_translation.main(_rt_args(ws)), ValueError,
        r"Give --model_type \(a new model\) and/or --model_name_or_path"),
    Row("train-cli-tokenizer-model",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--tokenizer_model=wordpiece")),
        ValueError, r"'wordpiece'"),
    Row("train-cli-tokenizer-vocab",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--tokenizer_vocab_size=3")),
        ValueError, r"--tokenizer_vocab_size.*3"),
    Row("train-cli-tokenizer-vocab-below-characters",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--tokenizer_vocab_size=8")),
        ValueError, r"--tokenizer_vocab_size 8 cannot hold the \d+ distinct characters .* pass at least \d+"),
    # scored a randomly initialised model and wrote its BLEU (a run that trains no tokenizer
    # and no model; without --tokenizer_name the run was refused for want of training data to train a tokenizer)
    Row("train-cli-eval-untrained-model",
        lambda ws: run_translation.main([arg for arg in _rt_args(ws, "--model_type=gtrans", "--do_eval",
                                                                 f"--tokenizer_name={ws.gtrans_dir}")
                                         if arg != "--do_train"]),
        ValueError, r"--model_name_or_path is not given.*randomly initialised --model_type gtrans"),
    Row("train-cli-tokenizer-missing",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", f"--tokenizer_name={ws.root / 'no_tok'}")),
        FileNotFoundError, r"no_tok"),
    Row("train-cli-same-language",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--target_lang=en")), ValueError,
        r"'en'"),
    Row("train-cli-two-data-sources",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", f"--dataset_name={ws.corpus}")),
        ValueError, r"exactly one data source"),
    Row("train-cli-beams", lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--num_beams=0")),
        ValueError, r"--num_beams.*0"),
    Row("train-cli-minutes",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--max_train_minutes=0")), ValueError,
        r"--max_train_minutes.*0"),
    Row("train-cli-samples",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--max_train_samples=0")), ValueError,
        r"--max_train_samples.*0"),
    Row("train-cli-resume-missing",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans",
                                                 f"--resume_from_checkpoint={ws.root / 'no_ckpt'}")),
        ValueError, r"no_ckpt"),
    Row("train-cli-existing-checkpoints",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", output_dir=ws.checkpoints)), ValueError,
        r"checkpoint-2.*--resume_from_checkpoint last"),
    Row("train-cli-nothing-to-do",
        lambda ws: run_translation.main([a for a in _rt_args(ws, "--model_type=gtrans") if a != "--do_train"]),
        ValueError, r"--do_train"),
    Row("train-cli-output-is-file",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", output_dir=ws.a_file)),
        NotADirectoryError, r"a_file"),
    Row("train-cli-dataset-missing",
        lambda ws: run_translation.main(_rt_data_args(ws, f"--dataset_name={ws.root / 'no_corpus'}")),
        FileNotFoundError, r"no_corpus'.*no such directory"),
    Row("train-cli-dataset-dir-typo",
        lambda ws: run_translation.main(_rt_data_args(ws, f"--dataset_name={ws.root / 'corpsu'}")),
        FileNotFoundError, r"corpsu'.*no such directory.*Did you mean \[.*/corpus'\]"),
    Row("train-cli-dataset-parent-typo",
        lambda ws: run_translation.main(_rt_data_args(ws, f"--dataset_name={ws.root / 'no_dir' / 'corpus'}")),
        FileNotFoundError, r"no such directory '[^']*/no_dir'"),
    Row("train-cli-target-lang-typo",
        lambda ws: run_translation.main(_rt_data_args(ws, f"--dataset_name={ws.corpus}", "--target_lang=ge")),
        FileNotFoundError, r"latin1\.ge.*languages \['de', 'en'\]"),
    Row("train-cli-source-lang-typo",
        lambda ws: run_translation.main(_rt_data_args(ws, f"--dataset_name={ws.texts}", "--source_lang=eng")),
        FileNotFoundError, r"'\*\.eng'.*languages \['de', 'en'\]"),
    Row("train-cli-prefix-lang-typo",
        lambda ws: run_translation.main(_rt_data_args(ws, f"--train_file={ws.corpus / 'train'}", "--target_lang=ge")),
        FileNotFoundError, r"train\.ge.*languages \['de', 'en'\]"),
    Row("train-cli-overwrite-with-checkpoints",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--overwrite_output_dir=True",
                                                 output_dir=ws.checkpoints)),
        ValueError, r"--overwrite_output_dir.*2 checkpoint dir\(s\).*checkpoint-2.*never deleted"),
    Row("train-cli-multi-gpu-launch-without-gpus",
        lambda ws: _launched_on_gpus(run_translation.main, _rt_args(ws, "--model_type=gtrans")),
        ValueError, r"64 processes.*GPU\(s\) are visible.*--use_cpu True"),
    Row("train-cli-dataset-not-utf8",
        lambda ws: run_translation.main([a for a in _rt_args(ws, "--model_type=gtrans") if "builtin" not in a]
                                        + [f"--train_file={ws.corpus / 'latin1'}"]),
        ValueError, r"latin1\.en.*UTF-8"),
    # numbers transformers accepts: `--max_steps 0` trained one step and saved the model as finished
    Row("train-cli-max-steps-zero",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--max_steps=0")),
        ValueError, r"--max_steps must be a positive number of steps.*got 0"),
    Row("train-cli-epochs-zero",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--max_steps=-1", "--num_train_epochs=0")),
        ValueError, r"--num_train_epochs.*got 0"),
    Row("train-cli-batch-size-zero",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--per_device_train_batch_size=0")),
        ValueError, r"--per_device_train_batch_size.*got 0"),
    Row("train-cli-accumulation-zero",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--gradient_accumulation_steps=0")),
        ValueError, r"--gradient_accumulation_steps.*got 0"),
    Row("train-cli-save-steps-zero",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--save_steps=0")),
        ValueError, r"--save_steps.*got 0"),
    Row("train-cli-seed-negative", lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--seed=-1")),
        ValueError, r"--seed.*got -1"),
    # floats the Trainer takes as they are (fault round: a NaN label smoothing failed at the first loss, after the
    # tokenizer was written, and the corrected rerun was refused as the output dir was not empty)
    Row("train-cli-label-smoothing-nan",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--label_smoothing_factor=nan")),
        ValueError, r"--label_smoothing_factor must lie in \[0, 1\), got nan"),
    Row("train-cli-learning-rate-inf",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--learning_rate=inf")),
        ValueError, r"--learning_rate must be a finite number, got inf"),
    # fault round: a source or target length beyond the position table failed at the first batch that long
    Row("train-cli-source-length-beyond-positions",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--config_overrides",
                                                 "max_position_embeddings=16", "--max_target_length=24")),
        ValueError, r"--max_target_length 24 exceeds .*max_position_embeddings=16.*--max_target_length 16 or less"),
    Row("train-cli-builtin-size-negative",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--builtin_num_train=-1")),
        ValueError, r"--builtin_num_train.*got -1"),
    # what a run reads is never its output, --overwrite_output_dir or not
    Row("train-cli-into-its-model-dir",
        lambda ws: run_translation.main(_rt_args(ws, f"--model_name_or_path={ws.gtrans_dir}",
                                                 "--overwrite_output_dir=True", output_dir=ws.gtrans_dir)),
        ValueError, r"gtrans'.*overlaps the input"),
    Row("train-cli-into-its-corpus-dir",
        lambda ws: run_translation.main(_rt_data_args(ws, f"--dataset_name={ws.texts}", f"--output_dir={ws.texts}",
                                                      "--overwrite_output_dir=True")),
        ValueError, r"texts'.*overlaps the input"),
    Row("train-cli-output-dir-in-use",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", output_dir=ws.busy)),
        RuntimeError, r"--output_dir.*busy.*in use by another run \(pid \d+"),
    Row("train-cli-output-read-only",
        lambda ws: _read_only(ws.root, lambda: run_translation.main(_rt_args(ws, "--model_type=gtrans",
                                                                             output_dir=ws.root / "new_run"))),
        PermissionError, r"new_run.*not writable"),
    # a run that only evaluates: beside a finished run's files, but not over its results, nor a file of its model
    Row("train-cli-eval-only-over-results", lambda ws: run_translation.main(_rt_eval_args(ws, output_dir=ws.finished)),
        FileExistsError, r"finished.*\['bleu_results\.json'\].*--overwrite_output_dir"),
    Row("train-cli-predict-only-over-results",
        lambda ws: run_translation.main([a if a != "--do_eval" else "--do_predict"
                                         for a in _rt_eval_args(ws, output_dir=ws.finished)]),
        FileExistsError, r"finished.*\['bleu_results\.json'\].*--overwrite_output_dir"),
    Row("train-cli-eval-only-results-of-its-model",
        lambda ws: run_translation.main(_rt_eval_args(ws, "--overwrite_output_dir=True", model=ws.finished,
                                                      output_dir=ws.finished)),
        ValueError, r"bleu_results\.json.*is a file of.*finished"),
    Row("train-cli-eval-only-output-dir-in-use", lambda ws: run_translation.main(_rt_eval_args(ws, output_dir=ws.busy)),
        RuntimeError, r"busy.*in use by another run"),
    # a checkpoint path skipped every check of the output dir, and replaced the model it
    # fine-tuned; a dir that is no checkpoint, or resuming without training, failed or was ignored after the first write
    Row("train-cli-resume-path-into-model-dir",
        lambda ws: run_translation.main(_rt_args(ws, f"--model_name_or_path={ws.gtrans_dir}",
                                                 f"--resume_from_checkpoint={_trainer_checkpoint(ws)}",
                                                 output_dir=ws.gtrans_dir)),
        ValueError, r"gtrans'.*overlaps the input"),
    Row("train-cli-resume-path-into-non-empty-dir",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans",
                                                 f"--resume_from_checkpoint={_trainer_checkpoint(ws)}",
                                                 output_dir=ws.full)),
        FileExistsError, r"full'.*not empty.*--overwrite_output_dir"),
    Row("train-cli-resume-path-not-a-checkpoint",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", f"--resume_from_checkpoint={ws.full}")),
        ValueError, r"full'.*not a checkpoint the Trainer wrote.*trainer_state\.json"),
    Row("train-cli-resume-without-training",
        lambda ws: run_translation.main(_rt_eval_args(ws, "--resume_from_checkpoint=last")),
        ValueError, r"--resume_from_checkpoint 'last'.*--do_train is not given"),
    # floats out of range failed in the first steps (or trained wrong), after the tokenizer
    # was written, and the corrected rerun was refused as the output dir was not empty
    *(Row(f"train-cli-{name}",
          lambda ws, args=args: run_translation.main(_rt_args(ws, "--model_type=gtrans", *args)),
          ValueError, message)
      for name, args, message in (
          ("learning-rate-negative", ["--learning_rate=-1"], r"--learning_rate must be non-negative, got -1"),
          ("adam-beta1-above-one", ["--adam_beta1=1.5"], r"--adam_beta1 must lie in \[0, 1\), got 1\.5"),
          ("adam-beta2-negative", ["--adam_beta2=-0.1"], r"--adam_beta2 must lie in \[0, 1\), got -0\.1"),
          ("adam-epsilon-negative", ["--adam_epsilon=-1"], r"--adam_epsilon must be positive, got -1"),
          ("weight-decay-negative", ["--weight_decay=-1"], r"--weight_decay must be non-negative, got -1"),
          ("max-grad-norm-negative", ["--max_grad_norm=-1"], r"--max_grad_norm must be non-negative.*got -1"),
          ("warmup-nan", ["--warmup_steps=nan"], r"--warmup_steps must be a finite number, got nan"),
          ("warmup-inf", ["--warmup_steps=inf"], r"--warmup_steps must be a finite number, got inf"),
          ("warmup-fractional-steps", ["--warmup_steps=2.5"],
           r"--warmup_steps must be a whole number of steps, or a fraction.*got 2\.5"),
          ("epochs-inf", ["--max_steps=-1", "--num_train_epochs=inf"],
           r"--num_train_epochs must be a positive finite number, got inf"))),
    # the run trained, then failed at the BLEU (no generation) or at the empty split
    Row("train-cli-eval-without-generation",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--do_eval",
                                                 "--predict_with_generate=False")),
        ValueError, r"--predict_with_generate False.*BLEU"),
    Row("train-cli-builtin-no-validation-pairs",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--do_eval", "--builtin_num_valid=0")),
        ValueError, r"--builtin_num_valid 0 .*--do_eval"),
    Row("train-cli-builtin-no-test-pairs",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--do_predict", "--builtin_num_test=0")),
        ValueError, r"--builtin_num_test 0 .*--do_predict"),
    Row("train-cli-builtin-no-training-pairs",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--builtin_num_train=0")),
        ValueError, r"--builtin_num_train 0 .*--do_train"),
    # the Trainer's generation options won over the script's, which were printed and saved
    Row("train-cli-generation-beams-contradict",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--do_eval", "--num_beams=1",
                                                 "--generation_num_beams=3")),
        ValueError, r"--generation_num_beams 3 contradicts --num_beams 1"),
    Row("train-cli-generation-length-contradict",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--do_eval", "--max_new_tokens=10",
                                                 "--generation_max_length=3")),
        ValueError, r"--generation_max_length 3 contradicts --max_new_tokens 10.*max_length 11"),
    # options of another data source were ignored without a word
    Row("train-cli-validation-file-with-builtin",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans",
                                                 f"--validation_file={ws.root / 'no_valid.jsonl'}")),
        ValueError, r"--validation_file '[^']*no_valid\.jsonl'.*--builtin_corpus"),
    Row("train-cli-test-file-with-dataset",
        lambda ws: run_translation.main(_rt_data_args(ws, f"--dataset_name={ws.texts}",
                                                      f"--test_file={ws.root / 'no_test.jsonl'}")),
        ValueError, r"--test_file '[^']*no_test\.jsonl'.*--dataset_name '[^']*texts'"),
    Row("train-cli-dataset-config-with-builtin",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--dataset_config_name=de-en")),
        ValueError, r"--dataset_config_name 'de-en'.*--builtin_corpus"),
    # ------------------------------------------------------------------ examples/run_multilingual.py
    Row("multilingual-cli-family", lambda ws: run_multilingual.main(_ml_args(ws, "--model_type=gtrns")), ValueError,
        r"'gtrns'"),
    Row("multilingual-cli-dataset", lambda ws: run_multilingual.main(_ml_args(ws, "--dataset=wmt")), ValueError,
        r"'wmt'"),
    Row("multilingual-cli-tiny-dir-not-empty",
        lambda ws: run_multilingual.main(_ml_args(ws, f"--tiny_random_xlmr={ws.xlmr_dir}")), FileExistsError,
        r"xlmr.*not empty"),
    Row("multilingual-cli-xlmr-missing",
        lambda ws: run_multilingual.main(_ml_args(ws, f"--xlmr={ws.root / 'no_xlmr'}")), FileNotFoundError,
        r"no_xlmr"),
    Row("multilingual-cli-baseline-missing",
        lambda ws: run_multilingual.main(_ml_args(ws, f"--baseline_scores={ws.root / 'no_scores.json'}")),
        FileNotFoundError, r"no_scores\.json"),
    Row("multilingual-cli-temperature", lambda ws: run_multilingual.main(_ml_args(ws, "--temperature=0")), ValueError,
        r"--temperature.*0"),
    Row("multilingual-cli-preset", lambda ws: run_multilingual.main(_ml_args(ws, "--preset=big")), ValueError,
        r"'big'"),
    Row("multilingual-cli-no-languages",
        lambda ws: run_multilingual.main(_ml_args(ws, "--dataset=opus100")), ValueError, r"--languages"),
    Row("multilingual-cli-multi30k-dir-missing",
        lambda ws: run_multilingual.main(_ml_args(ws, f"--multi30k_dir={ws.root / 'no_multi30k'}")), FileNotFoundError,
        r"--multi30k_dir '.*no_multi30k' is not a directory: pass the folder that holds Multi30k's train.<lang>"),
    Row("multilingual-cli-length-beyond-positions",
        lambda ws: run_multilingual.main(_ml_args(ws, "--max_target_length=30")), ValueError,
        r"--max_target_length 30 exceeds the position table the model gets from XLM-R \(max_position_embeddings=22\)"),
    Row("multilingual-cli-output-not-empty",
        lambda ws: run_multilingual.main(_ml_args(ws, output_dir=ws.full)), FileExistsError, r"full"),
    Row("multilingual-cli-override-misspelt",
        lambda ws: run_multilingual.main(_ml_args(ws, "--config_overrides=decoder_grup_size=1")), ValueError,
        r"'decoder_grup_size'"),
    Row("multilingual-cli-language-typo", lambda ws: run_multilingual.main(_ml_args(ws, "--languages=en,ge")),
        FileNotFoundError, r"\['ge'\].*\['de', 'en'\]"),
    Row("multilingual-cli-multi-gpu-launch-without-gpus",
        lambda ws: _launched_on_gpus(run_multilingual.main, _ml_args(ws)),
        ValueError, r"64 processes.*run_multilingual\.py .*--use_cpu True"),
    Row("multilingual-cli-corpus-missing",
        lambda ws: run_multilingual.main(_ml_args(ws, f"--multi30k_dir={ws.root / 'no_m30k'}")), FileNotFoundError,
        r"no_m30k"),
    Row("multilingual-cli-max-steps-zero", lambda ws: run_multilingual.main(_ml_args(ws, "--max_steps=0")), ValueError,
        r"--max_steps must be a positive number of steps.*got 0"),
    Row("multilingual-cli-output-dir-in-use", lambda ws: run_multilingual.main(_ml_args(ws, output_dir=ws.busy)),
        RuntimeError, r"busy.*in use by another run \(pid \d+"),
    Row("multilingual-cli-into-xlmr-dir",
        lambda ws: run_multilingual.main(_ml_args(ws, "--overwrite_output_dir=True", output_dir=ws.xlmr_dir)),
        ValueError, r"xlmr'.*overlaps the input"),
    Row("multilingual-cli-eval-only-over-scores",
        lambda ws: run_multilingual.main([a for a in _ml_args(ws, output_dir=ws.finished) if a != "--do_train"]),
        FileExistsError, r"finished.*\['direction_scores\.json'\].*--overwrite_output_dir"),
    Row("multilingual-cli-eval-only-over-its-baseline",
        lambda ws: run_multilingual.main([
            a for a in _ml_args(ws, "--overwrite_output_dir=True", f"--baseline_scores={ws.finished / SCORES}",
                                output_dir=ws.finished) if a != "--do_train"
        ]),
        ValueError, r"direction_scores\.json.*is the input.*direction_scores\.json"),
    # ------------------------------------------------------------------ model card, plots (issue 40)
    Row("card-through-link-to-model-file",
        lambda ws: hf_layerfusion.write_model_card(ws.card_linked, ws.gtrans, "en", "de", "tiny", overwrite=True),
        ValueError, r"card_linked/README\.md' is the input '.*card_linked/config\.json'"),
    # fault round: a NaN score became `value: .nan` in the Hub's model-index, a language name or "" its language list
    Row("card-score-nan",
        lambda ws: hf_layerfusion.write_model_card(ws.carded, ws.gtrans, "en", "de", "tiny", overwrite=True,
                                                   bleu_scores={"test": float("nan")}),
        ValueError, r"bleu_scores\['test'\]=nan is not a finite number"),
    Row("card-language-name",
        lambda ws: hf_layerfusion.write_model_card(ws.carded, ws.gtrans, "english", "de", "tiny", overwrite=True),
        ValueError, r"src_lang='english' is not a language code"),
    Row("card-language-empty",
        lambda ws: hf_layerfusion.write_model_card(ws.carded, ws.gtrans, "en", "", "tiny", overwrite=True),
        ValueError, r"tgt_lang='' is not a language code"),
    # before, "no" (truthy) replaced the card; None and "" were published as `datasets: - null` / `- ''`
    Row("card-overwrite-not-a-switch",
        lambda ws: hf_layerfusion.write_model_card(ws.carded, ws.gtrans, "en", "de", "tiny", overwrite="no"),
        TypeError, r"`overwrite` must be True or False, got 'no' \(str\)"),
    Row("card-dataset-none",
        lambda ws: hf_layerfusion.write_model_card(ws.carded, ws.gtrans, "en", "de", None, overwrite=True),
        ValueError, r"dataset_name=None is empty or not a string"),
    Row("card-license-empty",
        lambda ws: hf_layerfusion.write_model_card(
            ws.carded, ws.gtrans, "en", "de", "tiny", license="", overwrite=True),
        ValueError, r"license='' is empty or not a string"),
    Row("card-disk-full",
        lambda ws: _disk_full(lambda: hf_layerfusion.write_model_card(ws.carded, ws.gtrans, "en", "de", "tiny",
                                                                      overwrite=True)),
        OSError, r"Model card '.*carded/README\.md'.*No space left.*unchanged"),
    Row("plot-disk-full",
        lambda ws: _disk_full(lambda: plot_logged_series([{"step": 1, "fusion/gate_1": 0.5}], "fusion/",
                                                         str(ws.carded / "fusion_weights.png"), "Fusion weights")),
        OSError, r"Plot '.*carded/fusion_weights\.png'.*No space left.*unchanged"),
    # ------------------------------------------------------------------ save / load
    Row("load-gtrans-dir-as-plain", lambda ws: PlainTransformerForConditionalGeneration.from_pretrained(ws.gtrans_dir),
        ValueError, r"'gtrans' config"),
    Row("save-onto-file", lambda ws: ws.gtrans.save_pretrained(ws.a_file), FileExistsError, r"a_file"),
    Row("load-broken-config-json-with-config",
        lambda ws: PlainTransformerForConditionalGeneration.from_pretrained(
            ws.broken_config_dir, config=_tiny(PlainTransformerConfig, ws.vocab)),
        ValueError, r"broken_config.*config\.json is not a readable JSON config"),
    Row("load-gtrans-weights-plain-config",
        lambda ws: AutoModelForSeq2SeqLM.from_pretrained(ws.gtrans_dir, config=_tiny(PlainTransformerConfig, ws.vocab)),
        ValueError, r"'gtrans' checkpoint.*readout"),
    # checkpoints that are not the model their config.json builds (issue 40): before, loaded (at most with
    # transformers' load report) and translated every sentence to '' or noise
    Row("load-nan-weight", lambda ws: AutoModelForSeq2SeqLM.from_pretrained(ws.nan_weights), ValueError,
        r"nan_weights'.*NaN or inf.*model\.encoder\.layers\.0\.ffn\.fc1\.weight.*output_loading_info=True"),
    Row("load-missing-tensor", lambda ws: AutoModelForSeq2SeqLM.from_pretrained(ws.missing_tensor), ValueError,
        r"missing_tensor'.*lacks.*\['model\.encoder\.layers\.0\.ffn\.fc1\.weight'\].*output_loading_info=True"),
    # loaded into another family on purpose, the backbone must still be complete (only the family's parts start fresh)
    Row("load-missing-tensor-as-gtrans",
        lambda ws: GTransForConditionalGeneration.from_pretrained(ws.missing_tensor,
                                                                  config=_tiny(GTransConfig, ws.vocab, **GROUPS)),
        ValueError, r"missing_tensor'.*lacks.*\['model\.encoder\.layers\.0\.ffn\.fc1\.weight'\]"),
    Row("load-model-type-edited", lambda ws: AutoModelForSeq2SeqLM.from_pretrained(ws.model_type_edited), TypeError,
        r"PlainTransformerConfig.*'decoder_fusion' \(gtrans\).*put the family's model_type back"),
    Row("load-model-type-edited-keys-removed",
        lambda ws: AutoModelForSeq2SeqLM.from_pretrained(ws.model_type_edited_plain), ValueError,
        r"model_type_edited_plain'.*'model\.decoder\.readout\..*would be dropped.*`model_type`"),
    Row("load-normalize-before-flipped", lambda ws: AutoModelForSeq2SeqLM.from_pretrained(ws.normalize_before_flipped),
        ValueError, r"normalize_before_flipped'.*'model\.decoder\.layer_norm\.bias'.*normalize_before=True: was it "
                    r"changed"),
    Row("load-misspelt-config-key", lambda ws: AutoModelForSeq2SeqLM.from_pretrained(ws.misspelt_config_key),
        TypeError, r"'decoder_fusoin'.*did you mean 'decoder_fusion'"),
    Row("load-truncated-generation-config",
        lambda ws: AutoModelForSeq2SeqLM.from_pretrained(ws.truncated_generation_config), ValueError,
        r"truncated_generation_config/generation_config\.json' is not valid JSON"),
    # damaged files (issue 40): before, a SafetensorError / JSONDecodeError naming no file
    Row("load-truncated-weights-auto", lambda ws: AutoModelForSeq2SeqLM.from_pretrained(ws.truncated_weights),
        ValueError, r"truncated_weights/model\.safetensors'.*damaged or incomplete.*again"),
    Row("load-truncated-weights-class",
        lambda ws: PlainTransformerForConditionalGeneration.from_pretrained(ws.truncated_weights),
        ValueError, r"truncated_weights/model\.safetensors'.*damaged or incomplete"),
    Row("load-corrupt-weights-header", lambda ws: AutoModelForSeq2SeqLM.from_pretrained(ws.corrupt_weights),
        ValueError, r"corrupt_weights/model\.safetensors'.*damaged or incomplete"),
    Row("tokenizer-load-truncated-json", lambda ws: load_tokenizer(ws.truncated_tokenizer), ValueError,
        r"truncated_tokenizer/tokenizer\.json'.*not valid JSON.*again"),
    Row("tokenizer-load-none-saved", lambda ws: load_tokenizer(ws.no_tokenizer), FileNotFoundError,
        r"no_tokenizer'.*holds no tokenizer.*save_pretrained"),
    Row("trainer-checkpoint-disk-full", _train_onto_full_disk, OSError,
        r"checkpoint-1'.*disk is full.*unexpected pos 191616 vs 191504.*free space"),
    # ------------------------------------------------------------------ model entry points
    Row("model-ids-1d", lambda ws: ws.gtrans(input_ids=torch.tensor([4, 5, 2]), labels=torch.tensor([[4, 2]])),
        ValueError, r"shape \(3,\)"),
    Row("model-empty-batch", lambda ws: ws.gtrans(**_batch(ws, input_ids=torch.ones(0, 3, dtype=torch.long),
                                                           attention_mask=torch.ones(0, 3, dtype=torch.long),
                                                           labels=torch.ones(0, 3, dtype=torch.long))),
        ValueError, r"empty batch"),
    Row("model-out-of-vocab", lambda ws: ws.gtrans(**_batch(ws, input_ids=torch.tensor([[4, 999, 2], [4, 5, 2]]))),
        ValueError, r"token id 999"),
    # the out-of-vocabulary label is the last one: shifted out of the decoder's input, only the loss would meet it
    Row("model-label-out-of-vocab", lambda ws: ws.gtrans(**_batch(ws, labels=torch.tensor([[4, 5, 999], [4, 5, 2]]))),
        ValueError, r"`labels` holds token id 999, outside the vocabulary \[0, \d+\) and not -100"),
    Row("model-label-float", lambda ws: ws.gtrans(**_batch(ws, labels=torch.tensor([[4.0, 2.0], [4.0, 2.0]]))),
        TypeError, r"`labels` must hold integer token ids, got dtype torch.float32"),
    Row("model-label-1d", lambda ws: ws.gtrans(**_batch(ws, labels=torch.tensor([4, 2]))), ValueError,
        r"`labels` must be 2-D.*\(2,\)"),
    # torch's loss named neither tensor (plain), GTrans failed on a mask's shape (session of 2026-12-08)
    Row("model-labels-longer-than-decoder-inputs",
        lambda ws: ws.gtrans(**_batch(ws, labels=torch.tensor([[4, 5, 2], [4, 5, 2]]),
                                      decoder_input_ids=torch.tensor([[2, 4], [2, 4]]))),
        ValueError, r"`labels` has shape \(2, 3\) but the decoder's inputs have \(batch, length\) \(2, 2\)"),
    Row("model-labels-other-batch-than-decoder-embeds",
        lambda ws: ws.plain(**_batch(ws, labels=torch.tensor([[4, 2], [4, 2]]),
                                     decoder_inputs_embeds=torch.zeros(3, 2, ws.plain.config.d_model))),
        ValueError, r"`labels` has shape \(2, 2\) but the decoder's inputs have \(batch, length\) \(3, 2\)"),
    Row("model-label-list", lambda ws: ws.gtrans(**_batch(ws, labels=[[4, 2], [4, 2]])), TypeError,
        r"`labels` must be a torch.Tensor, got list"),
    Row("model-mask-batch", lambda ws: ws.gtrans(**_batch(ws, attention_mask=torch.ones(3, 4, dtype=torch.long))),
        ValueError, r"attention_mask.*\(3, 4\)"),
    Row("generate-mask-batch",
        lambda ws: ws.gtrans.generate(input_ids=torch.tensor([[4, 5, 2], [4, 6, 2]]),
                                      attention_mask=torch.ones(1, 3, dtype=torch.long), max_new_tokens=2),
        ValueError, r"attention_mask.*\(1, 3\)"),
    Row("generate-groups-str",
        lambda ws: ws.gtrans.generate(input_ids=torch.tensor([[4, 5, 2]]), decoder_groups="12", max_new_tokens=2),
        ValueError, r"'12'"),
    Row("generate-groups-float",
        lambda ws: ws.gtrans.generate(input_ids=torch.tensor([[4, 5, 2]]), decoder_groups=[1.7], max_new_tokens=2),
        ValueError, r"1\.7"),
    Row("model-groups-str", lambda ws: ws.gtrans(**_batch(ws), decoder_groups="12"), ValueError, r"'12'"),
    Row("model-groups-bool", lambda ws: ws.gtrans(**_batch(ws), decoder_groups=[True]), ValueError, r"True"),
    # --- issue 73 (second fault round): outputs and the translate CLI's inputs
    # special files are written in place (tests/test_translate.py): one that no write can reach is refused up front
    Row("output-file-descriptor-not-open", lambda ws: check_output_file("/dev/fd/987"), FileNotFoundError,
        r"/dev/fd/987.*descriptor 987, which this process does not have open"),
    Row("output-file-descriptor-read-only", _io73_output_into_read_only_descriptor, PermissionError,
        r"/dev/fd/\d+.*open for reading only"),
    Row("output-file-fifo-not-writable",
        lambda ws: _io73_with_special_file("fifo", lambda path: _read_only(path, lambda: check_output_file(path))),
        PermissionError, r"fifo.*a FIFO.*not writable"),
    Row("output-file-socket", lambda ws: _io73_with_special_file("socket", check_output_file), ValueError,
        r"socket' is a socket"),
    Row("write-special-file-reader-gone", lambda ws: _io73_write_into_pipe_without_reader(), OSError,
        r"'/dev/fd/\d+' \(a special file, written in place\).*Broken pipe"),
    # before: `TypeError: TextEncodeInput must be Union[...]` from the tokenizer
    Row("translate-cli-stdin-not-utf8", lambda ws: _io73_translate_stdin(b"caf\xe9\n", [str(ws.gtrans_dir)]),
        ValueError, r"stdin is not UTF-8 text \(byte 3: b'\\xe9\\n'\)"),
    # before: "Unrecognized model ... Should have a `model_type` key in its config.json"
    Row("translate-cli-adapter-dir",
        lambda ws: translate_script.main([str(ws.adapter_run / "checkpoint-1"), f"--input={ws.input}"]), ValueError,
        r"model_dir '.*adapter_run/checkpoint-1' holds a PEFT adapter.*merge_and_unload"),
    Row("ctranslate2-cli-adapter-dir",
        lambda ws: ctranslate2_export.main(["--model_dir", str(ws.adapter_run / "checkpoint-1"), "--output_dir",
                                            str(ws.root / "ct2")]),
        ValueError, r"--model_dir '.*adapter_run/checkpoint-1' holds a PEFT adapter"),
    # before: a raw `httpx2.ConnectError: [Errno 111] Connection refused` from inside the Hub client
    Row("push-hub-unreachable", _io73_push, ConnectionError,
        r"Hub at http://127\.0\.0\.1:9 to create 'you/gtrans-en-de'.*nothing was uploaded.*HF_ENDPOINT.*HF_TOKEN"),
    # before, passed to the Hub unchecked
    Row("push-private-not-a-switch",
        lambda ws: hf_layerfusion.push_to_hub(ws.gtrans_dir, "you/gtrans-en-de", private="no", token="hf_test_token"),
        TypeError, r"`private` must be True or False, got 'no' \(str\)"),
    # before: published, and every load without the package failed with a SyntaxError in "<unknown>"
    Row("push-hub-code-cut-short", lambda ws: _io73_push(ws, cut_hub_code=True), ValueError,
        r"Hub code '.*modeling_layerfusion\.py' is damaged or cut short \(.*line \d+\).*save_pretrained"),
    # before: a bare `OSError: [Errno 27] File too large` and the checkpoint cut short (under a real file size limit:
    # test_a_checkpoint_over_the_file_size_limit_is_named_and_nothing_of_it_is_left)
    Row("trainer-checkpoint-file-too-large",
        lambda ws: _train_onto_full_disk(ws, OSError(errno.EFBIG, os.strerror(errno.EFBIG))), OSError,
        r"checkpoint-1'.*larger than the file system or this process's file size limit.*Nothing of it is left there"
        r".*ulimit -f unlimited"),
    # --- issue 73: the fast path and generation arguments
    # search settings: refused by name (raw errors from deep inside, or a silent answer), through generate(), the
    # fast loop, translate() and the pipeline, before an inference copy is made
    Row("generate-beams-zero",
        lambda ws: ws.gtrans.generate(input_ids=torch.tensor([[4, 5, 2]]), num_beams=0, max_new_tokens=2),
        ValueError, r"`num_beams` must be a positive integer, got 0"),
    Row("generate-beams-negative",
        lambda ws: ws.gtrans.generate(input_ids=torch.tensor([[4, 5, 2]]), num_beams=-2, max_new_tokens=2),
        ValueError, r"`num_beams` must be a positive integer, got -2"),
    Row("generate-config-beams-zero",
        lambda ws: ws.gtrans.generate(input_ids=torch.tensor([[4, 5, 2]]), max_new_tokens=2,
                                      generation_config=_with(copy.deepcopy(ws.gtrans.generation_config), num_beams=0)),
        ValueError, r"`num_beams` must be a positive integer, got 0"),
    Row("generate-new-tokens-float",
        lambda ws: ws.gtrans.generate(input_ids=torch.tensor([[4, 5, 2]]), max_new_tokens=2.5),
        ValueError, r"`max_new_tokens` must be a positive integer, got 2\.5"),
    Row("generate-length-penalty-nan",
        lambda ws: ws.gtrans.generate(input_ids=torch.tensor([[4, 5, 2]]), num_beams=2, max_new_tokens=2,
                                      length_penalty=float("nan")),
        ValueError, r"`length_penalty` must be a finite number, got nan"),
    Row("fast-generate-beams-zero",
        lambda ws: _fastpath_before_any_copy(lambda: hf_layerfusion.inference.fast_generate(
            ws.gtrans, input_ids=torch.tensor([[4, 5, 2]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
            num_beams=0, max_new_tokens=2)),
        ValueError, r"`num_beams` must be a positive integer, got 0"),
    Row("fast-generate-int8-beams-negative",
        lambda ws: _fastpath_before_any_copy(lambda: hf_layerfusion.inference.fast_generate(
            ws.gtrans, input_ids=torch.tensor([[4, 5, 2]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
            num_beams=-2, max_new_tokens=2, quantization="int8")),
        ValueError, r"`num_beams` must be a positive integer, got -2"),
    Row("fast-generate-new-tokens-float",
        lambda ws: _fastpath_before_any_copy(lambda: hf_layerfusion.inference.fast_generate(
            ws.gtrans, input_ids=torch.tensor([[4, 5, 2]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
            max_new_tokens=2.5)),
        ValueError, r"`max_new_tokens` must be a positive integer, got 2\.5"),
    Row("fast-generate-length-penalty-inf",
        lambda ws: _fastpath_before_any_copy(lambda: hf_layerfusion.inference.fast_generate(
            ws.gtrans, input_ids=torch.tensor([[4, 5, 2]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
            num_beams=2, max_new_tokens=2, length_penalty=float("inf"))),
        ValueError, r"`length_penalty` must be a finite number, got inf"),
    Row("pipeline-beams-zero",
        lambda ws: _fastpath_before_any_copy(lambda: hf_layerfusion.LayerFusionTranslationPipeline(
            model=ws.gtrans, tokenizer=ws.tokenizer)("a man", num_beams=0, quantization="int8")),
        ValueError, r"`num_beams` must be a positive integer, got 0"),
    Row("pipeline-beams-negative",
        lambda ws: _fastpath_before_any_copy(lambda: hf_layerfusion.LayerFusionTranslationPipeline(
            model=ws.gtrans, tokenizer=ws.tokenizer)("a man", num_beams=-2, quantization="int8")),
        ValueError, r"`num_beams` must be a positive integer, got -2"),
    Row("pipeline-new-tokens-float",
        lambda ws: _fastpath_before_any_copy(lambda: hf_layerfusion.LayerFusionTranslationPipeline(
            model=ws.gtrans, tokenizer=ws.tokenizer)("a man", max_new_tokens=2.5, quantization="int8")),
        ValueError, r"`max_new_tokens` must be a positive integer, got 2\.5"),
    Row("pipeline-length-penalty-nan",
        lambda ws: _fastpath_before_any_copy(lambda: hf_layerfusion.LayerFusionTranslationPipeline(
            model=ws.gtrans, tokenizer=ws.tokenizer)("a man", num_beams=2, length_penalty=float("nan"),
                                                     quantization="int8")),
        ValueError, r"`length_penalty` must be a finite number, got nan"),
    # before, fast="no" decoded with the fast loop, max_source_length=True cut every source to 1 token
    Row("pipeline-fast-not-a-switch",
        lambda ws: _fastpath_before_any_copy(lambda: hf_layerfusion.LayerFusionTranslationPipeline(
            model=ws.gtrans, tokenizer=ws.tokenizer)("a man", fast="no", quantization="int8")),
        TypeError, r"`fast` must be True or False, got 'no' \(str\)"),
    Row("pipeline-max-source-length-bool",
        lambda ws: _fastpath_before_any_copy(lambda: hf_layerfusion.LayerFusionTranslationPipeline(
            model=ws.gtrans, tokenizer=ws.tokenizer)("a man", max_source_length=True, quantization="int8")),
        ValueError, r"`max_source_length` must be a positive integer, got True"),
    Row("translate-length-penalty-nan",
        lambda ws: _fastpath_before_any_copy(lambda: translate(
            ws.gtrans, ws.tokenizer, ["a man"], num_beams=2, length_penalty=float("nan"), quantization="int8")),
        ValueError, r"`length_penalty` must be a finite number, got nan"),
    Row("translate-length-penalty-str",
        lambda ws: translate(ws.gtrans, ws.tokenizer, ["a man"], num_beams=2, length_penalty="1.0"),
        ValueError, r"`length_penalty` must be a finite number, got '1\.0'"),
    # search settings and switches a truthy non-bool would turn on silently: `do_sample=1` sampled in generate() but
    # decoded greedily on the fast path; `fallback="no"` fell back (session of 2026-12-08)
    Row("generate-do-sample-int",
        lambda ws: ws.gtrans.generate(input_ids=torch.tensor([[4, 5, 2]]), do_sample=1, max_new_tokens=2),
        TypeError, r"`do_sample` must be True or False, got 1 \(int\)"),
    Row("fast-generate-do-sample-str",
        lambda ws: _fastpath_before_any_copy(lambda: hf_layerfusion.inference.fast_generate(
            ws.gtrans, input_ids=torch.tensor([[4, 5, 2]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
            do_sample="false", max_new_tokens=2)),
        TypeError, r"`do_sample` must be True or False, got 'false' \(str\)"),
    Row("translate-config-do-sample-int",
        lambda ws: _fastpath_before_any_copy(lambda: translate(
            ws.gtrans, ws.tokenizer, ["a man"],
            generation_config=_with(copy.deepcopy(ws.gtrans.generation_config), do_sample=1))),
        TypeError, r"`do_sample` must be True or False, got 1 \(int\)"),
    Row("generate-max-length-float",
        lambda ws: ws.gtrans.generate(input_ids=torch.tensor([[4, 5, 2]]), max_length=2.5),
        ValueError, r"`max_length` must be a positive integer, got 2\.5"),
    Row("fast-generate-return-sequences-zero",
        lambda ws: _fastpath_before_any_copy(lambda: hf_layerfusion.inference.fast_generate(
            ws.gtrans, input_ids=torch.tensor([[4, 5, 2]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
            num_beams=2, num_return_sequences=0, max_new_tokens=2)),
        ValueError, r"`num_return_sequences` must be a positive integer, got 0"),
    Row("generate-early-stopping-int",
        lambda ws: ws.gtrans.generate(input_ids=torch.tensor([[4, 5, 2]]), num_beams=2, early_stopping=1,
                                      max_new_tokens=2),
        ValueError, r'`early_stopping` must be True, False or "never", got 1'),
    Row("fast-generate-fallback-str",
        lambda ws: _fastpath_before_any_copy(lambda: hf_layerfusion.inference.fast_generate(
            ws.gtrans, input_ids=torch.tensor([[4, 5, 2]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
            fallback="no", max_new_tokens=2)),
        TypeError, r"`fallback` must be True or False, got 'no' \(str\)"),
    Row("fast-decoding-loop-fallback-int",
        lambda ws: hf_layerfusion.inference.fast_generation.fast_decoding_loop(0),
        TypeError, r"`fallback` must be True or False, got 0 \(int\)"),
    Row("translate-fast-str",
        lambda ws: _fastpath_before_any_copy(lambda: translate(ws.gtrans, ws.tokenizer, ["a man"], fast="no")),
        TypeError, r"`fast` must be True or False, got 'no' \(str\)"),
    Row("translate-progress-int",
        lambda ws: _fastpath_before_any_copy(lambda: translate(ws.gtrans, ws.tokenizer, ["a man"], progress=1)),
        TypeError, r"`progress` must be True or False, got 1 \(int\)"),
    Row("trainer-label-smoothing-nan",
        lambda ws: hf_layerfusion.LayerFusionSeq2SeqTrainer(
            model=copy.deepcopy(ws.plain), args=Seq2SeqTrainingArguments(
                output_dir=str(ws.root / "never-written"), label_smoothing_factor=float("nan"), report_to=[])),
        ValueError, r"`label_smoothing_factor` must be a finite number, got nan"),
    Row("trainer-label-smoothing-negative",
        lambda ws: hf_layerfusion.LayerFusionSeq2SeqTrainer(
            model=copy.deepcopy(ws.plain), args=Seq2SeqTrainingArguments(
                output_dir=str(ws.root / "never-written"), label_smoothing_factor=-0.2, report_to=[])),
        ValueError, r"`label_smoothing_factor` must lie in \[0, 1\), got -0\.2"),
    Row("time-budget-inf",
        lambda ws: hf_layerfusion.training.callbacks.TimeBudgetCallback(float("inf")),
        ValueError, r"`max_minutes` must be a finite number, got inf"),
    # a source that carries its own target-language tag while tgt_lang prepends another (or the same one again)
    Row("translate-conflicting-tags",
        lambda ws: translate(ws.gtrans, ws.tagged_tokenizer, ["<2fr> a man"], tgt_lang="de"),
        ValueError, r"Sentence 0 \('<2fr> a man'\) begins with the target-language tag <2fr>, and tgt_lang='de' "
                    r"prepends <2de>: the model would read two tags"),
    Row("translate-repeated-tag",
        lambda ws: translate(ws.gtrans, ws.tagged_tokenizer, ["a man", " <2de> two dogs"], tgt_lang="de"),
        ValueError, r"Sentence 1 \(' <2de> two dogs'\) begins with the target-language tag <2de>.*prepends <2de>"),
    Row("pipeline-conflicting-tags",
        lambda ws: hf_layerfusion.LayerFusionTranslationPipeline(model=ws.gtrans, tokenizer=ws.tagged_tokenizer)(
            "<2fr> a man", tgt_lang="de"),
        ValueError, r"'<2fr> a man'.*<2fr>.*tgt_lang='de' prepends <2de>"),
    # --- issue 73: the kernel build and its cache
    # `--force` with a compiler that fails at once, through torch's own `load`, in an extensions root beside the
    # workspace: before, the build folder was deleted first; tests/test_kernel_build_cache.py checks it is kept
    # a cache folder of its own for each call: torch's `load` skips the build of an extension whose sources, flags and
    # build folder it already saw in this process (test_every_check_of_the_check_modules_has_a_row calls each row too)
    Row("kernel-build-force-broken-compiler",
        lambda ws: mock.patch.dict(os.environ, TORCH_EXTENSIONS_DIR=tempfile.mkdtemp(dir=ws.root.parent),
                                   CXX="/bin/false")(build_kernels)(
            Path(hf_layerfusion.__file__).parent / "inference" / KERNEL_DIRECTORY, force=True),
        RuntimeError,
        r"could not be built again into \S+\.new \(CalledProcessError: .*/bin/false.*\); \S+ is as it was"),
    # --- issue 73: the ledger and the study queue
    # a BLEU no run produces went into the card and the Hub's model-index (the ledger's own checks, which live in
    # study/, are tests/test_bench_multi30k.py's: a row's refusal must come from the package or examples/)
    Row("card-score-above-100",
        lambda ws: hf_layerfusion.write_model_card(ws.carded, ws.gtrans, "en", "de", "tiny", overwrite=True,
                                                   bleu_scores={"test": 345.0}),
        ValueError, r"bleu_scores\['test'\]=345\.0 is not a finite number in \[0, 100\]"),
    Row("card-score-negative",
        lambda ws: hf_layerfusion.write_model_card(ws.carded, ws.gtrans, "en", "de", "tiny", overwrite=True,
                                                   bleu_scores={"validation": -5}),
        ValueError, r"bleu_scores\['validation'\]=-5 is not a finite number in \[0, 100\]"),
    # --- issue 73: loading, averaging and training
    # before, the integers were cast to floats and loaded as the weight
    Row("load-integer-weight", lambda ws: AutoModelForSeq2SeqLM.from_pretrained(_loading_dirs(ws).integer_weight),
        ValueError, r"integer_weight'.*not floating-point.*'model\.encoder\.layers\.0\.ffn\.fc1\.weight \(I64\)'"),
    # a fusion switched on at loading starts fresh (tests/test_deep_representations.py), one its checkpoint lost not
    Row("load-missing-fusion-tensor",
        lambda ws: AutoModelForSeq2SeqLM.from_pretrained(_loading_dirs(ws).missing_fusion_tensor), ValueError,
        r"missing_fusion_tensor'.*lacks.*\['model\.decoder\.readout\.group_weight'\]"),
    # before, the Hub code (whose class auto_map picks) ran it as GTrans; it refuses too (tests/test_hub.py)
    Row("load-model-type-edited-class-of-auto-map",
        lambda ws: GTransForConditionalGeneration.from_pretrained(_loading_dirs(ws).typed_rtal), ValueError,
        r"model_type 'rtal'.*auto_map names GTransConfig.*model_type back \('gtrans'\)"),
    # before, averaged again as a training checkpoint
    Row("average-averaged-model-as-checkpoint", lambda ws: last_checkpoints(_loading_dirs(ws).averaged_in_run, 2),
        ValueError, r"averaged_in_run/checkpoint-3'.*averaged model.*checkpoint-1.*checkpoint-2.*count twice"),
    Row("average-hand-saved-model-as-checkpoint", lambda ws: last_checkpoints(_loading_dirs(ws).hand_saved_in_run, 2),
        ValueError, r"hand_saved_in_run/checkpoint-3'.*without the Trainer's trainer_state\.json"),
    Row("average-into-checkpoint-name",
        lambda ws: average_last_checkpoints(ws.checkpoints, 2, ws.checkpoints / "checkpoint-30"), ValueError,
        r"checkpoint-30'.*named like a checkpoint.*run/averaged'"),
    # before, averaged: the embeddings of two vocabularies
    Row("average-different-tokenizers",
        lambda ws: average_last_checkpoints(_loading_dirs(ws).mixed_tokenizers_run, 2, ws.root / "new_average"),
        ValueError, r"checkpoint-1'.*checkpoint-2'.*tokenizers differ \(tokenizer\.json\)"),
    # before, trained in float32 without a word (--bf16 autocasts on CPUs: tests/test_training_pipeline.py)
    Row("train-cli-fp16-on-cpu", lambda ws: run_translation.main(_rt_args(ws, "--model_type=gtrans", "--fp16=True")),
        ValueError, r"--fp16 True.*CPUs.*float32.*--bf16 True"),
    # before, failed in the optimizer's state, naming no family
    Row("train-cli-resume-another-family",
        lambda ws: run_translation.main(_rt_args(ws, "--model_type=rtal", "--resume_from_checkpoint=last",
                                                 output_dir=_loading_dirs(ws).trainer_run)),
        ValueError, r"trainer_run/checkpoint-2 is a checkpoint of a 'gtrans' model.*'rtal'.*--model_type gtrans"),
]


def _param(row: Row):
    return pytest.param(row, id=row.id)


def raising_functions(module) -> set[str]:
    """Names of the functions (methods included) of `module`'s source file that contain a `raise` statement."""
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and any(isinstance(inner, ast.Raise) for inner in ast.walk(node))
    }


def raise_site(error: BaseException) -> tuple[str, str] | None:
    """(file relative to the repository, function) of the innermost frame of this package or its example scripts in
    the error's traceback: where the package decided to refuse."""
    root = Path(hf_layerfusion.__file__).resolve().parents[1]
    frames = [
        frame
        for frame in traceback.extract_tb(error.__traceback__)
        if Path(frame.filename).resolve().is_relative_to(root / "hf_layerfusion")
        or Path(frame.filename).resolve().is_relative_to(EXAMPLES)
    ]
    if not frames:
        return None
    return str(Path(frames[-1].filename).resolve().relative_to(root)), frames[-1].name


# the modules of input checks: every function of theirs that can raise must be where some row's error comes from
CHECK_MODULES = (file_checks, input_checks)


def test_every_check_of_the_check_modules_has_a_row(ws):
    """The catalogue against the code, not against itself: every row is refused by this package (its innermost
    package frame is where the error comes from, not a library underneath), and every function of the check modules
    (hf_layerfusion/file_checks.py, hf_layerfusion/modeling/input_checks.py) that can raise is where at least one
    row's error comes from, so a new check without a row, or a row whose check went missing, fails here. Row ids are
    unique (they are the test ids)."""
    assert len({row.id for row in ROWS}) == len(ROWS)
    sites = set()
    for row in ROWS:
        with torch.no_grad(), pytest.raises(row.error) as raised:
            row.call(ws)
        site = raise_site(raised.value)
        assert site is not None, f"{row.id}: raised outside hf_layerfusion and examples/"
        sites.add(site)
    root = Path(hf_layerfusion.__file__).resolve().parents[1]
    checks = {
        (str(Path(module.__file__).resolve().relative_to(root)), name)
        for module in CHECK_MODULES
        for name in raising_functions(module)
    }
    found = {name for _, name in checks}
    assert found >= {"check_model_inputs", "check_decoder_groups", "decode_utf8", "check_output_dir"}  # parse found them
    missing = sorted(checks - sites)
    assert not missing, f"checks that no row reaches: {missing}"


@pytest.mark.parametrize("row", [_param(row) for row in ROWS])
def test_bad_input(row: Row, ws):
    before = _snapshot(ws.root)
    with torch.no_grad(), pytest.raises(row.error) as raised:
        row.call(ws)
    message = str(raised.value)
    assert re.search(row.message.format(vocab=ws.vocab), message, flags=re.DOTALL), message
    # a family error lists this package's families, not transformers' hundreds of model types
    assert "'bert'" not in message and "xlm-roberta-xl" not in message
    assert _snapshot(ws.root) == before, "a file of the workspace changed"


def test_checked_loading_keeps_legitimate_loads(ws, tmp_path):
    """What the load check must not refuse: a base model from a checkpoint of its own family with a head (the head
    weights are left out), a plain Transformer checkpoint as GTrans or deep representations (fusion weights start
    fresh), a base model from its own checkpoint."""
    base = hf_layerfusion.GTransModel.from_pretrained(ws.gtrans_dir)
    assert torch.equal(base.shared.weight, ws.gtrans.model.shared.weight)
    gtrans = GTransForConditionalGeneration.from_pretrained(ws.plain_dir, config=_tiny(GTransConfig, ws.vocab, **GROUPS))
    assert torch.equal(gtrans.model.shared.weight, ws.plain.model.shared.weight)
    # the README's recipe: a plain checkpoint as deep representations, the family's keys given to from_pretrained
    deep = hf_layerfusion.DeepRepresentationsForConditionalGeneration.from_pretrained(
        ws.plain_dir, encoder_aggregation="hierarchical", decoder_aggregation="hierarchical", diversity_weight=1.0)
    assert any(".connection.nodes." in name for name in deep.state_dict())
    for name, value in ws.plain.state_dict().items():
        assert torch.equal(deep.state_dict()[name], value), name
    # a base model saved alone loads back as itself
    ws.gtrans.model.save_pretrained(tmp_path)
    assert torch.equal(hf_layerfusion.GTransModel.from_pretrained(tmp_path).shared.weight, ws.gtrans.model.shared.weight)


def test_an_integer_tensor_the_model_has_no_place_for_is_the_load_reports(ws, tmp_path):
    """transformers' common test `test_model_weights_reload_no_missing_tied_weights` replaces the weights by an int64
    tensor named "tensor": nothing is cast into a weight, so the load report (its unexpected and missing keys) is the
    caller's, not the integer-weight refusal's (`load-integer-weight`)."""
    ws.plain.save_pretrained(tmp_path)
    safetensors.torch.save_file({"tensor": torch.tensor([1, 2])}, tmp_path / "model.safetensors", metadata={"format": "pt"})
    _, info = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, output_loading_info=True)
    assert set(info["unexpected_keys"]) == {"tensor"} and info["cast_keys"] == {}
    with pytest.raises(ValueError, match="needs tensors it lacks"):
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path)


@pytest.mark.parametrize(
    "name, key, expected",
    [
        ("nan_weights", "non_finite_keys", ["model.encoder.layers.0.ffn.fc1.weight"]),
        ("missing_tensor", "missing_keys", {"model.encoder.layers.0.ffn.fc1.weight"}),
        ("normalize_before_flipped", "missing_keys",
         {f"model.{stack}.layer_norm.{p}" for stack in ("encoder", "decoder") for p in ("weight", "bias")}),
    ],
)
def test_output_loading_info_loads_an_inconsistent_checkpoint_for_a_caller_who_handles_it(ws, name, key, expected):
    """transformers' own argument for a caller who reads the load report: the model and the info, no error."""
    _, info = AutoModelForSeq2SeqLM.from_pretrained(getattr(ws, name), output_loading_info=True)
    assert info[key] == expected


def test_a_saved_config_keeps_the_attributes_transformers_set_on_it(tmp_path):
    """transformers' test utilities set other models' epsilon names on every config before saving it: that
    config.json loads back (the misspelt-key check must not refuse it), while the same name as a keyword is refused."""
    from transformers.testing_utils import set_config_for_less_flaky_test

    config = _tiny(GTransConfig, 24, **GROUPS)
    set_config_for_less_flaky_test(config)
    config.save_pretrained(tmp_path)
    assert AutoConfig.from_pretrained(tmp_path).rms_norm_eps == 1.0
    with pytest.raises(TypeError, match=r"\['rms_norm_eps'\].*did you mean"):
        GTransConfig(rms_norm_eps=1.0)


def test_overwrite_output_dir_replaces_the_runs_files_and_keeps_the_others(ws, tmp_path):
    """What `--overwrite_output_dir True` does (its help): a non-empty dir without checkpoints is trained into, the
    run's own files are replaced, the user's other files stay."""
    output_dir = tmp_path / "run"
    output_dir.mkdir()
    (output_dir / "notes.txt").write_text("keep me\n", encoding="utf-8")
    (output_dir / "config.json").write_text("{}\n", encoding="utf-8")  # an earlier run's file
    with pytest.raises(FileExistsError, match="not empty"):
        run_translation.main(_rt_args(ws, "--model_type=gtrans", "--save_strategy=no", output_dir=output_dir))
    run_translation.main(
        _rt_args(ws, "--model_type=gtrans", "--save_strategy=no", "--overwrite_output_dir=True", output_dir=output_dir)
    )
    assert (output_dir / "notes.txt").read_text(encoding="utf-8") == "keep me\n"
    assert json.loads((output_dir / "config.json").read_text())["model_type"] == "gtrans"


def test_a_checkpoint_path_resumes_into_its_own_run_dir_or_a_new_one(ws, tmp_path):
    """What `--resume_from_checkpoint <path>` may do (the catalogue's train-cli-resume-path-* rows are what it may
    not): continue a checkpoint of its own --output_dir, which holds that run's files (the usual way, as `last`), or
    continue another dir's checkpoint into a new dir."""
    run = tmp_path / "run"
    shutil.copytree(_loading_dirs(ws).trainer_run, run)
    ws.gtrans.save_pretrained(run)  # what the run saved when it last ended

    def resolve(output_dir: Path, checkpoint: Path) -> str | None:
        args = Seq2SeqTrainingArguments(output_dir=str(output_dir), do_train=True,
                                        resume_from_checkpoint=str(checkpoint), use_cpu=True, report_to="none")
        return run_translation.resolve_checkpoint(args, False, [str(ws.gtrans_dir)], ["bleu_results.json"])

    assert resolve(run, run / "checkpoint-1") == str(run / "checkpoint-1")
    assert resolve(tmp_path / "new_run", run / "checkpoint-2") == str(run / "checkpoint-2")


def test_write_file_atomically_keeps_the_mode_and_leaves_no_temporary_file(tmp_path):
    """What the temporary file renamed into place must not change: the replaced file's permission bits, and the
    directory's listing (no temporary file left, after a success or a failure)."""
    path = tmp_path / "out.txt"
    path.write_text("old\n", encoding="utf-8")
    path.chmod(0o640)
    write_file_atomically(path, "new\n")
    assert path.read_text(encoding="utf-8") == "new\n" and path.stat().st_mode & 0o777 == 0o640
    with pytest.raises(OSError, match="out.txt"):
        _disk_full(lambda: write_file_atomically(path, "lost\n"))
    assert path.read_text(encoding="utf-8") == "new\n" and [child.name for child in tmp_path.iterdir()] == ["out.txt"]


def test_write_file_atomically_writes_a_special_file_in_place(tmp_path):
    """Issue 73: only a regular file can be replaced by a temporary file renamed over it. Before, `/dev/stdout` with
    stdout appended to a file (`>> log`) replaced that file (its earlier lines lost), with stdout a pipe the write
    failed once the work was done, and a FIFO was replaced by a regular file (its reader waited forever). Each is
    now written in place, where the shell's redirection asked; a terminal too, and each stays what it was."""
    from helpers import stdout_redirected_to

    log = tmp_path / "log.txt"
    log.write_text("an earlier line\n", encoding="utf-8")
    with open(log, "ab") as appended, stdout_redirected_to(appended.fileno()):
        write_file_atomically("/dev/stdout", "new line\n")
    assert log.read_text(encoding="utf-8") == "an earlier line\nnew line\n"
    read_end, write_end = os.pipe()
    with stdout_redirected_to(write_end):
        write_file_atomically("/dev/stdout", "into a pipe\n")
    os.close(write_end)
    assert os.read(read_end, 100) == b"into a pipe\n"
    os.close(read_end)
    fifo, received = tmp_path / "fifo", []
    os.mkfifo(fifo)
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    write_file_atomically(fifo, "into a FIFO\n")
    reader.join(timeout=60)
    assert received == [b"into a FIFO\n"] and stat.S_ISFIFO(fifo.stat().st_mode)
    controller, terminal = os.openpty()
    write_file_atomically(os.ttyname(terminal), "onto a terminal\n")
    assert os.read(controller, 100) == b"onto a terminal\r\n"  # the terminal's own line ending
    assert stat.S_ISCHR(os.stat(os.ttyname(terminal)).st_mode)
    os.close(terminal)
    os.close(controller)


def test_a_checkpoint_over_the_file_size_limit_is_named_and_nothing_of_it_is_left(ws, tmp_path):
    """Issue 73: over a file size limit (`ulimit -f`; a file system's own limit, FAT32's 4 GiB, is the same EFBIG) a
    checkpoint save failed with a bare "[Errno 27] File too large", naming no path, and left the checkpoint cut
    short, which `--resume_from_checkpoint last` would resume from; and a model saved over an earlier save left its
    Hub code cut in mid-statement (a SyntaxError for every load without the package). A real limit, in a process of
    its own: 100 kB, below the size of the Hub code."""
    from helpers import REPO_ROOT, run_python

    ws.plain.save_pretrained(tmp_path / "model")
    hub_code = (tmp_path / "model" / "modeling_layerfusion.py").read_bytes()
    script = (
        "import resource, sys, torch\n"
        "from transformers import AutoModelForSeq2SeqLM, Seq2SeqTrainingArguments\n"
        "import hf_layerfusion\n"
        "from hf_layerfusion.training.trainer import LayerFusionSeq2SeqTrainer\n"
        "model = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1])\n"
        "pairs = [{'input_ids': torch.tensor([4, 5, 2]), 'labels': torch.tensor([5, 4, 2])}] * 2\n"
        "args = Seq2SeqTrainingArguments(sys.argv[2], max_steps=1, save_steps=1, per_device_train_batch_size=2,\n"
        "                                report_to='none', use_cpu=True)\n"
        "trainer = LayerFusionSeq2SeqTrainer(model=model, args=args, train_dataset=pairs)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, resource.RLIM_INFINITY))\n"
        "try:\n"
        "    trainer.train()\n"
        "except OSError as error:\n"
        "    print('refused', error.errno, error)\n"
        "try:\n"
        "    model.save_pretrained(sys.argv[1])\n"
        "except OSError as error:\n"
        "    print('save refused', error.errno)\n"
    )
    output_dir = tmp_path / "run"
    result = run_python(["-c", script, str(tmp_path / "model"), str(output_dir)], {"PYTHONPATH": str(REPO_ROOT)},
                        cwd=tmp_path)
    refusal = result.stdout[result.stdout.index("refused "):]
    checkpoint = re.escape(f"{output_dir}/checkpoint-1")
    assert re.match(rf"refused {errno.EFBIG} \[Errno {errno.EFBIG}\] Could not save the checkpoint '{checkpoint}': "
                    r"a file grew larger than .*Nothing of it is left there", refusal), refusal
    assert not (output_dir / "checkpoint-1").exists()
    assert f"save refused {errno.EFBIG}" in result.stdout
    assert (tmp_path / "model" / "modeling_layerfusion.py").read_bytes() == hub_code


def test_output_dir_lock_names_its_holder_and_ends_with_the_run(tmp_path):
    """The lock file names the run that holds the dir; once that run ends the dir is free, and the lock file left
    there does not make the dir count as non-empty."""
    with lock_output_dir(tmp_path / "run") as directory:
        assert f"pid {os.getpid()} " in (directory / file_checks.LOCK_FILE).read_text(encoding="utf-8")
        with pytest.raises(RuntimeError, match=f"pid {os.getpid()} "):
            check_not_in_use(directory)
    check_not_in_use(directory)
    check_output_dir(directory)
    with lock_output_dir(directory):
        pass


def test_an_evaluation_writes_its_results_beside_the_model_it_reads(ws, tmp_path):
    """The legitimate case of the rule for runs that only evaluate: into the dir of the model they read, while it
    holds no result files; the model's files are left as they were."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    for path in ws.gtrans_dir.iterdir():
        (model_dir / path.name).write_bytes(path.read_bytes())
    model_files = _snapshot(model_dir)
    run_translation.main(_rt_eval_args(ws, model=model_dir, output_dir=model_dir))
    written = {name: digest for name, digest in _snapshot(model_dir).items() if name not in model_files}
    assert sorted(written) == [file_checks.LOCK_FILE, "bleu_results.json", "generated_predictions_validation.txt"]
    assert {name: _snapshot(model_dir)[name] for name in model_files} == model_files


def test_the_truncation_lengths_default_to_the_position_table_where_it_is_shorter(ws, tmp_path):
    """Fault round: with max_position_embeddings 16 the defaults (128) failed at the first batch longer than the
    table, after the tokenizer was written; they now default to the table (given lengths above it are refused up
    front: the catalogue's row)."""
    output_dir = tmp_path / "short_table"
    run_translation.main(_rt_args(ws, "--model_type=gtrans", "--config_overrides", "max_position_embeddings=16",
                                  "--builtin_num_train=40", "--tokenizer_vocab_size=34", output_dir=output_dir))
    assert (output_dir / "model.safetensors").is_file()


def test_the_multilingual_lengths_default_to_the_position_table_where_it_is_shorter(ws, tmp_path):
    """The same fault in run_multilingual.py: a tiny XLM-R of 24 positions leaves the model 22, and the defaults
    (128) failed at the first batch longer than that; the run now trains and translates within the table."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    long_en, long_de = " ".join(["a man rides a bike"] * 8), " ".join(["ein mann fährt rad"] * 8)  # > 22 tokens
    for split in ("train", "val", "test_2016_flickr"):
        (corpus / f"{split}.en").write_text(f"{long_en}\ntwo dogs play\n", encoding="utf-8")
        (corpus / f"{split}.de").write_text(f"{long_de}\nzwei hunde spielen\n", encoding="utf-8")
    output_dir = tmp_path / "short_ml_table"
    scores = run_multilingual.main([
        "--dataset=multi30k", f"--multi30k_dir={corpus}", "--languages=en,de", "--preset=none",
        f"--tiny_random_xlmr={tmp_path / 'xlmr'}", "--tiny_vocab_size=40",
        "--tiny_xlmr_config=hidden_size=16,num_hidden_layers=2,num_attention_heads=2,intermediate_size=32,"
        "max_position_embeddings=24", "--config_overrides=encoder_group_size=1,decoder_group_size=1",
        f"--output_dir={output_dir}", "--do_train", "--max_steps=1", "--num_beams=1", "--use_cpu=True",
        "--report_to=none",
    ])
    assert (output_dir / "model.safetensors").is_file() and scores


def test_a_multilingual_run_refuses_a_tiny_vocabulary_below_its_characters_before_writing(tmp_path):
    """run_multilingual.py trains the tiny XLM-R's tokenizer under its output dir's lock; a `--tiny_vocab_size`
    below the corpus' characters is refused before anything is written (the catalogue's row for run_translation.py's
    `--tokenizer_vocab_size`; the catalogue's corpus has files this run would read as other languages)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for split in ("train", "val", "test_2016_flickr"):
        (corpus / f"{split}.en").write_text("a man rides a bike\ntwo dogs play\n", encoding="utf-8")
        (corpus / f"{split}.de").write_text("ein mann fährt rad\nzwei hunde spielen\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"--tiny_vocab_size 8 cannot hold the 23 distinct characters .* pass at least 27"):
        run_multilingual.main([
            "--dataset=multi30k", f"--multi30k_dir={corpus}", "--languages=en,de", "--preset=none",
            f"--tiny_random_xlmr={tmp_path / 'xlmr'}", "--tiny_vocab_size=8", f"--output_dir={tmp_path / 'run'}",
            "--do_train", "--max_steps=1", "--use_cpu=True", "--report_to=none",
        ])
    assert sorted(path.name for path in tmp_path.iterdir()) == ["corpus"]
