"""Priority 5 of the study: run_multilingual.py's English-centric stand-in, bench_multilingual.py's run and ledger
entry (run_multilingual replaced by a stand-in), its report from fake ledger entries (expected values computed by
hand), the study queue's many-to-many runs, and an interrupted run_multilingual.py run resumed (4 steps of a tiny
model)."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_bench_multi30k import package_snapshot

import study.queue
from hf_layerfusion.cli import run_multilingual  # the benchmark trains through it
from study import bench_multilingual as bench

ledger = bench.ledger
LANGUAGES = ("en", "de", "fr", "cs")
SIX_DIRECTIONS = ["en-de", "de-en", "en-fr", "fr-en", "en-cs", "cs-en"]


def tiny_corpus(directory: Path, train_size: int = 8, test_size: int = 4) -> Path:
    """Multi30k's file layout for its four languages: line i is sentence i in every language."""
    for stem, count in (("train", train_size), ("val", 2), ("test_2016_flickr", test_size)):
        for language in LANGUAGES:
            (directory / f"{stem}.{language}").write_text(
                "".join(f"{language} {stem} sentence number {i}\n" for i in range(count)), encoding="utf-8")
    return directory


# --- run_multilingual.py --english_centric ------------------------------------------------------------------------


def test_english_centric_standin_keeps_the_three_pairs_with_english_and_halves_their_sizes(tmp_path):
    corpus = tiny_corpus(tmp_path, train_size=20)
    data_args = run_multilingual.DataArguments(dataset="multi30k", multi30k_dir=str(corpus), standin_train_size=8,
                                               english_centric=True)
    pairs, thresholds = run_multilingual.multi30k_standin(data_args)
    assert {pair: len(splits["train"]) for pair, splits in pairs.items()} == {"en-de": 8, "en-fr": 4, "en-cs": 2}
    assert run_multilingual.both_directions(list(pairs)) == SIX_DIRECTIONS
    assert thresholds == (4, 1)
    every_pair, _ = run_multilingual.multi30k_standin(
        run_multilingual.DataArguments(dataset="multi30k", multi30k_dir=str(corpus), standin_train_size=8))
    assert len(every_pair) == 6 and every_pair["fr-cs"]["train"].num_rows == 1  # unchanged without the option


@pytest.mark.parametrize("extra, message", [
    (["--dataset=multi30k", "--languages=de,fr"], r"--english_centric .* --languages 'de,fr' has no 'en'"),
    (["--dataset=opus100", "--languages=de"], r"--dataset 'opus100' is English-centric already"),
])
def test_english_centric_refuses_what_it_cannot_select(tmp_path, extra, message):
    argv = [*extra, f"--multi30k_dir={tiny_corpus(tmp_path)}", "--english_centric=True", "--preset=none",
            f"--xlmr={tmp_path}", f"--output_dir={tmp_path / 'out'}", "--use_cpu=True", "--report_to=none"]
    with pytest.raises(ValueError, match=message):
        run_multilingual.main(argv)


# --- bench_multilingual.py: one run, its ledger entry -------------------------------------------------------------


