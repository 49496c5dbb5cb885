"""Data-parallel training: one optimisation step of `LayerFusionSeq2SeqTrainer` on 2 CPU processes (DDP over
gloo) gives the parameters of one process on the concatenated batch, for the plain Transformer, GTrans, and GTrans
trained on a subset of its decoder groups (layers above the highest group and the mixture weights get no gradient:
DDP must not fail on unused parameters).

Launch: `CUDA_VISIBLE_DEVICES= accelerate launch --multi_gpu --num_processes 2 script.py` with
`use_cpu=True` in the training arguments. (In accelerate 1.x, `accelerate launch --num_processes 2 --cpu` starts
a *single* process unless an MPI hostfile is given; `--multi_gpu` is the torchrun-based multi-process launcher,
and the processes use gloo on CPU.) On GPUs: `accelerate launch --config_file examples/accelerate_multigpu.yaml
examples/run_translation.py ...`.

Tolerance: SGD with learning rate 1 makes each parameter change equal to its gradient. The two runs differ only in
float32 summation order (two half-batch sums all-reduced vs one sum; padding to different lengths), so they agree
to about 1e-7 relative; the test allows atol 1e-6 + rtol 1e-4. A wrong loss normalisation (e.g. each process
dividing by its own token count) changes gradients by several percent and fails.

This file is also the worker script: `python tests/test_ddp.py --worker ...`.
"""

import argparse
import json
import os
import socket
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # the worker runs outside pytest

import hf_layerfusion  # noqa: E402,F401
from helpers import TINY_BACKBONE  # noqa: E402
from hf_layerfusion import (  # noqa: E402
    GTransConfig,
    GTransForConditionalGeneration,
    PlainTransformerConfig,
    PlainTransformerForConditionalGeneration,
)
from hf_layerfusion.training.distributed import exit_distributed_process  # noqa: E402

PER_PROCESS_BATCH = 3
PAD, EOS, FIRST_TOKEN_ID, VOCAB = 1, 2, 4, 24
TINY = TINY_BACKBONE  # the suite's tiny sizes (conftest.py sits beside this worker script)
# name -> (model, decoder groups trained on)
CASES = {
    "plain": (lambda: PlainTransformerForConditionalGeneration(PlainTransformerConfig(**TINY)), None),
    "gtrans": (
        lambda: GTransForConditionalGeneration(GTransConfig(**TINY, encoder_group_size=1, decoder_group_size=1)),
        None,
    ),
    "gtrans_group_1": (
        lambda: GTransForConditionalGeneration(GTransConfig(**TINY, encoder_group_size=1, decoder_group_size=1)),
        [1],
    ),
}


def examples(num_examples: int) -> list[dict]:
    """Sources and targets of different lengths, so the two processes see different token counts."""
    generator = torch.Generator().manual_seed(3)
    rows = []
    for i in range(num_examples):
        source = torch.randint(FIRST_TOKEN_ID, VOCAB, (2 + 3 * i % 7,), generator=generator).tolist() + [EOS]
        target = torch.randint(FIRST_TOKEN_ID, VOCAB, (1 + 5 * i % 6,), generator=generator).tolist() + [EOS]
        rows.append({"input_ids": source, "labels": target})
    return rows


def collate(features: list[dict], decoder_groups: list[int] | None) -> dict:
    """Right-padded batch; `decoder_groups` (passed to the model's forward) restricts training to those groups."""
    from torch.nn.utils.rnn import pad_sequence

    input_ids = pad_sequence([torch.tensor(f["input_ids"]) for f in features], batch_first=True, padding_value=PAD)
    labels = pad_sequence([torch.tensor(f["labels"]) for f in features], batch_first=True, padding_value=-100)
    batch = {"input_ids": input_ids, "attention_mask": input_ids.ne(PAD).long(), "labels": labels}
    return batch if decoder_groups is None else {**batch, "decoder_groups": decoder_groups}


