"""Issue 76, the study's next question: the converged budget (early stopping on val BLEU every epoch, the val-best
checkpoint as the run's model, the last checkpoints' average beside it), the deep baselines that should train, their
place in the queue (priority 9) and its time estimates, and the report's sections on them. Tiny settings and fake
ledger entries, as tests/test_bench_multi30k.py's, whose modules and helpers these reuse; one end-to-end run through
run_translation.py with a tiny corpus."""

import json
import re
import shutil
import time

import pytest
import torch
from helpers import require_shared
from safetensors.torch import load_file
from test_bench_multi30k import (
    BOTH,
    HALF_RIGHT,
    MULTI30K,
    REFERENCES,
    TOKENIZER_DIR,
    WRONG,
    bench,
    fake_entry,
    ledger,
    package_snapshot,
    run_translation,
    tiny_corpus,
)

import study.queue

CONVERGED_OPTIONS = ["--max_epochs_per_model", "30", "--early_stopping_patience", "3"]


def command_options(command: list[str]) -> dict[str, str]:
    return dict(item[2:].split("=", 1) for item in command if "=" in item)


# --- the converged budget's command line ---------------------------------------------------------------------------


def test_the_converged_budget_stops_early_on_val_bleu_and_keeps_the_best_checkpoint(tmp_path):
    """The converged budget's run_translation.py options: val BLEU every epoch, a checkpoint with each, early stopping
    with its patience (kept across a resume), the best checkpoint loaded at the end, the last checkpoints and the
    best one kept; the study's learning rate and warm-up, as at 2,000 steps: only the budget differs."""
    data = ["--data_dir", str(tmp_path)]
    converged = bench.parse_args(["--models", "gtrans_converged", *CONVERGED_OPTIONS, *data])
    options = command_options(bench.run_translation_command("gtrans_converged", 1, converged, TOKENIZER_DIR))
    budget = {"num_train_epochs": "30", "eval_strategy": "epoch", "save_strategy": "epoch",
              "load_best_model_at_end": "True", "metric_for_best_model": "bleu", "greater_is_better": "True",
              "early_stopping_patience": "3", "restore_callback_states_from_checkpoint": "True",
              "save_total_limit": str(bench.AVERAGED_CHECKPOINTS + 1)}
    assert {key: options.get(key) for key in budget} == budget
    assert "max_steps" not in options and "save_steps" not in options and "max_train_minutes" not in options
    steps = bench.parse_args(["--models", "gtrans", "--max_steps_per_model", "2000", *data])
    step_options = command_options(bench.run_translation_command("gtrans", 1, steps, TOKENIZER_DIR))
    assert step_options["max_steps"] == "2000" and step_options["save_steps"] == "500"
    shared = set(options) & set(step_options) - {"output_dir", "save_total_limit"}
    assert {"learning_rate", "warmup_steps", "lr_scheduler_type", "config_overrides"} <= shared
    assert {key: options[key] for key in shared} == {key: step_options[key] for key in shared}
    # transformers and run_translation.py take every option as given (a misspelled one would be refused)
    _, _, run_args, training_args = run_translation.parse_args(
        bench.run_translation_command("gtrans_converged", 1, converged, TOKENIZER_DIR))
    assert run_args.early_stopping_patience == 3 and training_args.load_best_model_at_end
    assert training_args.metric_for_best_model == "bleu" and training_args.max_steps == -1


@pytest.mark.parametrize("argv, message", [
    # with the baselines it is compared with
    (["--models", "gtrans_converged", "--max_steps_per_model", "2000"],
     "plain_transformer_converged, gtrans_converged are trained to convergence: give them the converged budget"),
    (["--models", "gtrans", *CONVERGED_OPTIONS], "plain_transformer, gtrans are not trained to convergence"),
    # --run_only: the arm alone; a fine-tuning arm's starting run too
    (["--models", "deep_representations_paper_converged", "--run_only", "--max_steps_per_model", "2000"],
     "plain_transformer_converged, deep_representations_paper_converged are trained to convergence"),
    (["--models", "gtrans_converged", "--max_epochs_per_model", "30"], "go together"),
    (["--models", "gtrans_converged", "--early_stopping_patience", "3"], "go together"),
    (["--models", "gtrans_converged", *CONVERGED_OPTIONS, "--max_steps_per_model", "2000"], "replaces"),
    (["--models", "gtrans_converged", *CONVERGED_OPTIONS, "--minutes_per_model", "30"], "replaces"),
    (["--models", "gtrans_converged", "--max_epochs_per_model", "30", "--early_stopping_patience", "0"],
     "must be a positive integer"),
])
def test_an_arm_takes_its_own_budget_and_the_converged_budget_is_whole(tmp_path, capsys, argv, message):
    """One budget per arm in the ledger: an arm trained to convergence takes the converged budget, no other does,
    and the budget's two options go together, refused before anything is written."""
    with pytest.raises(SystemExit):
        bench.parse_args([*argv, "--output_dir", str(tmp_path / "runs")])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()


def test_an_output_dir_made_before_the_converged_budget_is_continued(tmp_path):
    """settings.json of an output dir made before the converged budget's settings existed lacks them: unset there,
    they do not differ from a step budget's (unset too), so its unfinished runs resume."""
    args = bench.parse_args(["--output_dir", str(tmp_path), "--max_steps_per_model", "2000"])
    bench.check_settings(args)
    settings = json.loads((tmp_path / "settings.json").read_text())
    for name in ("max_epochs_per_model", "early_stopping_patience"):
        del settings[name]
    (tmp_path / "settings.json").write_text(json.dumps(settings))
    bench.check_settings(args)
    converged = bench.parse_args(["--output_dir", str(tmp_path), "--models", "gtrans_converged", *CONVERGED_OPTIONS])
    with pytest.raises(SystemExit, match="max_epochs_per_model was None and is now 30"):
        bench.check_settings(converged)