def test_a_run_trains_through_run_multilingual_once_and_writes_its_ledger_entry(tmp_path, monkeypatch):
    corpus = tiny_corpus(tmp_path)
    calls, clock = [], [1000.0]
    monkeypatch.setattr(bench, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    # a resumed run: 5,000 s trained in earlier sessions, up to its newest complete checkpoint
    checkpoint = tmp_path / "runs" / "gtrans_m2m" / "seed_2" / "model" / "checkpoint-1500"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps(
        {"stateful_callbacks": {"TimeBudgetCallback": {"attributes": {"elapsed_seconds": 5000.0}}}}))

    def fake_run_multilingual(command):
        """What a finished run_multilingual.py run leaves behind and returns."""
        calls.append(command)
        options = dict(item[2:].split("=", 1) for item in command if "=" in item)
        model_dir = Path(options["output_dir"])
        model_dir.mkdir(parents=True, exist_ok=True)
        # this session: 400 s of training (its train_runtime; the whole run's in the TimeBudgetCallback state), then
        # 20 s of translating the test sets
        clock[0] += 420.0
        before = 5000.0 if (model_dir / "checkpoint-1500").is_dir() else 0.0
        (model_dir / "trainer_state.json").write_text(json.dumps(
            {"global_step": 2000, "log_history": [{"step": 50, "loss": 9.5}, {"step": 2000, "loss": 3.0}],
             "stateful_callbacks": {"TimeBudgetCallback": {"attributes": {"elapsed_seconds": before + 400.0}}}}))
        (model_dir / "train_results.json").write_text(json.dumps({"train_runtime": 400.0}))
        (model_dir / "config.json").write_text(json.dumps({"model_type": options["model_type"]}))
        (model_dir / "tokenizer.json").write_text("{}")
        hypotheses = {direction: [f"{direction.split('-')[1]} hypothesis"] * 4 for direction in SIX_DIRECTIONS}
        return {"scores": {direction: 1.5 for direction in SIX_DIRECTIONS},
                "train_sizes": dict.fromkeys(SIX_DIRECTIONS, 8), "signature": "sig", "hypotheses": hypotheses}

    monkeypatch.setattr(bench, "run_multilingual", fake_run_multilingual)
    argv = ["--arm", "gtrans_m2m", "--seed", "2", "--output_dir", str(tmp_path / "runs"), "--tiny_vocab_size", "60",
            "--ledger_dir", str(tmp_path / "ledger"), "--tokenizer_dir", str(tmp_path / "ledger" / "tokenizer"),
            "--data_dir", str(corpus)]
    bench.main(argv)
    (command,) = calls
    run_dir = tmp_path / "runs" / "gtrans_m2m" / "seed_2"
    xlmr = tmp_path / "runs" / "xlmr" / "seed_2"  # built here, once per seed, for both arms
    for option in ("--dataset=multi30k", "--english_centric=True", "--standin_train_size=29000", "--temperature=5.0",
                   f"--xlmr={xlmr}", "--preset=none", "--model_type=gtrans", f"--output_dir={run_dir / 'model'}",
                   "--max_steps=2000", "--warmup_steps=1000", "--learning_rate=0.001", "--lr_scheduler_type=inverse_sqrt",
                   "--label_smoothing_factor=0.1", "--per_device_train_batch_size=64", "--num_beams=4", "--seed=2",
                   "--config_overrides=decoder_layers=6,decoder_ffn_dim=1024,decoder_attention_heads=4,"
                   "encoder_group_size=3,decoder_group_size=2",
                   # checkpoints every 500 steps; an interrupted run continues from its newest
                   "--save_steps=500", "--resume_from_checkpoint=last"):
        assert option in command, option
    assert not any(item.startswith("--max_eval_samples") for item in command)  # every test sentence

    entry = m2m_ledger(tmp_path / "ledger")["gtrans_m2m"][2]
    assert (entry["family"], entry["baseline"], entry["steps"]) == ("gtrans", "plain_transformer_m2m", 2000)
    assert entry["training"]["temperature"] == 5.0 and entry["training"]["max_steps"] == 2000
    assert entry["loss_curve"] == [[50, 9.5], [2000, 3.0]] and entry["device"]["torch_threads"] >= 1
    assert entry["train_minutes"] == 90.0 and entry["evaluation_minutes"] == pytest.approx(20.0 / 60)
    assert list(entry["directions"]) == SIX_DIRECTIONS and entry["train_sizes"]["en-cs"] == 8
    en_de = entry["directions"]["en-de"]
    assert en_de["bleu"] == 1.5 and en_de["hypotheses"] == ["de hypothesis"] * 4 and en_de["sentences"] == 4
    assert en_de["references_sha256"] == ledger.sha256_lines([f"de test_2016_flickr sentence number {i}"
                                                              for i in range(4)])
    assert (run_dir / "bench_results.json").is_file()  # study/queue.py's marker of a finished run
    config = json.loads((xlmr / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["intermediate_size"]) == (256, 6, 1024)
    assert entry["starting_model"] == {"dir": str(xlmr), "tokenizer_sha256": ledger.file_sha256(xlmr / "tokenizer.json"),
                                       "weights_sha256": ledger.file_sha256(xlmr / "model.safetensors")}

    bench.main(argv)  # the ledger entry exists: nothing is run again, nothing overwritten
    assert len(calls) == 1
    bench.main(["--arm", "plain_transformer_m2m", *argv[2:]])  # the other arm of the seed starts from the same model
    assert f"--xlmr={xlmr}" in calls[-1] and "--model_type=plain_transformer" in calls[-1]
    plain = m2m_ledger(tmp_path / "ledger")["plain_transformer_m2m"][2]
    assert plain["starting_model"] == entry["starting_model"] and plain["baseline"] is None
    assert (plain["train_minutes"], plain["evaluation_minutes"]) == pytest.approx((400.0 / 60, 20.0 / 60))  # fresh

    # another machine (a fresh output dir) builds the same starting model from the committed tokenizer and the seed
    bench.main(["--arm", "plain_transformer_m2m", "--seed", "2", "--output_dir", str(tmp_path / "elsewhere"),
                "--tiny_vocab_size", "60", "--ledger_dir", str(tmp_path / "ledger_elsewhere"),
                "--tokenizer_dir", str(tmp_path / "ledger" / "tokenizer"), "--data_dir", str(corpus)])
    rebuilt = m2m_ledger(tmp_path / "ledger_elsewhere")["plain_transformer_m2m"][2]["starting_model"]
    assert rebuilt["weights_sha256"] == entry["starting_model"]["weights_sha256"]
    assert rebuilt["tokenizer_sha256"] == entry["starting_model"]["tokenizer_sha256"]


# --- the report -----------------------------------------------------------------------------------------------------

REFERENCES = {direction: [f"the {direction} cat number {i} sat on the mat today" for i in range(60)]
              for direction in SIX_DIRECTIONS}
WRONG = [f"a dog {i}" for i in range(60)]
# test BLEU per direction, seeds 1 and 2
PLAIN_BLEU = {"en-de": (30, 32), "de-en": (34, 34), "en-fr": (20, 22), "fr-en": (25, 25), "en-cs": (10, 12),
              "cs-en": (15, 15)}
GTRANS_BLEU = {"en-de": (31, 33), "de-en": (33, 33), "en-fr": (22, 22), "fr-en": (25, 25), "en-cs": (12, 14),
               "cs-en": (14, 16)}


def m2m_ledger(directory):
    """The many-to-many ledger, read with the keys its report needs."""
    return ledger.read_ledger(directory, ledger.MANY_TO_MANY_REQUIRED_KEYS)


def m2m_entry(arm, seed, bleu, hypotheses, starting_tokenizer="t"):
    return {
        "arm": arm, "family": arm.rsplit("_", 1)[0], "seed": seed, "signature": "sig",
        "starting_model": {"dir": f"xlmr/seed_{seed}", "tokenizer_sha256": starting_tokenizer, "weights_sha256": "w"},
        "train_sizes": {"en-de": 29000, "de-en": 29000, "en-fr": 14500, "fr-en": 14500, "en-cs": 7250, "cs-en": 7250},
        "directions": {direction: {"bleu": float(bleu[direction][seed - 1]), "sentences": 60,
                                   "references_sha256": ledger.sha256_lines(REFERENCES[direction]),
                                   "hypotheses": hypotheses[direction]} for direction in SIX_DIRECTIONS},
    }


def test_report_gives_bleu_per_direction_deltas_p_values_and_the_win_ratio(tmp_path):
    assert bench.report_lines(tmp_path, REFERENCES) == ["No many-to-many run (priority 5) has finished yet."]
    # en-de: GTrans translates perfectly and plain not at all (p 0.001); de-en the reverse; elsewhere both are
    # perfect (identical translations: p 1, nothing between them)
    plain = {**REFERENCES, "en-de": WRONG}
    gtrans = {**REFERENCES, "de-en": WRONG}
    for seed in (1, 2):
        ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer_m2m", seed),
                           m2m_entry("plain_transformer_m2m", seed, PLAIN_BLEU, plain))
        ledger.write_entry(ledger.ledger_path(tmp_path, "gtrans_m2m", seed),
                           m2m_entry("gtrans_m2m", seed, GTRANS_BLEU, gtrans))
    lines = bench.report_lines(tmp_path, REFERENCES)
    rows = {line.split(" | ")[0].strip("| "): [cell.strip(" |") for cell in line.split(" | ")]
            for line in lines if line.startswith("| ") and not line.startswith("| direction")}
    # direction, train pairs, plain mean, GTrans mean, Δ, p per seed (means and Δ by hand from the tables above)
    assert rows["en-de"] == ["en-de", "29,000", "31.00", "32.00", "+1.00", "0.001 / 0.001"]
    assert rows["de-en"] == ["de-en", "29,000", "34.00", "33.00", "-1.00", "0.001 / 0.001"]
    assert rows["en-fr"][2:5] == ["21.00", "22.00", "+1.00"]
    assert rows["fr-en"][2:5] == ["25.00", "25.00", "+0.00"]
    assert rows["en-cs"] == ["en-cs", "7,250", "11.00", "13.00", "+2.00", "1.000 / 1.000"]
    assert rows["cs-en"][2:5] == ["15.00", "15.00", "+0.00"]
    # averages over the six directions: plain 137 / 6, GTrans 140 / 6, Δ 3 / 6
    assert rows["average"][:5] == ["average", "", "22.83", "23.33", "+0.50"]
    # wins (strictly higher mean): en-de, en-fr, en-cs; ties (fr-en, cs-en) are not wins: 3 of 6 = 50%
    assert any(line.endswith(": 3 of 6 = 50.0%.") and line.startswith("Win ratio") for line in lines)
    with pytest.raises(ValueError, match="scored en-de on other test references"):
        bench.report_lines(tmp_path, {**REFERENCES, "en-de": REFERENCES["en-de"][:-1] + ["another sentence"]})