def worker(argv: list[str]) -> None:
    """Train each case's saved initial model for one SGD step (lr 1) and save the result."""
    from datasets import Dataset
    from transformers import AutoModelForSeq2SeqLM, Seq2SeqTrainingArguments

    from hf_layerfusion.training.trainer import LayerFusionSeq2SeqTrainer

    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--per_device_batch", type=int, required=True)
    parser.add_argument("--num_processes", type=int, required=True)
    parser.add_argument("--tag", required=True)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    dataset = Dataset.from_list(examples(2 * PER_PROCESS_BATCH))

    for name, (_, decoder_groups) in CASES.items():
        model = AutoModelForSeq2SeqLM.from_pretrained(args.root / name / "init")
        training_args = Seq2SeqTrainingArguments(
            output_dir=str(args.root / name / args.tag),
            per_device_train_batch_size=args.per_device_batch,
            max_steps=1,
            optim="sgd",
            learning_rate=1.0,
            lr_scheduler_type="constant",
            max_grad_norm=0.0,
            train_sampling_strategy="sequential",  # process r gets examples [r*B, (r+1)*B)
            label_smoothing_factor=0.1,
            save_strategy="no",
            report_to="none",
            disable_tqdm=True,
            use_cpu=True,
        )
        trainer = LayerFusionSeq2SeqTrainer(
            model=model,
            args=training_args,
            data_collator=partial(collate, decoder_groups=decoder_groups),
            train_dataset=dataset,
        )
        assert trainer.accelerator.num_processes == args.num_processes
        if args.num_processes > 1:
            assert torch.distributed.get_backend() == "gloo"
        trainer.train()
        trainer.save_model()
    exit_distributed_process()  # both processes have saved their models


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_two_processes(*script_and_args: str) -> None:
    """`accelerate launch` of 2 processes on this machine (CPU, gloo: see the module docstring)."""
    launcher = ["-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1"]
    launcher += ["--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]
    run([sys.executable, *launcher, *script_and_args])


def run(command: list[str]) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Each case's initial model, and the models after one step on 2 processes and on 1 process."""
    root = tmp_path_factory.mktemp("ddp")
    torch.manual_seed(0)
    for name, (build, _) in CASES.items():
        build().save_pretrained(root / name / "init")
    worker_args = [__file__, "--worker", "--root", str(root)]
    launch_two_processes(
        *worker_args, "--per_device_batch", str(PER_PROCESS_BATCH), "--num_processes", "2", "--tag", "ddp"
    )
    single = ["--per_device_batch", str(2 * PER_PROCESS_BATCH), "--num_processes", "1", "--tag", "single"]
    run([sys.executable, *worker_args, *single])
    return root


@pytest.mark.parametrize("name", list(CASES))
def test_two_processes_equal_one_process_on_concatenated_batch(trained, name):
    from transformers import AutoModelForSeq2SeqLM

    init, ddp, single = (
        dict(AutoModelForSeq2SeqLM.from_pretrained(trained / name / tag).named_parameters())
        for tag in ("init", "ddp", "single")
    )
    for parameter_name, value in single.items():
        torch.testing.assert_close(ddp[parameter_name], value, atol=1e-6, rtol=1e-4, msg=parameter_name)
    moved = {n for n in single if not torch.equal(single[n], init[n])}
    if CASES[name][1] == [1]:  # only decoder group 1 trained: decoder layer 2 and the mixture weights stay
        assert not any(n.startswith("model.decoder.layers.1.") for n in moved)
        assert "model.decoder.readout.group_weight" not in moved
        assert torch.equal(
            single["model.decoder.readout.layer_weight"][1], init["model.decoder.readout.layer_weight"][1]
        )
        assert "model.decoder.layers.0.ffn.fc1.weight" in moved
    else:
        assert "model.decoder.layers.1.ffn.fc1.weight" in moved
    assert "model.encoder.layers.0.ffn.fc1.weight" in moved


def test_run_translation_on_two_processes(tmp_path, kernels):
    """examples/run_translation.py under DDP: the tokenizer is trained once, the time budget stops both processes at
    the same step (a process that stopped alone would leave the other waiting in the next all-reduce), and the
    written test translations are those of the saved model, in dataset order (the gathered predictions carry
    copies of the first examples that filled the last round of batches). The `kernels` fixture compiles the C++
    kernels of the predictions' fast loop first: with a fresh extensions folder both processes would build them at
    once, one waiting for the other's lock, which can outlast the launch's time limit on a loaded machine."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_layerfusion.training.data import builtin_number_corpus

    sys.path.insert(0, str(REPO_ROOT / "examples"))
    from hf_layerfusion.translation.translate import translate

    output_dir = tmp_path / "run"
    corpus = dict(builtin_num_train=600, builtin_num_valid=10, builtin_num_test=21)  # 21: not a multiple of 2 x 8
    launch_two_processes(
        str(REPO_ROOT / "examples" / "run_translation.py"),
        "--builtin_corpus",
        *(f"--{key}={value}" for key, value in corpus.items()),
        "--source_lang=de",
        "--target_lang=en",
        "--model_type=gtrans",
        "--config_overrides=encoder_group_size=1,decoder_group_size=1,"
        + ",".join(f"{key}={value}" for key, value in TINY.items() if key != "vocab_size"),
        "--tokenizer_vocab_size=200",
        "--max_target_length=24",
        "--do_train",
        "--do_predict",
        f"--output_dir={output_dir}",
        "--max_steps=100000",
        "--max_train_minutes=0.05",
        "--per_device_train_batch_size=8",
        "--learning_rate=3e-3",
        "--lr_scheduler_type=inverse_sqrt",
        "--warmup_steps=10",
        "--train_sampling_strategy=group_by_length",
        "--num_beams=1",
        "--save_strategy=no",
        "--use_cpu=True",
        "--dataloader_pin_memory=False",
        "--disable_tqdm=True",
    )
    written = (output_dir / "generated_predictions_test.txt").read_text(encoding="utf-8").split("\n")[:-1]
    sources = [pair["de"] for pair in builtin_number_corpus("de", "en", 600, 10, 21)["test"]["translation"]]
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    assert written == translate(model, AutoTokenizer.from_pretrained(output_dir), sources, batch_size=1)
    results = json.loads((output_dir / "bleu_results.json").read_text())
    assert 0 < results["train"]["global_step"] < 100000


def test_multigpu_accelerate_config_parses():
    from accelerate.commands.config.config_args import load_config_from_file

    config = load_config_from_file(str(REPO_ROOT / "examples" / "accelerate_multigpu.yaml"))
    assert config.distributed_type == "MULTI_GPU" and not config.use_cpu


if __name__ == "__main__":
    worker(sys.argv[1:])