@pytest.mark.parametrize("options, message", [
    (["--early_stopping_patience=0"], "`--early_stopping_patience` must be a positive integer, got 0"),
    (["--early_stopping_patience=2"], "pass --do_train and --load_best_model_at_end True"),
    (["--early_stopping_patience=2", "--eval_strategy=epoch", "--save_strategy=epoch"],
     "--load_best_model_at_end True"),
])
def test_run_translation_checks_early_stopping_before_writing(tmp_path, options, message):
    """run_translation.py --early_stopping_patience: a positive number of evaluations, with the best model loaded at
    the end (transformers' EarlyStoppingCallback would only warn, or assert once training began, after the run wrote
    its tokenizer): refused before the output dir is made."""
    output_dir = tmp_path / "run"
    with pytest.raises(ValueError, match=re.escape(message)):
        run_translation.main(["--builtin_corpus", "--builtin_num_train=8", "--source_lang=de", "--target_lang=en",
                              "--model_type=plain_transformer", "--do_train", f"--output_dir={output_dir}",
                              "--use_cpu=True", *options])
    assert not output_dir.exists()


def test_run_translation_help_documents_early_stopping(capsys):
    with pytest.raises(SystemExit):
        run_translation.parse_args(["--help"])
    assert "--early_stopping_patience" in capsys.readouterr().out


# --- the ledger entry's epoch curve and averaged checkpoints -------------------------------------------------------


def trainer_state(history: list[dict], best_step: int) -> dict:
    return {"log_history": history, "global_step": history[-1]["step"], "best_global_step": best_step}


def test_the_epoch_curve_is_val_bleu_at_each_evaluation_and_the_best_checkpoint_the_trainers():
    """The curve is the evaluations' val BLEU (not the training loss logged between them), the best checkpoint the
    one the Trainer kept as best (not the last)."""
    history = [{"epoch": 0.5, "step": 2, "loss": 9.0}, {"epoch": 1.0, "step": 4, "eval_bleu": 10.0, "eval_loss": 5.0},
               {"epoch": 1.5, "step": 6, "loss": 7.0}, {"epoch": 2.0, "step": 8, "eval_bleu": 14.5},
               {"epoch": 3.0, "step": 12, "eval_bleu": 13.0}, {"epoch": 3.0, "step": 12, "train_loss": 6.5}]
    state = trainer_state(history, best_step=8)
    assert ledger.epoch_curve(state) == [{"epoch": 1, "step": 4, "bleu": 10.0}, {"epoch": 2, "step": 8, "bleu": 14.5},
                                         {"epoch": 3, "step": 12, "bleu": 13.0}]
    assert ledger.best_checkpoint(state) == {"step": 8, "epoch": 2}


def converged_entry(arm, seed, bleu, hypotheses, curve=(20.0, 30.0, 29.0, 28.5), best_epoch=2, averaged_bleu=None,
                    averaged_hypotheses=None, **extra):
    """A fake entry of a run trained to convergence (patience 2, at most 30 epochs; 100 steps an epoch); its last
    checkpoints' average translates as its best checkpoint unless `averaged_hypotheses` says otherwise."""
    averaged_bleu = bleu + 0.5 if averaged_bleu is None else averaged_bleu
    averaged_hypotheses = hypotheses if averaged_hypotheses is None else averaged_hypotheses
    extra.setdefault("baseline", "plain_transformer_converged")
    return fake_entry(
        arm, seed, bleu, hypotheses, val_hypotheses=hypotheses, steps=100 * len(curve),
        training={"early_stopping_patience": 2, "max_epochs": 30},
        epoch_curve=[{"epoch": epoch, "step": 100 * epoch, "bleu": value} for epoch, value in enumerate(curve, 1)],
        best_checkpoint={"step": 100 * best_epoch, "epoch": best_epoch},
        averaged_checkpoints={
            "checkpoints": [f"checkpoint-{100 * epoch}" for epoch in range(1, len(curve) + 1)][-5:],
            **{split: {"bleu": averaged_bleu, "signature": "sig", "sentences": len(averaged_hypotheses),
                       "hypotheses": list(averaged_hypotheses)} for split in ("validation", "test")}},
        **extra)


def edit(entry: dict, change) -> dict:
    change(entry)
    return entry