def test_report_refuses_arms_of_a_seed_that_started_from_different_models(tmp_path):
    ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer_m2m", 1),
                       m2m_entry("plain_transformer_m2m", 1, PLAIN_BLEU, REFERENCES))
    ledger.write_entry(ledger.ledger_path(tmp_path, "gtrans_m2m", 1),
                       m2m_entry("gtrans_m2m", 1, GTRANS_BLEU, REFERENCES, starting_tokenizer="other"))
    with pytest.raises(ValueError, match="gtrans_m2m seed 1 started from different random XLM-R models"):
        bench.report_lines(tmp_path, REFERENCES)


def test_report_without_both_arms_shows_bleu_only(tmp_path):
    ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer_m2m", 1),
                       m2m_entry("plain_transformer_m2m", 1, PLAIN_BLEU, REFERENCES))
    lines = bench.report_lines(tmp_path, REFERENCES)
    assert "| en-de | 29,000 | 30.00 |" in lines and not any(line.startswith("Win ratio") for line in lines)


# --- the study queue ----------------------------------------------------------------------------------------------


def test_priority_5_runs_come_after_issue_38s_first_runs_plain_before_gtrans():
    """Issue 38 item 5 queues the many-to-many pair after the 24 + 18 seeds, the fine-tuning arms' seed 1 and the
    recipe's seeds 4-5 (tests/test_bench_multi30k.py checks the whole order), in one block."""
    queue = study.queue.study_queue()
    many_to_many = [run for run in queue if isinstance(run, study.queue.ManyToManyRun)]
    first = queue.index(many_to_many[0])
    assert queue[first:first + 6] == many_to_many == [
        study.queue.ManyToManyRun(arm, seed) for seed in (1, 2, 3) for arm in ("plain_transformer_m2m", "gtrans_m2m")]
    assert queue[first - 1] == study.queue.StudyRun("deep_representations_paper", 5)
    assert all((run.max_steps, run.warmup_steps) == (2000, 1000) for run in many_to_many)
    assert set(bench.ARMS) == {run.arm for run in many_to_many}
    assert ledger.m2m_ledger_dir(study.queue.LEDGER_DIR) == bench.DEFAULT_LEDGER


