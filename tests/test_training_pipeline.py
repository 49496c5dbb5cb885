"""Training pipeline: the trainer's loss and schedule against reference formulas, and examples/run_translation.py end
to end on real Multi30k sentences (train, BLEU, save, reload, translate; killed mid-training and resumed)."""

import io
import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import tiny_model
from safetensors.torch import load_file
from sacrebleu.metrics import BLEU
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback
from transformers.trainer_callback import ProgressCallback
from transformers.trainer_pt_utils import LabelSmoother
from transformers.utils import logging as transformers_logging

import hf_layerfusion
from hf_layerfusion import (
    GTransConfig,
    GTransForConditionalGeneration,
    PlainTransformerConfig,
    PlainTransformerForConditionalGeneration,
)
from hf_layerfusion.training.callbacks import CompactLogCallback, use_compact_logging
from hf_layerfusion.training.trainer import LayerFusionSeq2SeqTrainer, finished_checkpoint_state, load_checkpoint_weights

REPO_ROOT = Path(__file__).resolve().parents[1]
RUN_TRANSLATION = REPO_ROOT / "examples" / "run_translation.py"
sys.path.insert(0, str(REPO_ROOT / "examples"))
import run_translation  # noqa: E402

from hf_layerfusion.translation.translate import translate  # noqa: E402

EPSILON = 0.1


def trainer_for(model, output_dir, trainer_class=LayerFusionSeq2SeqTrainer, **overrides):
    args = Seq2SeqTrainingArguments(
        output_dir=str(output_dir), label_smoothing_factor=EPSILON, report_to="none", use_cpu=True, **overrides
    )
    return trainer_class(model=model, args=args)