@pytest.mark.parametrize("change, problem", [
    (lambda e: e["epoch_curve"][1].update(bleu=float("nan")), "field 'epoch_curve[1].bleu' is nan, not a BLEU score"),
    (lambda e: e["epoch_curve"][0].update(bleu=130.0), "field 'epoch_curve[0].bleu' is 130.0, not a BLEU score"),
    (lambda e: e["epoch_curve"][0].update(bleu="20"), "field 'epoch_curve[0].bleu' is '20', not a BLEU score"),
    (lambda e: e["epoch_curve"][2].pop("bleu"), "field 'epoch_curve[2]' lacks its 'bleu'"),
    (lambda e: e["epoch_curve"][2].update(epoch=2.5), "field 'epoch_curve[2].epoch' is 2.5, not a whole number"),
    (lambda e: e["epoch_curve"].reverse(), "not one evaluation per epoch in order"),
    (lambda e: e.update(epoch_curve=[]), "field 'epoch_curve' is [], not a list of evaluations"),
    (lambda e: e["best_checkpoint"].update(step=250), "not the step of an evaluation of its 'epoch_curve'"),
    (lambda e: e["averaged_checkpoints"]["validation"].update(bleu=-1.0),
     "field 'averaged_checkpoints.validation.bleu' is -1.0, not a BLEU score"),
    (lambda e: e["averaged_checkpoints"]["test"].update(bleu=float("inf")),
     "field 'averaged_checkpoints.test.bleu' is inf, not a BLEU score"),
    (lambda e: e["averaged_checkpoints"].pop("test"), "field 'averaged_checkpoints.test' lacks its 'bleu'"),
    (lambda e: e.pop("averaged_checkpoints"), "field 'averaged_checkpoints' lacks its 'bleu'"),
    (lambda e: e["averaged_checkpoints"]["test"]["hypotheses"].pop(),
     "field 'averaged_checkpoints.test.hypotheses' holds 59 translations, but 'averaged_checkpoints.test.sentences' "
     "is 60"),
], ids=["curve-nan", "curve-130", "curve-string", "curve-bleu-missing", "curve-epoch-fraction", "curve-order",
        "curve-empty", "best-not-evaluated", "averaged-negative", "averaged-inf", "averaged-test-missing",
        "averaged-missing", "averaged-hypotheses-truncated"])
def test_a_converged_entry_is_read_and_written_only_with_values_a_run_produces(tmp_path, change, problem):
    path = ledger.ledger_path(tmp_path, "gtrans_converged", 1)
    good = converged_entry("gtrans_converged", 1, 30.0, REFERENCES)
    ledger.write_entry(path, good)
    assert ledger.read_entry(path)["epoch_curve"] == good["epoch_curve"]
    bad = edit(converged_entry("gtrans_converged", 1, 30.0, REFERENCES), change)
    with pytest.raises(ValueError, match=f"not written: .*{re.escape(problem)}"):
        ledger.write_entry(ledger.ledger_path(tmp_path, "gtrans_converged", 2), {**bad, "seed": 2})
    path.write_text(json.dumps({"ledger_version": ledger.LEDGER_VERSION, **bad}).replace("Infinity", "1e400"))
    with pytest.raises(ledger.UnreadableResult, match=re.escape(problem)):
        ledger.read_ledger(tmp_path)
    assert study.queue.result_state(study.queue.ConvergedRun("gtrans_converged", 1), tmp_path)[0] == "unreadable"


# --- the queue: priority 9 and its time estimates ------------------------------------------------------------------


def test_priority_9_follows_everything_else_in_the_issues_order(tmp_path):
    """Item 1 first: the converged plain / GTrans pair with 3 seeds, then seed 1 of every other family trained to
    convergence (each after its baseline), then their seeds 2-3; then item 2: the deep baselines with 3 seeds (pre-norm
    24 + 18 with 1 seed among them, its seeds 2-3 last)."""
    assert study.queue.CONVERGED_SUFFIX == bench.CONVERGED_SUFFIX
    queue = study.queue.study_queue(ledger_dir=tmp_path)
    priority_9 = study.queue.converged_and_deep_baselines()
    assert queue[-len(priority_9):] == priority_9
    assert not any(isinstance(run, study.queue.ConvergedRun) for run in queue[:-len(priority_9)])
    families = ["layerwise_coordination_14_converged", "plain_transformer_prenorm_converged", "rtal_paper_converged",
                "re_transformer_2_converged", "plain_transformer_continued_converged",
                "deep_representations_paper_converged"]
    prenorm_12x12, prenorm_24x18 = study.queue.PRE_NORM_DEEP_ARMS
    warmup_4000 = ["plain_transformer_12x12_warmup4000", "gtrans_12x12_warmup4000"]
    expected = [(arm, seed) for seed in (1, 2, 3) for arm in ("plain_transformer_converged", "gtrans_converged")]
    expected += [(arm, seed) for seed in (1, 2, 3) for arm in families]
    expected += [(prenorm_12x12, 1), (prenorm_24x18, 1), *((arm, 1) for arm in warmup_4000)]
    expected += [run for seed in (2, 3) for run in [(prenorm_12x12, seed), *((arm, seed) for arm in warmup_4000)]]
    expected += [(prenorm_24x18, 2), (prenorm_24x18, 3)]
    assert [(run.arm, run.seed) for run in priority_9] == expected
    for run in priority_9:
        assert bench.MODELS[run.arm].converged == isinstance(run, study.queue.ConvergedRun), run.arm
        budget = (run.max_steps, run.warmup_steps)
        if run.arm in warmup_4000:
            assert budget == (study.queue.CONVERGED_BUDGET["max_epochs"] * study.queue.STEPS_PER_EPOCH, 4000)
        elif isinstance(run, study.queue.ConvergedRun):
            assert budget == (30 * study.queue.STEPS_PER_EPOCH, 1000)  # the study's warm-up: only the budget differs
        else:
            assert budget == (2000, 400)  # the post-norm depth arms' recipe
    assert study.queue.STARTING_RUNS["deep_representations_paper_converged"] == "plain_transformer_converged"
    assert bench.MODELS["deep_representations_paper_converged"].baseline == "plain_transformer_continued_converged"
    assert bench.MODELS["gtrans_12x12_warmup4000"].baseline == "plain_transformer_12x12_warmup4000"
    for arm in (prenorm_12x12, prenorm_24x18):
        assert bench.MODELS[arm].config["normalize_before"] and bench.MODELS[arm].show_loss_curve
    # the run's command is bench_multi30k.py's converged budget, in an output dir of its own
    args = study.queue.parse_args(["--data_dir", str(tmp_path)])
    run = study.queue.ConvergedRun("gtrans_12x12_warmup4000", 2, warmup_steps=4000)
    parsed = bench.parse_args(run.command(package_snapshot(tmp_path), args)[3:])
    assert (parsed.max_epochs_per_model, parsed.early_stopping_patience, parsed.warmup_steps) == (30, 3, 4000)
    assert run.run_dir().parent.parent.name == "epochs_30_patience_3_warmup_4000"
    with pytest.raises(ValueError, match="cap of 30 epochs in steps"):
        study.queue.ConvergedRun("gtrans_converged", 1, max_steps=2000)