def test_priority_5_commands_are_bench_multilingual_runs(tmp_path):
    (tmp_path / "multi30k").mkdir()  # the queue refuses a ledger dir that does not exist
    args = study.queue.parse_args(["--ledger_dir", str(tmp_path / "multi30k"), "--data_dir", str(tmp_path / "data")])
    for run in [run for run in study.queue.study_queue() if isinstance(run, study.queue.ManyToManyRun)]:
        command = run.command(package_snapshot(tmp_path), args)
        assert command[:3] == [sys.executable, "-m", "study.bench_multilingual"]
        parsed = bench.parse_args(command[3:])
        assert (parsed.arm, parsed.seed, parsed.max_steps, parsed.warmup_steps) == (run.arm, run.seed, 2000, 1000)
        assert parsed.output_dir / run.arm / f"seed_{run.seed}" == run.run_dir()
        assert parsed.ledger_dir == tmp_path / "multi30k_m2m" and parsed.data_dir == tmp_path / "data"
        assert ledger.ledger_path(parsed.ledger_dir, run.arm, run.seed) == run.result_file(args.ledger_dir)


def test_finished_priority_5_runs_leave_the_queue_stale_ones_start_over_interrupted_ones_resume(tmp_path, monkeypatch):
    ledger_dir = tmp_path / "multi30k"
    first = study.queue.ManyToManyRun("plain_transformer_m2m", 1)
    assert first in study.queue.pending_runs(ledger_dir, tmp_path / "probes")
    ledger.write_entry(first.result_file(ledger_dir), m2m_entry("plain_transformer_m2m", 1, PLAIN_BLEU, REFERENCES))
    pending = study.queue.pending_runs(ledger_dir, tmp_path / "probes")
    assert first not in pending and study.queue.ManyToManyRun("gtrans_m2m", 1) in pending

    monkeypatch.setattr(study.queue, "WORK_DIR", tmp_path / "work")
    run_dir = first.run_dir()
    (run_dir / "model").mkdir(parents=True)
    (run_dir / "STUDY_COMMIT").write_text("old\n")
    study.queue.discard_stale_run(first, "new")  # unfinished, another commit: discarded
    assert not (run_dir / "model").exists() and (run_dir / "STUDY_COMMIT").read_text() == "new\n"
    older = study.queue.git("rev-parse", "HEAD")
    (run_dir / "STUDY_COMMIT").write_text(older + "\n")
    assert study.queue.resumable_commit(first) is None  # no checkpoint
    (run_dir / "model" / "checkpoint-500").mkdir(parents=True)  # run_multilingual.py's output dir holds them
    assert study.queue.resumable_commit(first) == older
    (run_dir / "bench_results.json").write_text("{}")
    study.queue.discard_stale_run(first, "newer")  # finished: kept
    assert (run_dir / "bench_results.json").is_file()