def smoothed_cross_entropy(log_probs: torch.Tensor, labels: torch.Tensor, epsilon: float) -> torch.Tensor:
    """Mean over non-pad tokens of (1 - eps) * NLL(y) + eps * mean_v(-log p_v), written out."""
    mask = labels.ne(-100)
    nll = -log_probs.gather(-1, labels.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    uniform = -log_probs.mean(-1)
    return (((1 - epsilon) * nll + epsilon * uniform) * mask).sum() / mask.sum()


def test_gtrans_label_smoothing_is_applied_per_group(tmp_path, tiny_backbone, padded_batch):
    model = GTransForConditionalGeneration(GTransConfig(**tiny_backbone, encoder_group_size=1, decoder_group_size=1))
    with torch.no_grad():  # non-uniform psi, so that a wrong weighting shows
        model.model.decoder.readout.group_weight.copy_(torch.tensor([-2.0, 3.0]))

    labels = padded_batch["labels"]
    # as DataCollatorForSeq2Seq builds it
    batch = {**padded_batch, "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels)}

    # the stock trainer would smooth the mixture: GTrans refuses
    stock = trainer_for(model, tmp_path, trainer_class=Seq2SeqTrainer)
    with pytest.raises(ValueError, match="without `labels`"):
        stock.compute_loss(model.train(), dict(batch))

    trainer = trainer_for(model, tmp_path)
    assert trainer.label_smoother is None and model.config.label_smoothing == EPSILON
    loss = trainer.compute_loss(model.train(), dict(batch))

    # reference: Eq. 7 with every group's cross entropy smoothed, from the groups' log-probabilities
    with torch.no_grad():
        outputs = model.eval()(**{k: v for k, v in batch.items() if k != "labels"}, return_group_log_probs=True)
    expected = sum(
        psi * smoothed_cross_entropy(log_probs, labels, EPSILON)
        for psi, log_probs in zip(outputs.group_weights, outputs.group_log_probs)
    )
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-6)


def test_plain_loss_equals_hf_label_smoother(tmp_path, tiny_backbone, padded_batch):
    model = PlainTransformerForConditionalGeneration(PlainTransformerConfig(**tiny_backbone)).eval()
    labels = padded_batch["labels"]
    batch = {**padded_batch, "decoder_input_ids": model.prepare_decoder_input_ids_from_labels(labels)}
    loss = trainer_for(model, tmp_path).compute_loss(model, dict(batch))
    with torch.no_grad():
        outputs = model(**{k: v for k, v in batch.items() if k != "labels"})
    expected = LabelSmoother(epsilon=EPSILON)(outputs, labels)
    torch.testing.assert_close(loss.detach(), expected, rtol=1e-5, atol=1e-6)


def test_contradicting_label_smoothing_is_an_error(tmp_path, tiny_backbone):
    model = PlainTransformerForConditionalGeneration(PlainTransformerConfig(**tiny_backbone, label_smoothing=0.2))
    with pytest.raises(ValueError, match="label_smoothing_factor=0.1.*label_smoothing=0.2"):
        trainer_for(model, tmp_path)


def test_inverse_sqrt_schedule_is_fairseqs(tmp_path, tiny_backbone):
    peak, warmup = 1e-3, 8
    model = PlainTransformerForConditionalGeneration(PlainTransformerConfig(**tiny_backbone))
    trainer = trainer_for(model, tmp_path, learning_rate=peak, lr_scheduler_type="inverse_sqrt", warmup_steps=warmup)
    trainer.create_optimizer_and_scheduler(num_training_steps=100)
    for num_updates in range(40):
        # fairseq inverse_sqrt (warmup_init_lr 0): lr * num_updates / warmup, then lr * sqrt(warmup / num_updates)
        expected = peak * num_updates / warmup if num_updates < warmup else peak * math.sqrt(warmup / num_updates)
        assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(expected, rel=1e-12, abs=1e-15)
        trainer.optimizer.step()
        trainer.lr_scheduler.step()


def test_length_grouped_batches_come_in_random_order_and_evaluation_in_dataset_order(tmp_path, tiny_backbone):
    from datasets import Dataset
    from torch.nn.utils.rnn import pad_sequence

    lengths = [1 + (7 * i) % 13 for i in range(800)]
    dataset = Dataset.from_list([{"input_ids": [4] * n, "labels": [4, 2], "row": i} for i, n in enumerate(lengths)])

    def collate(features):
        input_ids = pad_sequence([torch.tensor(f["input_ids"]) for f in features], batch_first=True, padding_value=1)
        return {
            "input_ids": input_ids,
            "labels": torch.tensor([f["labels"] for f in features]),
            "row": torch.tensor([f["row"] for f in features]),
        }

    model = PlainTransformerForConditionalGeneration(PlainTransformerConfig(**tiny_backbone))
    trainer = LayerFusionSeq2SeqTrainer(
        model=model,
        args=Seq2SeqTrainingArguments(
            output_dir=str(tmp_path),
            per_device_train_batch_size=8,
            per_device_eval_batch_size=8,
            train_sampling_strategy="group_by_length",
            remove_unused_columns=False,
            report_to="none",
            use_cpu=True,
        ),
        data_collator=collate,
        train_dataset=dataset,
    )
    batches = [batch["row"].tolist() for batch in trainer.get_train_dataloader()]
    assert sorted(row for batch in batches for row in batch) == list(range(800))
    batch_lengths = [[lengths[row] for row in batch] for batch in batches]
    assert batch_lengths[0][0] == max(lengths)  # the longest example still comes first
    assert sum(max(b) - min(b) for b in batch_lengths) <= len(batches)  # grouped: (nearly) one length per batch
    # transformers serves the first 50 batches (one sorted mega-batch) by decreasing length; here they are shuffled
    longest = [max(b) for b in batch_lengths[:50]]
    assert sum(later > earlier for earlier, later in itertools.pairwise(longest)) > 10

    for loader in (trainer.get_eval_dataloader(dataset), trainer.get_test_dataloader(dataset)):
        assert [row for batch in loader for row in batch["row"].tolist()] == list(range(800))


class FailingAt(TrainerCallback):
    """Raises at the `step`-th call of `event` ("on_step_end" or "on_prediction_step"), after keeping the progress
    bars the trainer's callbacks then hold open."""

    def __init__(self, trainer, event: str, step: int):
        self.trainer, self.event, self.step, self.calls, self.open_bars = trainer, event, step, 0, []

    def fail_at(self, event: str) -> None:
        self.calls += event == self.event
        if self.calls == self.step:
            for callback in self.trainer.callback_handler.callbacks:
                if isinstance(callback, (ProgressCallback, CompactLogCallback)):
                    self.open_bars += [bar for bar in (callback.training_bar, callback.prediction_bar)
                                       if bar is not None]
            raise RuntimeError(f"planted failure at {event} {self.step}")

    def on_step_end(self, args, state, control, **kwargs):
        self.fail_at("on_step_end")

    def on_prediction_step(self, args, state, control, **kwargs):
        self.fail_at("on_prediction_step")


@pytest.mark.parametrize("view", ["transformers", "compact"])
@pytest.mark.parametrize("call, event, open_bars", [("train", "on_step_end", 1), ("train", "on_prediction_step", 2),
                                                    ("evaluate", "on_prediction_step", 1),
                                                    ("predict", "on_prediction_step", 1)])
def test_a_run_that_fails_leaves_no_progress_bar_open(tmp_path, tiny_backbone, padded_batch, view, call, event,
                                                      open_bars):
    """A training run that raised left the progress bars open (no callback hears of an exception), and on Python
    3.13 a bar still open at exit crashes the process with a segmentation fault after the traceback
    (callbacks.close_progress_bars). Failing while training (the training bar open), while evaluating during
    training (the evaluation bar too), in `evaluate()` or in `predict()`, with transformers' bars and with the
    compact view's, leaves none of them open."""
    examples = [{key: value[row] for key, value in padded_batch.items()} for row in range(3)]
    model = PlainTransformerForConditionalGeneration(PlainTransformerConfig(**tiny_backbone))
    trainer = LayerFusionSeq2SeqTrainer(
        model=model, train_dataset=examples, eval_dataset=examples,
        args=Seq2SeqTrainingArguments(output_dir=str(tmp_path), max_steps=3, per_device_train_batch_size=1,
                                      per_device_eval_batch_size=1, eval_strategy="steps", eval_steps=1,
                                      disable_tqdm=False, report_to="none", use_cpu=True))
    if view == "compact":
        use_compact_logging(trainer, file=io.StringIO())
    failing = FailingAt(trainer, event, step=2)
    trainer.add_callback(failing)
    with pytest.raises(RuntimeError, match="planted failure"):
        {"train": trainer.train, "evaluate": trainer.evaluate, "predict": lambda: trainer.predict(examples)}[call]()
    assert len(failing.open_bars) == open_bars
    assert all(bar.disable for bar in failing.open_bars)  # tqdm's close() sets it
    views = [c for c in trainer.callback_handler.callbacks if isinstance(c, (ProgressCallback, CompactLogCallback))]
    assert len(views) == 1 and views[0].training_bar is None and views[0].prediction_bar is None


# --------------------------------------------------------------------------------------------- the script
def script_args(data_dir: Path, output_dir: Path, max_steps: int, *extra: str) -> list[str]:
    return [
        f"--dataset_name={data_dir}",
        "--source_lang=en",
        "--target_lang=de",
        "--max_train_samples=300",
        "--max_eval_samples=12",
        "--max_predict_samples=12",
        "--model_type=gtrans",
        (
            "--config_overrides=d_model=32,encoder_layers=2,decoder_layers=2,encoder_ffn_dim=64,decoder_ffn_dim=64,"
            "encoder_attention_heads=2,decoder_attention_heads=2,encoder_group_size=1,decoder_group_size=1,"
            "max_position_embeddings=64"
        ),
        "--tokenizer_vocab_size=300",
        "--max_source_length=32",
        "--max_target_length=32",
        f"--output_dir={output_dir}",
        "--do_train",
        f"--max_steps={max_steps}",
        "--per_device_train_batch_size=16",
        "--per_device_eval_batch_size=12",
        "--learning_rate=3e-3",
        "--lr_scheduler_type=inverse_sqrt",
        "--warmup_steps=2",
        "--label_smoothing_factor=0.1",
        "--train_sampling_strategy=group_by_length",
        "--logging_steps=1",
        "--num_beams=2",
        "--disable_tqdm=True",
        "--dataloader_pin_memory=False",
        "--use_cpu=True",
        *extra,
    ]


def run_script(args: list[str], **popen_kwargs) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        [sys.executable, str(RUN_TRANSLATION), *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen_kwargs,
    )


def finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output[-4000:]
    return output


@pytest.mark.parametrize("model_type", sorted(hf_layerfusion.FAMILIES))
def test_run_translation_starts_each_family_from_its_own_start_token(model_type):
    """A new model gets the tokenizer's pad / bos / eos ids and the family's start token: SOS for layer-wise
    coordination (paper Sec. 4.3: the source, its EOS, then SOS), EOS for the others (fairseq / Marian). The ids are
    set apart from the configs' defaults so that a default cannot pass for them."""
    tokenizer = SimpleNamespace(pad_token_id=5, bos_token_id=7, eos_token_id=9)
    model_args = run_translation.ModelArguments(model_type=model_type, preset="multi30k")
    config = run_translation.build_config(model_args, 100, run_translation.tokenizer_special_ids(tokenizer))
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (5, 7, 9)
    assert config.decoder_start_token_id == (7 if model_type == "layerwise_coordination" else 9)


def test_run_translation_takes_family_presets():
    special_ids = dict(pad_token_id=1, bos_token_id=0, eos_token_id=2)
    paper = run_translation.ModelArguments(model_type="layerwise_coordination", preset="layerwise_paper_small")
    config = run_translation.build_config(paper, 100, special_ids)
    assert (config.encoder_layers, config.d_model, config.decoder_start_token_id) == (14, 256, 0)
    other_family = run_translation.ModelArguments(model_type="layerwise_coordination", preset="re_transformer_2")
    with pytest.raises(ValueError, match="'re_transformer_2' for layerwise_coordination.*'layerwise_paper_small'"):
        run_translation.build_config(other_family, 100, special_ids)


def test_bf16_on_cpus_trains_in_bfloat16_mixed_precision(tmp_path):
    """Issue 73: `--bf16 True --use_cpu True` is honoured (accelerate autocasts to bfloat16 on CPUs: every linear layer
    of the trained forward computes in bfloat16), while `--fp16 True` there trained in float32 without a word and is
    refused (the catalogue's row train-cli-fp16-on-cpu)."""
    computed_in = set()

    def record(module, inputs, output):
        if isinstance(module, torch.nn.Linear) and module.training:
            computed_in.add(output.dtype)

    hook = torch.nn.modules.module.register_module_forward_hook(record)
    try:
        run_translation.main([
            "--builtin_corpus", "--builtin_num_train=20", "--builtin_num_valid=4", "--builtin_num_test=4",
            f"--output_dir={tmp_path / 'run'}", "--do_train", "--max_steps=1", "--use_cpu=True", "--report_to=none",
            "--tokenizer_vocab_size=40", "--model_type=gtrans", "--save_strategy=no", "--bf16=True",
        ])
    finally:
        hook.remove()
    assert computed_in == {torch.bfloat16}


def test_run_translation_end_to_end(tmp_path, multi30k_dir):
    output_dir = tmp_path / "run"
    output = finish(
        run_script(script_args(multi30k_dir, output_dir, 6, "--do_eval", "--do_predict", "--save_strategy=no"))
    )

    results = json.loads((output_dir / "bleu_results.json").read_text())
    assert results["train"]["global_step"] == 6 and results["train"]["time_budget_ended_training"] is False
    references = (multi30k_dir / "test_2016_flickr.de").read_text(encoding="utf-8").split("\n")[:12]
    for split_name in ("validation", "test"):
        hypotheses = (
            (output_dir / f"generated_predictions_{split_name}.txt").read_text(encoding="utf-8").split("\n")[:-1]
        )
        assert len(hypotheses) == 12
        signature = results[split_name]["signature"]
        assert f"{split_name} BLEU = {results[split_name]['bleu']:.2f} (beam 2; {signature})" in output
    # the reported test BLEU is sacreBLEU of the written translations against the raw references
    assert results["test"]["bleu"] == pytest.approx(BLEU().corpus_score(hypotheses, [references]).score)
    assert (output_dir / "fusion_weights.png").is_file() and (output_dir / "layer_gradient_norms.png").is_file()

    # the saved dir is a complete model: Auto class + tokenizer + generation config, and translates
    model = AutoModelForSeq2SeqLM.from_pretrained(output_dir)
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    assert isinstance(model, GTransForConditionalGeneration) and model.config.label_smoothing == 0.1
    assert model.generation_config.num_beams == 2
    assert (model.generation_config.max_length, model.generation_config.max_new_tokens) == (33, None)
    assert len(translate(model, tokenizer, ["A man is riding a bike.", "Two dogs."], num_beams=2)) == 2
    # the generation limit is the saved one (32 new tokens), not transformers' generic max_length=20
    with torch.no_grad():
        model.final_logits_bias[0, tokenizer.eos_token_id] = -1e4  # never stop early
    generated = model.generate(**tokenizer(["A man."], return_tensors="pt"), num_beams=1)
    assert generated.shape[-1] == 33


def test_run_resumed_at_its_last_checkpoint_trains_no_further_step(tmp_path, multi30k_dir):
    """A run stopped after saving the checkpoint of its last step (while evaluating, say), resumed: transformers'
    loop trains one step before it checks `max_steps` (the study's ledger got a run of 2,001 steps so); the trainer
    takes the checkpoint's weights and state instead."""
    output_dir = tmp_path / "run"
    args = script_args(multi30k_dir, output_dir, 4, "--save_steps=4")
    run_translation.main(args)
    saved = load_file(output_dir / "checkpoint-4" / "model.safetensors")
    for name in ("model.safetensors", "trainer_state.json", "bleu_results.json"):  # as if killed after the checkpoint
        (output_dir / name).unlink()

    results = run_translation.main(args + ["--resume_from_checkpoint=last"])
    assert results["train"]["global_step"] == 4 and results["train"]["train_steps"] == 0
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and not (output_dir / "checkpoint-5").exists()
    assert [entry["step"] for entry in state["log_history"] if "loss" in entry] == [1, 2, 3, 4]
    assert state["stateful_callbacks"]["TimeBudgetCallback"]["attributes"]["elapsed_seconds"] > 0
    final = load_file(output_dir / "model.safetensors")
    assert final.keys() == saved.keys() and all(torch.equal(final[key], saved[key]) for key in saved)
    # a directory of weights without a trainer state is transformers' to resume from, not a finished run
    assert finished_checkpoint_state(tmp_path, 4) is None
    assert finished_checkpoint_state(output_dir / "checkpoint-4", 5) is None
    assert finished_checkpoint_state(output_dir / "checkpoint-4", 4).global_step == 4


@pytest.mark.parametrize("model_type", sorted(hf_layerfusion.FAMILIES))
def test_load_checkpoint_weights_fills_tied_tensors_and_refuses_other_models(tmp_path, model_type):
    """Every family's saved weights (tied tensors saved once: layer-wise coordination shares its layers) load into a
    fresh model to the same state dict; a checkpoint of another shape or family is refused before any weight changes."""
    saved = tiny_model(model_type, seed=1)
    saved.save_pretrained(tmp_path / "saved")
    model = tiny_model(model_type, seed=2)
    load_checkpoint_weights(model, tmp_path / "saved")
    assert all(torch.equal(model.state_dict()[key], value) for key, value in saved.state_dict().items())

    other = tiny_model(model_type, seed=2, d_model=32)
    before = {key: value.clone() for key, value in other.state_dict().items()}
    with pytest.raises(ValueError, match="of another shape"):
        load_checkpoint_weights(other, tmp_path / "saved")
    assert all(torch.equal(other.state_dict()[key], value) for key, value in before.items())
    foreign = "gtrans" if model_type != "gtrans" else "plain_transformer"
    with pytest.raises(ValueError, match=r"do not fit the model: \d+ of its tensors missing"):
        load_checkpoint_weights(tiny_model(foreign), tmp_path / "saved")
    with pytest.raises(FileNotFoundError, match="holds no model weights"):
        load_checkpoint_weights(model, tmp_path)


def test_resume_warns_only_about_keys_no_twin_loaded(tmp_path, caplog):
    """transformers' Trainer warned at every resume about each tied key `save_pretrained` saves once (layer-wise
    coordination's shared layers: two hundred names); the trainer warns only about keys nothing loaded."""
    model = tiny_model("layerwise_coordination")
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert len(model.state_dict()) - len(saved) >= 10  # the shared layers' decoder names are not saved
    trainer = LayerFusionSeq2SeqTrainer(model=model, args=Seq2SeqTrainingArguments(output_dir=str(tmp_path / "out"),
                                                                                     use_cpu=True, report_to=[]))
    transformers_logging.enable_propagation()  # so that caplog would see transformers' own warning too
    try:
        with caplog.at_level("WARNING"):
            trainer._issue_warnings_after_load(model.load_state_dict(saved, strict=False))
    finally:
        transformers_logging.disable_propagation()
    assert "missing keys" not in caplog.text
    lost = sorted(saved)[0]
    with caplog.at_level("WARNING"):
        trainer._issue_warnings_after_load(model.load_state_dict({k: v for k, v in saved.items() if k != lost},
                                                                 strict=False))
    assert f"There were missing keys in the checkpoint model loaded: ['{lost}']" in caplog.text


def test_killed_run_resumes(tmp_path, multi30k_dir):
    output_dir = tmp_path / "run"
    args = script_args(multi30k_dir, output_dir, 40, "--save_steps=4", "--max_train_minutes=30")
    process = run_script(args)
    first_state = output_dir / "checkpoint-4" / "trainer_state.json"
    deadline = time.monotonic() + 240
    while not first_state.is_file():
        assert process.poll() is None, process.communicate()[0][-4000:]
        assert time.monotonic() < deadline, "no checkpoint written"
        time.sleep(0.05)
    time.sleep(0.3)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    assert process.returncode == -signal.SIGKILL
    steps_done = [int(path.name.split("-")[1]) for path in output_dir.glob("checkpoint-*")]
    assert max(steps_done) < 40 and not (output_dir / "bleu_results.json").exists()

    # starting over in the same dir is refused with a clear message
    refused = run_script(args)
    output, _ = refused.communicate(timeout=300)
    assert refused.returncode != 0 and "--resume_from_checkpoint last" in output

    finish(run_script(args + ["--resume_from_checkpoint=last"]))
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 40
    # one training log per step: the steps before the kill come from the checkpoint, the rest from the resumed run
    assert [entry["step"] for entry in state["log_history"] if "loss" in entry] == list(range(1, 41))
    # the time budget continued from the checkpoint's clock
    checkpoint_state = json.loads(first_state.read_text())
    budgets = [
        s["stateful_callbacks"]["TimeBudgetCallback"]["attributes"]["elapsed_seconds"]
        for s in (state, checkpoint_state)
    ]
    assert budgets[0] > budgets[1] > 0
