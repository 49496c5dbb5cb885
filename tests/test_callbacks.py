"""Callbacks: logged fusion weights are the paper's transforms of the parameters, per-layer gradient norms are those
of autograd, plots are written, the time budget stops (and survives a resume)."""

import copy
import logging
import errno
import math
import os
import sys
from unittest import mock

import pytest
import torch
from helpers import EOS, FIRST_TOKEN_ID, PAD
from datasets import Dataset
from torch.nn.utils.rnn import pad_sequence
from transformers import Seq2SeqTrainingArguments, TrainerControl, TrainerState

from hf_layerfusion import (
    GTransConfig,
    GTransForConditionalGeneration,
    PlainTransformerConfig,
    PlainTransformerForConditionalGeneration,
)
from hf_layerfusion.training.callbacks import (
    FusionWeightsCallback,
    LayerGradientNormCallback,
    TimeBudgetCallback,
    plot_logged_series,
)
from hf_layerfusion.training.trainer import LayerFusionSeq2SeqTrainer


def toy_dataset(vocab_size: int, num_examples: int = 8) -> Dataset:
    """Copy task with varying lengths, every sequence ending in EOS."""
    generator = torch.Generator().manual_seed(7)
    rows = []
    for i in range(num_examples):
        tokens = torch.randint(FIRST_TOKEN_ID, vocab_size, (3 + i % 4,), generator=generator).tolist() + [EOS]
        rows.append({"input_ids": tokens, "labels": tokens})
    return Dataset.from_list(rows)


def collate(features):
    """Right-pad sources with PAD (and mask them) and labels with -100."""
    input_ids = pad_sequence([torch.tensor(f["input_ids"]) for f in features], batch_first=True, padding_value=PAD)
    labels = pad_sequence([torch.tensor(f["labels"]) for f in features], batch_first=True, padding_value=-100)
    return {"input_ids": input_ids, "attention_mask": input_ids.ne(PAD).long(), "labels": labels}


def training_args(output_dir, **overrides) -> Seq2SeqTrainingArguments:
    defaults = dict(
        output_dir=str(output_dir),
        per_device_train_batch_size=8,
        max_steps=3,
        logging_steps=1,
        learning_rate=0.05,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        train_sampling_strategy="sequential",
        use_cpu=True,
    )
    return Seq2SeqTrainingArguments(**{**defaults, **overrides})