def test_a_tokenizer_is_never_written_over_other_files(tmp_path):
    occupied = tmp_path / "mine"
    occupied.mkdir()
    (occupied / "notes.txt").write_text("keep me")
    with pytest.raises(SystemExit):
        bench.parse_args(["--arm", "gtrans_m2m", "--seed", "1", "--tokenizer_dir", str(occupied)])
    assert (occupied / "notes.txt").read_text() == "keep me"


def test_an_interrupted_run_multilingual_run_continues_from_its_newest_checkpoint(tmp_path):
    """run_multilingual.py as bench_multilingual.py calls it: a run stopped after 2 of its steps (its checkpoint
    saved) continues from that checkpoint with `--resume_from_checkpoint last` and counts the training time of both
    sessions; refused without it (the checkpoints would mix with a new run's)."""
    corpus = tiny_corpus(tmp_path, train_size=16)
    xlmr = tmp_path / "xlmr"
    output_dir = tmp_path / "model"

    def arguments(max_steps: int, *extra: str) -> list[str]:
        return ["--dataset=multi30k", f"--multi30k_dir={corpus}", "--english_centric=True", "--standin_train_size=8",
                "--preset=none", "--model_type=plain_transformer", f"--output_dir={output_dir}", "--do_train",
                f"--max_steps={max_steps}", "--save_steps=2", "--save_total_limit=1", "--warmup_steps=1",
                "--per_device_train_batch_size=4", "--max_eval_samples=2", "--max_new_tokens=3", "--num_beams=1",
                "--tiny_vocab_size=80", "--use_cpu=True", "--report_to=none", "--disable_tqdm=True", *extra]

    run_multilingual.main(arguments(2, f"--tiny_random_xlmr={xlmr}"))
    assert json.loads((output_dir / "trainer_state.json").read_text())["global_step"] == 2
    assert (output_dir / "checkpoint-2").is_dir()
    with pytest.raises(ValueError, match="already holds checkpoints"):
        run_multilingual.main(arguments(4, f"--xlmr={xlmr}"))
    # marks the checkpoint: a run that continues from it starts its clock at 1000 s
    checkpoint_state = output_dir / "checkpoint-2" / "trainer_state.json"
    marked = json.loads(checkpoint_state.read_text())
    assert marked["stateful_callbacks"]["TimeBudgetCallback"]["attributes"]["elapsed_seconds"] > 0
    marked["stateful_callbacks"]["TimeBudgetCallback"]["attributes"]["elapsed_seconds"] = 1000.0
    checkpoint_state.write_text(json.dumps(marked))
    run_multilingual.main(arguments(4, f"--xlmr={xlmr}", "--resume_from_checkpoint=last",
                                    "--overwrite_output_dir=True"))
    state = json.loads((output_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 4 and (output_dir / "checkpoint-4").is_dir()
    assert 1000.0 < state["stateful_callbacks"]["TimeBudgetCallback"]["attributes"]["elapsed_seconds"] < 1000.0 + 600