def test_an_epoch_of_multi30k_is_the_steps_the_study_counts():
    require_shared(MULTI30K, "Multi30k data")
    pairs = len((MULTI30K / "train.en").read_text(encoding="utf-8").splitlines())
    batch = bench.TRAINING_OPTIONS["per_device_train_batch_size"]
    assert study.queue.STEPS_PER_EPOCH == -(-pairs // batch)


def cpu_run(ledger_dir, arm, seed, train_minutes, evaluation_minutes, steps=2000, **extra):
    ledger.write_entry(ledger.ledger_path(ledger_dir, arm, seed), fake_entry(
        arm, seed, 30.0, REFERENCES, steps=steps, train_minutes=train_minutes, evaluation_minutes=evaluation_minutes,
        device={"cpu": "CPU A", "gpu": None, "torch_threads": 1}, **extra))


def test_hours_expects_a_converged_run_to_train_as_long_as_the_longest_converged_run(tmp_path, monkeypatch):
    """Timed from its arm's 2,000-step runs, with a val evaluation every epoch (half a val + test one) and the final
    two (best and averaged): to its cap of 30 epochs while the ledger holds no converged run, then for as many epochs
    as the longest converged run (any arm) trained; a resumed run from its checkpoint on, at least one more epoch;
    once its arm's own converged runs exist, theirs (evaluations during training are in their training minutes)."""
    monkeypatch.setattr(study.queue, "WORK_DIR", tmp_path / "work")
    ledger_dir, cpu = tmp_path / "ledger", ledger.CpuKind("CPU A", None)
    cpu_run(ledger_dir, "gtrans", 1, train_minutes=40.0, evaluation_minutes=2.0)
    args = study.queue.parse_args(["--hours", "2", "--ledger_dir", str(ledger_dir)])
    run = study.queue.ConvergedRun("gtrans_converged", 1)
    epoch = study.queue.STEPS_PER_EPOCH
    minutes, source = study.queue.expected_minutes(run, args, cpu)
    assert minutes == pytest.approx(40.0 * 30 * epoch / 2000 + 2.0 * (2 + 30 / 2))
    assert "`gtrans`'s 1 CPU run(s)" in source
    assert f"scaled to {30 * epoch} steps and 17 val + test evaluations" in source
    assert "its cap of 30 epochs (no converged run in the ledger yet)" in source
    assert study.queue.fitting_runs([run], 300.0, args, cpu, set()) == []  # not the flat 90 minutes
    assert study.queue.fitting_runs([run], 310.0, args, cpu, set()) == [run]
    # converged runs of other arms: the longest of them, 13 epochs
    for seed, epochs in ((1, 11), (2, 13)):
        write(ledger_dir, converged_entry("re_transformer_2_converged", seed, 30.0, REFERENCES,
                                          curve=[30.0] * epochs, best_epoch=epochs - 3))
    minutes, source = study.queue.expected_minutes(run, args, cpu)
    assert minutes == pytest.approx(40.0 * 13 * epoch / 2000 + 2.0 * (2 + 13 / 2))
    assert "13 epochs, the longest of the ledger's 2 converged run(s)" in source
    assert study.queue.fitting_runs([run], 140.0, args, cpu, set()) == [run]
    # resumed after 10 epochs: 3 left; after 14: one more at least
    run.run_dir().mkdir(parents=True)
    (run.run_dir() / "STUDY_COMMIT").write_text(study.queue.git("rev-parse", "HEAD") + "\n")
    for done, left in ((10, 3), (14, 1)):
        checkpoint = run.run_dir() / f"checkpoint-{done * epoch}"
        checkpoint.mkdir()
        (checkpoint / "trainer_state.json").write_text("{}")
        minutes, source = study.queue.expected_minutes(run, args, cpu)
        assert minutes == pytest.approx(40.0 * left * epoch / 2000 + 2.0 * (2 + left / 2))
        assert f"for the {left * epoch} steps left after its checkpoint at step {done * epoch}" in source
    # a converged run past the cap of another budget counts only to this one's cap
    write(ledger_dir, converged_entry("re_transformer_2_converged", 3, 30.0, REFERENCES, curve=[30.0] * 31,
                                      best_epoch=28))
    assert study.queue.expected_epochs(run, ledger_dir) == (30, "30 epochs, the longest of the ledger's 3 converged "
                                                                "run(s)")
    # the arm's own converged runs: their minutes per step, to the steps left
    cpu_run(ledger_dir, "gtrans_converged", 2, train_minutes=300.0, evaluation_minutes=6.0, steps=15 * 454)
    left = 30 * epoch - 14 * epoch
    assert study.queue.expected_minutes(run, args, cpu)[0] == pytest.approx(300.0 * left / (15 * 454) + 6.0)
    # a fine-tuning arm trained to convergence: its converged starting run first, timed alike
    continued = study.queue.ConvergedRun("plain_transformer_continued_converged", 1)
    cpu_run(ledger_dir, "plain_transformer", 1, train_minutes=50.0, evaluation_minutes=2.0, baseline=None)
    cpu_run(ledger_dir, "plain_transformer_continued", 1, train_minutes=50.0, evaluation_minutes=2.0, baseline=None)
    one_run = 50.0 * 30 * epoch / 2000 + 2.0 * 17
    minutes, source = study.queue.expected_minutes(continued, args, cpu)
    assert minutes == pytest.approx(2 * one_run) and "`plain_transformer_converged` seed 1 first" in source


def test_hours_times_the_deep_baselines_from_the_same_shapes_post_norm_runs(tmp_path, monkeypatch):
    """Pre-norm at depth and the 4,000-step warm-up have no runs of their own model: the post-norm model of their
    shape times them (its 2,000-step runs, else its 1,000-step ones), else the 6 + 6 plain model by the layers."""
    monkeypatch.setattr(study.queue, "WORK_DIR", tmp_path / "work")
    ledger_dir, cpu = tmp_path / "ledger", ledger.CpuKind("CPU A", None)
    ledger_dir.mkdir()
    args = study.queue.parse_args(["--ledger_dir", str(ledger_dir)])
    prenorm = study.queue.StudyRun("plain_transformer_prenorm_24x18_2000steps", 1, **study.queue.DEEP_LONG_BUDGET)
    warmup = study.queue.ConvergedRun("plain_transformer_12x12_warmup4000", 1, warmup_steps=4000)
    assert study.queue.expected_minutes(prenorm, args, cpu)[0] == study.queue.UNTIMED_RUN_MINUTES  # an empty ledger
    assert study.queue.expected_minutes(warmup, args, cpu)[0] == pytest.approx(  # 90 min per 2,000 steps, not per run
        study.queue.UNTIMED_RUN_MINUTES * 30 * study.queue.STEPS_PER_EPOCH / 2000)
    cpu_run(ledger_dir, "plain_transformer", 1, train_minutes=30.0, evaluation_minutes=2.0, baseline=None)
    minutes, source = study.queue.expected_minutes(prenorm, args, cpu)
    assert minutes == pytest.approx((30.0 + 2.0) * 42 / 12) and "times 3.5 for its layers" in source
    cpu_run(ledger_dir, "plain_transformer_24x18", 1, train_minutes=60.0, evaluation_minutes=4.0, steps=1000,
            baseline=None)
    assert study.queue.expected_minutes(prenorm, args, cpu)[0] == pytest.approx(60.0 * 2 + 4.0)
    cpu_run(ledger_dir, "plain_transformer_24x18_2000steps", 1, train_minutes=100.0, evaluation_minutes=4.0,
            baseline=None)
    minutes, source = study.queue.expected_minutes(prenorm, args, cpu)
    assert minutes == pytest.approx(104.0) and "`plain_transformer_24x18_2000steps`'s 1 CPU run(s)" in source
    cap = 30 * study.queue.STEPS_PER_EPOCH
    assert study.queue.expected_minutes(warmup, args, cpu)[0] == pytest.approx((30.0 * cap / 2000 + 2.0 * 17) * 2)


# --- the report ----------------------------------------------------------------------------------------------------


def write(ledger_dir, entry):
    ledger.write_entry(ledger.ledger_path(ledger_dir, entry["arm"], entry["seed"]), entry)


def converged_ledger(ledger_dir):
    """GTrans wins at 2,000 steps and ties trained to convergence (identical translations to its baseline's), on
    two seeds, but wins as the average of its last checkpoints (the baseline's average translates worse); the
    converged plain run is the baseline, with its own curve."""
    for seed in (1, 2):
        write(ledger_dir, fake_entry("plain_transformer", seed, 11.0, WRONG, baseline=None, val_hypotheses=WRONG))
        write(ledger_dir, fake_entry("gtrans", seed, 40.0, REFERENCES, val_hypotheses=REFERENCES))
        write(ledger_dir, converged_entry("plain_transformer_converged", seed, 35.0, REFERENCES, baseline=None,
                                          curve=(25.0, 33.0, 34.0, 33.5, 33.0), best_epoch=3, averaged_bleu=35.5,
                                          averaged_hypotheses=HALF_RIGHT))
        write(ledger_dir, converged_entry("gtrans_converged", seed, 35.0, REFERENCES,
                                          curve=(24.0 + seed, 36.0, 35.0, 34.0), averaged_bleu=36.25))


def test_the_report_sets_the_step_budgets_verdict_beside_the_converged_one(tmp_path):
    converged_ledger(tmp_path)
    text = ledger.report(tmp_path, BOTH, bench.paired_bootstrap, {}, [], (), bench.STEP_BUDGET_ARMS)
    lines = text.splitlines()
    assert ("| `gtrans_converged` | 2 | 4 / 4 | 2 / 2 | 36.00 ± 0.00 | 35.00 ± 0.00 | 4 / 4 | 36.25 ± 0.00 "
            "| 36.25 ± 0.00 |") in lines
    assert ("| `plain_transformer_converged` | 2 | 5 / 5 | 3 / 3 | 36.00 ± 0.00 | 35.00 ± 0.00 | 5 / 5 | 35.50 ± 0.00 "
            "| 35.50 ± 0.00 |") in lines
    assert "until early stopping; 2 evaluations without a better val BLEU, at most 30 epochs)" in text
    assert ("| gtrans | `gtrans`, seeds 1, 2 | wins | wins | `gtrans_converged`, seeds 1, 2 | ties | ties "
            "| wins (Δ +0.75) | wins (Δ +0.75) |") in lines
    header = next(line for line in lines if line.startswith("| arm | seed | epoch 1 "))
    assert header.endswith("| epoch 3 | epoch 5 |")  # the epochs of the table up to the longest curve
    assert "| `gtrans_converged` | 2 | 26.00 | 36.00 | 35.00 | – |" in lines
    assert "| `plain_transformer_converged` | 1 | 25.00 | 33.00 | 34.00 | 33.00 |" in lines
    plot = ledger.display_path(ledger.epoch_curves_plot_path(tmp_path))
    assert f"![Val BLEU per epoch of the runs trained to convergence]({plot})" in lines
    conclusion = next(line for line in lines if line.startswith("- **gtrans**"))
    assert conclusion.index("*from scratch*: `gtrans` against `plain_transformer` wins") < conclusion.index(
        "*from scratch, trained to convergence*: `gtrans_converged` against `plain_transformer_converged` ties")
    assert ("; as the averages of their last checkpoints, wins on test (Δ +0.75 ± 0.00 BLEU over 2 seeds, p 0.001, "
            "0.001) and wins on val (Δ +0.75 ± 0.00, p 0.001, 0.001)") in conclusion
    # a converged arm whose step-budget comparison has not run says so; no converged run: no section
    (tmp_path / "gtrans" / "seed_1.json").unlink()
    (tmp_path / "gtrans" / "seed_2.json").unlink()
    text = ledger.report(tmp_path, BOTH, bench.paired_bootstrap, {}, [], (), bench.STEP_BUDGET_ARMS)
    assert ("| gtrans | `gtrans` | not run yet | not run yet | `gtrans_converged`, seeds 1, 2 | ties | ties "
            "| wins (Δ +0.75) | wins (Δ +0.75) |") in text
    for arm in ("plain_transformer_converged", "gtrans_converged"):
        shutil.rmtree(tmp_path / arm)
    assert "Trained to convergence" not in ledger.report(tmp_path, BOTH, bench.paired_bootstrap, {}, [], (),
                                                         bench.STEP_BUDGET_ARMS)


def test_the_epoch_curves_plot_is_drawn_from_the_ledger_and_only_with_converged_runs(tmp_path):
    from PIL import Image

    ledger_dir = tmp_path / "multi30k"
    converged_ledger(ledger_dir)
    path = ledger.plot_epoch_curves(ledger_dir)
    assert path == tmp_path / "multi30k_epoch_curves.png"
    runs = ledger.read_ledger(ledger_dir)
    with Image.open(path) as image:
        assert image.text[ledger.CURVES_DIGEST_KEY] == ledger.curves_digest(runs)
    other = converged_entry("gtrans_converged", 3, 35.0, REFERENCES, curve=(10.0, 20.0))
    write(ledger_dir, other)
    assert ledger.curves_digest(ledger.read_ledger(ledger_dir)) != ledger.curves_digest(runs)  # a stale plot shows
    for arm in ("plain_transformer_converged", "gtrans_converged"):
        shutil.rmtree(ledger_dir / arm)
    assert ledger.plot_epoch_curves(ledger_dir) is None and not path.exists()


def test_the_committed_epoch_curves_plot_is_the_committed_ledgers():
    """`python -m study.report` draws the plot beside the ledger report: none while the ledger holds no run
    trained to convergence, else one naming the ledger's curves."""
    from PIL import Image

    path = ledger.epoch_curves_plot_path(ledger.DEFAULT_LEDGER)
    runs = ledger.read_ledger(ledger.DEFAULT_LEDGER)
    if not ledger.converged_arms(runs):
        assert not path.exists(), f"{path}: no run trained to convergence in the ledger, but a plot of them"
        return
    with Image.open(path) as image:
        assert image.text.get(ledger.CURVES_DIGEST_KEY) == ledger.curves_digest(runs), (
            f"{path} is not the ledger's: run `python -m study.report`")


def deep_entry(arm, seed, bleu, hypotheses, baseline=None, val_bleu=None, val_hypotheses=None):
    entry = fake_entry(arm, seed, bleu, hypotheses, baseline=baseline,
                       val_hypotheses=hypotheses if val_hypotheses is None else val_hypotheses, show_loss_curve=True)
    entry["validation"]["bleu"] = bleu if val_bleu is None else val_bleu
    return entry


def test_the_depth_conclusion_waits_for_the_deep_baselines_that_train_then_answers_both_questions(tmp_path):
    """Per depth with a deep baseline that should train (12 + 12: pre-norm and the 4,000-step warm-up; 24 + 18:
    pre-norm), the best plain model of that depth against the best GTrans of that depth, once one of its training
    baselines has run; then whether depth pays at all."""
    def conclusion():
        lines = bench.depth_conclusion(ledger.read_ledger(tmp_path), BOTH)
        depth_pays = next(line for line in lines if line.startswith("**Does depth pay"))
        return {line[2:9]: line[11:] for line in lines if line.startswith("- ")}, depth_pays

    by_depth, depth_pays = conclusion()
    assert by_depth == {
        "12 + 12": ("no data yet: `plain_transformer_prenorm_12x12_2000steps` and "
                    "`plain_transformer_12x12_warmup4000`, the 12 + 12 baselines that should train, have not run "
                    "(`study/queue.py` priority 9)."),
        "24 + 18": ("no data yet: `plain_transformer_prenorm_24x18_2000steps`, the 24 + 18 baseline that should "
                    "train, has not run (`study/queue.py` priority 9)."),
    }
    assert depth_pays == "**Does depth pay at all at this data size?** No data yet: no deep run has finished."
    # the study's 2,000-step post-norm pairs: plain fails, GTrans trains; the 6 + 6 models
    for seed in (1, 2):
        write(tmp_path, fake_entry("plain_transformer", seed, 34.0, WRONG, baseline=None, val_hypotheses=WRONG))
        for depth in ("12x12", "24x18"):
            write(tmp_path, deep_entry(f"plain_transformer_{depth}_2000steps", seed, 2.0, WRONG))
            # GTrans 12 + 12: right on test, half right on val
            write(tmp_path, deep_entry(f"gtrans_{depth}_2000steps", seed, 35.0 if depth == "12x12" else 34.5,
                                       REFERENCES, baseline=f"plain_transformer_{depth}_2000steps",
                                       val_hypotheses=HALF_RIGHT if depth == "12x12" else REFERENCES))
    by_depth, depth_pays = conclusion()
    assert all(answer.startswith("no data yet: `plain_transformer_prenorm_") for answer in by_depth.values())
    assert depth_pays.startswith("**Does depth pay at all at this data size?** The best deep model (plain or GTrans "
                                 "from scratch with more than 6 + 6 layers, on val) is `gtrans_12x12_2000steps` (val "
                                 "35.00 ± 0.00, test 35.00 ± 0.00, seeds 1, 2), the best 6 + 6 one `plain_transformer` "
                                 "(val 35.00")
    assert "`gtrans_12x12_2000steps` against `plain_transformer` wins on test" in depth_pays
    assert depth_pays.endswith("Still to run: `plain_transformer_prenorm_12x12_2000steps`, "
                               "`plain_transformer_12x12_warmup4000`, `plain_transformer_prenorm_24x18_2000steps`, "
                               "the deep baselines that should train.")
    # a pre-norm 12 + 12 baseline that trains: better than GTrans 12 + 12 on val, worse on test (the translations
    # say so too: the paired bootstrap resamples them)
    for seed in (1, 2):
        write(tmp_path, deep_entry("plain_transformer_prenorm_12x12_2000steps", seed, 34.0, HALF_RIGHT,
                                   val_bleu=36.0, val_hypotheses=REFERENCES))
    by_depth, depth_pays = conclusion()
    assert by_depth["12 + 12"].startswith(
        "the best-trained baseline is `plain_transformer_prenorm_12x12_2000steps` (val 36.00 ± 0.00, test 34.00 "
        "± 0.00, seeds 1, 2); the best GTrans is `gtrans_12x12_2000steps`")
    assert ("`gtrans_12x12_2000steps` against `plain_transformer_prenorm_12x12_2000steps` wins on test (Δ +1.00 ± 0.00 "
            "BLEU over 2 seeds, p 0.001, 0.001) but loses on val (Δ -1.00 ± 0.00, p 0.001, 0.001).") in by_depth["12 + 12"]
    assert by_depth["12 + 12"].endswith("Still to run: `plain_transformer_12x12_warmup4000`.")
    assert by_depth["24 + 18"].startswith("no data yet: `plain_transformer_prenorm_24x18_2000steps`")
    assert "The best deep model" in depth_pays and "is `plain_transformer_prenorm_12x12_2000steps`" in depth_pays
    # a pre-norm 24 + 18 baseline that trains, one seed, below GTrans 24 + 18 on both splits
    write(tmp_path, deep_entry("plain_transformer_prenorm_24x18_2000steps", 1, 20.0, WRONG))
    by_depth, depth_pays = conclusion()
    assert by_depth["24 + 18"] == (
        "the best-trained baseline is `plain_transformer_prenorm_24x18_2000steps` (val 20.00, test 20.00, seed 1); "
        "the best GTrans is `gtrans_24x18_2000steps` (val 34.50 ± 0.00, test 34.50 ± 0.00, seeds 1, 2): "
        "`gtrans_24x18_2000steps` against `plain_transformer_prenorm_24x18_2000steps` wins on test (Δ +14.50 BLEU "
        "over 1 seed, p 0.001) and wins on val (Δ +14.50, p 0.001).")
    assert depth_pays.endswith("Still to run: `plain_transformer_12x12_warmup4000`, the deep baselines that should "
                               "train.")


# --- end to end: a tiny run trained to convergence through run_translation.py --------------------------------------


def test_a_tiny_converged_run_stops_early_keeps_its_best_checkpoint_and_resumes_with_its_count(tmp_path):
    """bench_multi30k.py --run_only of `plain_transformer_converged` on a tiny corpus (1 step an epoch, at most 4
    epochs, patience 2) through run_translation.py: at the warm-up's first steps val BLEU does not improve, so the run
    stops after epoch 3; the run's model is the val-best checkpoint's (epoch 1's), the entry records its curve, its
    best checkpoint and the average of its checkpoints, scored beside it. A stop during the final evaluations only
    evaluates again; a stop after epoch 2 resumes with its count of evaluations without a better BLEU: the resumed run
    stops after epoch 3 too, not 4."""
    output_dir, ledger_dir = tmp_path / "runs", tmp_path / "ledger"
    argv = ["--models", "plain_transformer_converged", "--run_only", "--seeds", "1", "--max_epochs_per_model", "4",
            "--early_stopping_patience", "2", "--max_new_tokens", "8", "--output_dir", str(output_dir),
            "--ledger_dir", str(ledger_dir), "--tokenizer_dir", str(TOKENIZER_DIR),
            "--data_dir", str(tiny_corpus(tmp_path))]

    def timed_run() -> tuple[dict, float]:
        """The entry bench.main writes, and the minutes the call took."""
        started = time.monotonic()
        bench.main(argv)
        return (ledger.read_entry(ledger.ledger_path(ledger_dir, "plain_transformer_converged", 1)),
                (time.monotonic() - started) / 60)

    entry, minutes = timed_run()
    run_dir = output_dir / "plain_transformer_converged" / "seed_1"
    assert 0 <= entry["evaluation_minutes"] < minutes - entry["train_minutes"] + 1e-9
    assert [point["epoch"] for point in entry["epoch_curve"]] == [1, 2, 3] and entry["steps"] == 3  # not 4 epochs
    bleu = [point["bleu"] for point in entry["epoch_curve"]]
    best = entry["epoch_curve"][bleu.index(max(bleu))]
    assert entry["best_checkpoint"] == {"step": best["step"], "epoch": best["epoch"]} == {"step": 1, "epoch": 1}
    model = load_file(run_dir / "model.safetensors")
    for step in (1, 2, 3):
        checkpoint = load_file(run_dir / f"checkpoint-{step}" / "model.safetensors")
        assert all(torch.equal(model[name], checkpoint[name]) for name in model) == (step == 1), step
    averaged = entry["averaged_checkpoints"]
    assert averaged["checkpoints"] == ["checkpoint-1", "checkpoint-2", "checkpoint-3"]
    for split in ("validation", "test"):
        assert averaged[split]["hypotheses"] == bench.translations(run_dir / bench.AVERAGED_DIR, split)
        assert averaged[split]["bleu"] == json.loads((run_dir / bench.AVERAGED_DIR / "bleu_results.json").read_text(
        ))[split]["bleu"]
    assert entry["training"]["max_epochs"] == 4 and entry["training"]["early_stopping_patience"] == 2

    # stopped while the best model and the average were scored: evaluated again, not trained on (resuming the last
    # checkpoint would train a 4th epoch)
    for path in (run_dir / "bench_results.json", run_dir / "bleu_results.json",
                 run_dir / "generated_predictions_test.txt", run_dir / bench.AVERAGED_DIR / "bleu_results.json"):
        path.unlink()
    shutil.rmtree(ledger_dir)
    evaluated, minutes = timed_run()
    # this session only evaluated: all its time is evaluation, the training time the first session's
    assert evaluated["train_minutes"] == entry["train_minutes"] and 0 < evaluated["evaluation_minutes"] <= minutes
    assert {key: evaluated[key] for key in ("steps", "epoch_curve", "best_checkpoint", "validation", "test",
                                            "averaged_checkpoints")} == {
        key: entry[key] for key in ("steps", "epoch_curve", "best_checkpoint", "validation", "test",
                                    "averaged_checkpoints")}
    assert not (run_dir / "checkpoint-4").exists()

    # stopped while training epoch 3: only the checkpoints of epochs 1-2 are left
    for path in run_dir.iterdir():
        if path.name not in ("checkpoint-1", "checkpoint-2"):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    shutil.rmtree(ledger_dir)
    resumed, minutes = timed_run()
    # the whole run's training time (epochs 1-2 before the stop, 3 after), this session's evaluation time
    assert resumed["train_minutes"] > minutes - resumed["evaluation_minutes"] > 0 < resumed["evaluation_minutes"]
    assert resumed["epoch_curve"] == entry["epoch_curve"] and resumed["best_checkpoint"] == entry["best_checkpoint"]


def test_a_family_page_gives_its_arms_and_verdicts_from_the_ledger(tmp_path):
    """docs/<family>.md's study findings (`family_findings`): the family's conclusions and one row per arm of that
    family only, converged arms by their budget, an arm whose baseline has not run said so; a family without runs
    says that. The committed pages are checked against the committed ledger by test_study_report."""
    converged_ledger(tmp_path)
    write(tmp_path, fake_entry("layerwise_coordination_14", 1, 40.0, REFERENCES, baseline="plain_transformer_prenorm"))

    def findings(family, extra=()):
        return ledger.family_findings(tmp_path, BOTH, bench.paired_bootstrap, {"gtrans": "a claim."}, family, extra)

    gtrans = findings("gtrans", ["", "extra line"]).splitlines()
    verdict = next(line for line in gtrans if line.startswith("**Verdict.** *from scratch*: `gtrans` against "))
    assert verdict.endswith("The paper: a claim.") and "*from scratch, trained to convergence*:" in verdict
    rows = [line for line in gtrans if line.startswith("| `")]
    assert rows == [
        "| `gtrans` | 2,000 | 2 | 41.00 ± 0.00 | 40.00 ± 0.00 | `plain_transformer` | +29.00 ± 0.00 | wins | wins |",
        "| `gtrans_converged` | to convergence (400) | 2 | 36.00 ± 0.00 | 35.00 ± 0.00 | `plain_transformer_converged` "
        "| +0.00 ± 0.00 | ties | ties |",
    ]
    assert gtrans[-1] == "extra line"
    # (the fake entries' family is their arm's first word)
    plain = [line for line in findings("plain").splitlines() if line.startswith("| `")]
    assert [row.split(" | ")[0] for row in plain] == ["| `plain_transformer`", "| `plain_transformer_converged`"]
    assert plain[1].endswith("| to convergence (500) | 2 | 36.00 ± 0.00 | 35.00 ± 0.00 | – | – | – | – |")
    assert not any(line.startswith("**Verdict.**") for line in findings("plain").splitlines())
    layerwise = findings("layerwise")
    assert ("| `layerwise_coordination_14` | 2,000 | 1 | 41.00 | 40.00 | `plain_transformer_prenorm` | – "
            "| baseline not run yet | baseline not run yet |") in layerwise
    assert findings("rtal").rstrip().endswith("No run of this family has finished yet.")