def test_fusion_weights_logged_and_plotted(tmp_path, tiny_backbone):
    config = GTransConfig(**tiny_backbone, encoder_group_size=1, decoder_group_size=1)  # M = N = 2
    model = GTransForConditionalGeneration(config)
    trainer = LayerFusionSeq2SeqTrainer(
        model=model,
        args=training_args(tmp_path),
        data_collator=collate,
        train_dataset=toy_dataset(config.vocab_size),
        callbacks=[FusionWeightsCallback(), LayerGradientNormCallback()],
    )
    # the log-enriching callbacks run before the reporting integrations
    assert [type(cb) for cb in trainer.callback_handler.callbacks[:2]] == [
        FusionWeightsCallback,
        LayerGradientNormCallback,
    ]
    trainer.train()

    training_logs = [entry for entry in trainer.state.log_history if "loss" in entry]
    assert [entry["step"] for entry in training_logs] == [1, 2, 3]
    last = training_logs[-1]  # logged after the last step: the final parameters
    readouts = model.model.encoder.readout, model.model.decoder.readout
    tau = math.sqrt(config.d_model)
    group_scores = [math.exp(w / tau) for w in readouts[1].group_weight.tolist()]
    expected = {
        **{
            f"fusion/encoder_group_gate_{i}": (1 / (1 + math.exp(-w)))
            for i, w in enumerate(readouts[0].weight.tolist(), 1)
        },
        **{
            f"fusion/decoder_layer_gate_{i}": (1 / (1 + math.exp(-w)))
            for i, w in enumerate(readouts[1].layer_weight.tolist(), 1)
        },
        **{f"fusion/decoder_group_psi_{i}": s / sum(group_scores) for i, s in enumerate(group_scores, 1)},
    }
    assert {key: last[key] for key in expected} == pytest.approx(expected, abs=1e-6)
    assert not any(key.startswith("fusion/") for key in set(last) - set(expected))
    # training moved the gates away from their initial sigma(0) = 1/2
    assert max(abs(last[key] - 0.5) for key in expected if "gate" in key) > 1e-3
    assert all(f"layer_grad_norm/decoder_{i}" in entry for entry in training_logs for i in (1, 2))

    for name in ("fusion_weights.png", "layer_gradient_norms.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_matplotlib_training_finishes_and_logs_without_plots(tmp_path, tiny_backbone, monkeypatch, caplog):
    """matplotlib is the `train` extra's, not a requirement: without it the callbacks say so when they are made, log
    their values as always, and training ends and saves instead of failing in `on_train_end`."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    config = GTransConfig(**tiny_backbone, encoder_group_size=1, decoder_group_size=1)
    with caplog.at_level(logging.WARNING, logger="hf_layerfusion.training.callbacks"):
        callbacks = [FusionWeightsCallback(), LayerGradientNormCallback()]
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["matplotlib is not installed"] * 2
    assert "fusion weights" in caplog.records[0].getMessage() and "pip install matplotlib" in caplog.text
    trainer = LayerFusionSeq2SeqTrainer(model=GTransForConditionalGeneration(config), args=training_args(tmp_path),
                                        data_collator=collate, train_dataset=toy_dataset(config.vocab_size),
                                        callbacks=callbacks)
    trainer.train()
    trainer.save_model()
    last = [entry for entry in trainer.state.log_history if "loss" in entry][-1]
    assert "fusion/decoder_group_psi_1" in last and "layer_grad_norm/decoder_1" in last
    assert not list(tmp_path.glob("*.png")) and (tmp_path / "config.json").is_file()


def test_plot_is_replaced_whole_or_not_at_all(tmp_path):
    """A plot is written through a temporary file renamed into place (issue 40): a disk that fills while it is
    written (`fsync` fails) leaves the previous plot whole and names the file; a success leaves only the plot."""
    log_history = [{"step": step, "fusion/gate_1": 0.5 + step / 10, "fusion/gate_2": 0.4} for step in (1, 2, 3)]
    path = tmp_path / "fusion_weights.png"
    path.write_bytes(b"the previous plot")
    with mock.patch("os.fsync", side_effect=OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))):
        with pytest.raises(OSError, match=r"fusion_weights\.png'.*No space left"):
            plot_logged_series(log_history, "fusion/", str(path), "Fusion weights")
    assert path.read_bytes() == b"the previous plot"
    assert [child.name for child in tmp_path.iterdir()] == [path.name]
    assert plot_logged_series(log_history, "fusion/", str(path), "Fusion weights") == str(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [child.name for child in tmp_path.iterdir()] == [path.name]


def test_layer_gradient_norms_equal_autograd(tmp_path, tiny_backbone):
    model = PlainTransformerForConditionalGeneration(PlainTransformerConfig(**tiny_backbone))
    reference = copy.deepcopy(model)
    dataset = toy_dataset(model.config.vocab_size)
    trainer = LayerFusionSeq2SeqTrainer(
        model=model,
        args=training_args(tmp_path, max_steps=1, max_grad_norm=0.0, optim="sgd"),
        data_collator=collate,
        train_dataset=dataset,
        callbacks=[LayerGradientNormCallback(plot_dir=str(tmp_path / "plots"))],
    )
    trainer.train()
    logged = next(entry for entry in trainer.state.log_history if "loss" in entry)

    # reference: one backward pass over the whole (single) batch, norms summed by hand
    reference(**collate(list(dataset))).loss.backward()
    for stack_name, stack in (("encoder", reference.model.encoder), ("decoder", reference.model.decoder)):
        for i, layer in enumerate(stack.layers, 1):
            expected = math.sqrt(sum((p.grad.double() ** 2).sum().item() for p in layer.parameters()))
            assert logged[f"layer_grad_norm/{stack_name}_{i}"] == pytest.approx(expected, rel=1e-5)
    assert (tmp_path / "plots" / "layer_gradient_norms.png").is_file()
    assert not (tmp_path / "plots" / "fusion_weights.png").exists()


def test_time_budget_stops_training_and_says_so(tmp_path, tiny_backbone, caplog):
    model = PlainTransformerForConditionalGeneration(PlainTransformerConfig(**tiny_backbone))

    def train(budget: TimeBudgetCallback, max_steps: int) -> int:
        trainer = LayerFusionSeq2SeqTrainer(
            model=model,
            args=training_args(tmp_path, max_steps=max_steps),
            data_collator=collate,
            train_dataset=toy_dataset(model.config.vocab_size),
            callbacks=[budget],
        )
        caplog.clear()
        with caplog.at_level("WARNING", logger="hf_layerfusion.training.callbacks"):
            trainer.train()
        return trainer.state.global_step

    budget = TimeBudgetCallback(max_minutes=1e-7)  # 6 microseconds: over after the first step
    assert train(budget, max_steps=50) == 1 and budget.ended_training
    assert "The time budget ended training" in caplog.text and "1e-07 minutes used at step 1 of 50" in caplog.text
    # a budget that does not run out says nothing
    roomy = TimeBudgetCallback(max_minutes=60)
    assert train(roomy, max_steps=2) == 2 and not roomy.ended_training
    assert "time budget" not in caplog.text


def test_time_budget_continues_after_resume():
    """A resumed run starts from the time its checkpoint recorded, and uses its own (possibly new) budget."""
    state = TrainerState(stateful_callbacks=[TimeBudgetCallback(max_minutes=1.0)])
    state.stateful_callbacks["TimeBudgetCallback"]["attributes"]["elapsed_seconds"] = 90.0  # as saved in a checkpoint
    args = Seq2SeqTrainingArguments(output_dir="unused", report_to="none")

    still_has_time = TimeBudgetCallback(max_minutes=2.0)
    still_has_time.on_train_begin(args, state, TrainerControl())
    assert not still_has_time.on_step_end(args, state, TrainerControl()).should_training_stop
    assert still_has_time.state()["attributes"]["elapsed_seconds"] >= 90.0

    out_of_time = TimeBudgetCallback(max_minutes=1.0)
    out_of_time.on_train_begin(args, state, TrainerControl())
    assert out_of_time.on_step_end(args, state, TrainerControl()).should_training_stop

    with pytest.raises(ValueError, match="positive, got 0"):
        TimeBudgetCallback(max_minutes=0)


def test_compact_log_line_shows_step_loss_learning_rate_bleu_and_time():
    from hf_layerfusion.training.callbacks import compact_log_line, format_duration

    training = {"loss": 2.31456, "grad_norm": 1.2, "learning_rate": 0.0016, "epoch": 0.5, "fusion/encoder_gate_1": 0.5}
    line = compact_log_line(training, 400, 1600, 65.4, prefix="gtrans")
    assert line == "gtrans  step  400/1600  loss 2.315  lr 1.60e-03  1:05"
    # the strings transformers formats values into, an evaluation, no prefix, no known step count
    evaluation = {"eval_loss": "2.8712", "eval_bleu": "85.2149", "eval_runtime": 3.0}
    assert compact_log_line(evaluation, 800, 1600, 3725) == "step  800/1600  val loss 2.871  val BLEU 85.21  1:02:05"
    assert compact_log_line({"loss": 1.0}, 7, -1, 0) == "step 7  loss 1.000  0:00"
    # the end-of-training summary and logs without a loss or BLEU make no line
    assert compact_log_line({"train_runtime": 12.0, "train_loss": 2.0, "loss": 2.0}, 3, 3, 1) is None
    assert compact_log_line({"total_flos": 1e9}, 3, 3, 1) is None
    assert [format_duration(s) for s in (0, 59.9, 60, 3599, 3600)] == ["0:00", "0:59", "1:00", "59:59", "1:00:00"]


def test_compact_logging_replaces_the_printed_dicts(tmp_path, tiny_backbone, capsys):
    import io

    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from hf_layerfusion.training.callbacks import CompactLogCallback, use_compact_logging

    config = PlainTransformerConfig(**tiny_backbone)
    stream = io.StringIO()
    for disable_tqdm in (True, False):  # PrinterCallback, ProgressCallback
        trainer = LayerFusionSeq2SeqTrainer(
            model=PlainTransformerForConditionalGeneration(config),
            args=training_args(tmp_path, max_steps=4, logging_steps=2, disable_tqdm=disable_tqdm),
            data_collator=collate,
            train_dataset=toy_dataset(config.vocab_size),
            callbacks=[LayerGradientNormCallback()],
        )
        callback = use_compact_logging(trainer, prefix="toy", file=stream)
        kinds = [type(cb) for cb in trainer.callback_handler.callbacks]
        assert CompactLogCallback in kinds and PrinterCallback not in kinds and ProgressCallback not in kinds
        assert callback.prefix == "toy"
    trainer.train()
    printed = capsys.readouterr()
    assert "{" not in printed.out + printed.err  # no raw dict on the console
    lines = [line.strip() for line in stream.getvalue().replace("\r", "\n").split("\n") if line.strip()]
    log_lines = [line for line in lines if " loss " in f" {line} "]
    assert [line.split("  ")[:2] for line in log_lines] == [["toy", "step 2/4"], ["toy", "step 4/4"]], lines
    assert all(len(line) < 80 and " lr " in line for line in log_lines)
    assert any("toy training" in line and "4/4" in line for line in lines)  # the bar, at its end
    assert lines[-1].startswith("toy  trained 4 steps in ")
    # the full logs are still recorded
    assert any("layer_grad_norm/encoder_1" in entry for entry in trainer.state.log_history)


def test_compact_log_bars_take_their_line_from_the_environment(monkeypatch):
    from hf_layerfusion.training.callbacks import PROGRESS_POSITION_VARIABLE, CompactLogCallback

    monkeypatch.delenv(PROGRESS_POSITION_VARIABLE, raising=False)
    assert CompactLogCallback().position == 0
    monkeypatch.setenv(PROGRESS_POSITION_VARIABLE, "1")
    assert CompactLogCallback().position == 1 and CompactLogCallback(position=2).position == 2
    monkeypatch.setenv(PROGRESS_POSITION_VARIABLE, "first")
    with pytest.raises(ValueError, match="must be a line number"):
        CompactLogCallback()
