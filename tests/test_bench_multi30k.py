"""benchmarks/bench_multi30k.py without training: every arm is a valid config, baselines are added, the paired
bootstrap is sacreBLEU's, and an output dir refuses other settings."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from transformers import CONFIG_MAPPING

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_multi30k.py"
spec = importlib.util.spec_from_file_location("bench_multi30k", BENCH)
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench  # dataclasses look their module up there
spec.loader.exec_module(bench)


@pytest.mark.parametrize("arm_name", list(bench.MODELS))
def test_every_arm_builds_a_valid_config_and_has_a_known_baseline(arm_name):
    arm = bench.MODELS[arm_name]
    config = CONFIG_MAPPING[arm.model_type].from_preset("multi30k", **arm.config)
    for key, value in arm.config.items():
        if value is not None:  # None = derived by the family (e.g. Re-Transformer's layer count from its layout)
            assert getattr(config, key) == value, key
    assert arm.baseline is None or bench.MODELS[arm.baseline].baseline is None
    if arm.baseline is not None:
        baseline = bench.MODELS[arm.baseline]
        assert baseline.training == arm.training  # same training options
        if arm.model_type == "gtrans":  # same shape
            shape = ("encoder_layers", "decoder_layers")
            assert {k: arm.config.get(k) for k in shape} == {k: baseline.config.get(k) for k in shape}

def test_baselines_are_added_before_their_arms():
    assert bench.with_baselines(["gtrans_ls0", "gtrans", "plain_transformer"]) == [
        "plain_transformer_ls0", "gtrans_ls0", "plain_transformer", "gtrans",
    ]


def test_paired_bootstrap_is_sacrebleus():
    references = [f"the cat number {i} sat on the mat" for i in range(40)]
    # two systems, each wrong on a different pair of sentences: the same BLEU, no significant difference
    one = [("a dog" if i in (3, 4) else ref) for i, ref in enumerate(references)]
    other = [("a dog" if i in (30, 31) else ref) for i, ref in enumerate(references)]
    tied = bench.paired_bootstrap(one, other, references)
    assert tied["bleu"] == pytest.approx(tied["baseline_bleu"]) and tied["p_value"] > 0.2
    worse = [f"a dog {i}" for i in range(40)]
    better = bench.paired_bootstrap(worse, references, references)
    assert better["bleu"] == pytest.approx(100.0) and better["p_value"] < 0.01 and "bs:1000" in better["signature"]
    with pytest.raises(ValueError, match="aligned"):
        bench.paired_bootstrap(worse[:-1], references, references)


def test_output_dir_refuses_other_settings(tmp_path):
    args = bench.parse_args(["--output_dir", str(tmp_path), "--max_steps_per_model", "30"])
    assert args.minutes_per_model is None  # steps-matched runs have no time budget unless asked
    bench.check_settings(args)
    assert json.loads((tmp_path / "settings.json").read_text())["max_steps_per_model"] == "30"
    bench.check_settings(args)  # the same settings continue
    with pytest.raises(SystemExit, match="max_steps_per_model was 30 and is now 40"):
        bench.check_settings(bench.parse_args(["--output_dir", str(tmp_path), "--max_steps_per_model", "40"]))


# --- the results ledger and the study queue ----------------------------------------------------------------------

ledger = bench.ledger
STUDY = Path(__file__).resolve().parents[1] / "benchmarks" / "study.py"
study_spec = importlib.util.spec_from_file_location("study", STUDY)
study = importlib.util.module_from_spec(study_spec)
sys.modules[study_spec.name] = study
study_spec.loader.exec_module(study)
README = Path(__file__).resolve().parents[1] / "README.md"
MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def fake_entry(arm, seed, bleu, hypotheses, baseline="plain_transformer", **extra):
    """A ledger entry with the fields the report reads."""
    return {
        "arm": arm, "family": arm.split("_")[0], "seed": seed, "baseline": baseline, "steps": 2000,
        "train_minutes": 30.0, "evaluation_minutes": 2.0, "commit": "abcdef0123", "dirty": False,
        "device": {"cpu": "Some CPU", "gpu": None, "torch_threads": 1},
        "tokenizer_sha256": "t", "test_references_sha256": ledger.sha256_lines(REFERENCES),
        "validation": {"bleu": bleu + 1.0, "signature": "sig"},
        "test": {"bleu": bleu, "signature": "sig", "hypotheses": hypotheses},
        "loss_curve": [[50, 9.0], [100, 7.5]], "gtrans_decoder_groups": None, **extra,
    }


REFERENCES = [f"the cat number {i} sat on the mat today" for i in range(60)]
WRONG = [f"a dog {i}" for i in range(60)]


def test_ledger_entries_are_written_once_and_must_sit_where_they_say(tmp_path):
    path = ledger.ledger_path(tmp_path, "gtrans", 1)
    ledger.write_entry(path, fake_entry("gtrans", 1, 30.0, REFERENCES))
    with pytest.raises(FileExistsError, match="never overwritten"):
        ledger.write_entry(path, fake_entry("gtrans", 1, 31.0, REFERENCES))
    assert ledger.read_ledger(tmp_path)["gtrans"][1]["test"]["bleu"] == 30.0
    misplaced = ledger.ledger_path(tmp_path, "gtrans", 2)
    misplaced.write_text(path.read_text())  # says seed 1
    with pytest.raises(ValueError, match="misplaced"):
        ledger.read_ledger(tmp_path)


def test_report_deltas_p_values_and_verdicts_from_the_ledger(tmp_path):
    # seeds 1-2: the arm translates perfectly, the baseline not at all -> significantly better on both seeds
    for seed in (1, 2):
        ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer", seed),
                           fake_entry("plain_transformer", seed, 10.0 + seed, WRONG, baseline=None))
        ledger.write_entry(ledger.ledger_path(tmp_path, "gtrans", seed), fake_entry("gtrans", seed, 40.0, REFERENCES))
    # an arm identical to its baseline ties (sacreBLEU gives p = 0.001 for a zero difference, which by its
    # convention is not attributed to chance; there is no sign), and one whose baseline has no run yet says so
    ledger.write_entry(ledger.ledger_path(tmp_path, "rtal", 1), fake_entry("rtal", 1, 11.0, WRONG))
    ledger.write_entry(ledger.ledger_path(tmp_path, "deep", 1), fake_entry("deep", 1, 5.0, WRONG, baseline="absent"))
    text = ledger.report(tmp_path, REFERENCES, bench.paired_bootstrap, {"gtrans": "claimed +1."}, ["`x` seed 1"])
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ") for line in text.splitlines() if line.startswith("| `")}
    assert list(rows) == ["plain_transformer", "deep", "gtrans", "rtal"]  # baselines first
    gtrans = rows["gtrans"]
    assert gtrans[3:7] == ["2", "41.00 ± 0.00", "40.00 ± 0.00", "`plain_transformer`"]
    # test Δ per seed: 40 - 11 = 29 and 40 - 12 = 28
    assert gtrans[7] == "+28.50 ± 0.71" and gtrans[8] == "+28.50 ± 0.71"
    assert gtrans[9] == "0.001 / 0.001" and gtrans[10].strip(" |") == "wins"
    assert rows["rtal"][7] == "+0.00" and rows["rtal"][9] == "0.001" and rows["rtal"][10].strip(" |") == "ties"
    assert rows["deep"][10].strip(" |") == "baseline not run yet"
    assert "- **gtrans**: `gtrans` wins against `plain_transformer`" in text and "The paper: claimed +1." in text
    assert text.rstrip().endswith("Next in the queue (`python benchmarks/study.py --list`): `x` seed 1.")
    with pytest.raises(ValueError, match="other test references"):
        ledger.report(tmp_path, REFERENCES[:-1], bench.paired_bootstrap, {}, [])


def test_verdict_needs_significance_on_a_majority_of_seeds():
    comparison = ledger.Comparison(seeds=[1, 2, 3], test_deltas=[0.5, 0.4, -0.1], val_deltas=[0, 0, 0],
                                   p_values=[0.01, 0.2, 0.6])
    assert comparison.better == 1 and comparison.verdict() == "ties"
    assert ledger.Comparison([1, 2, 3], [-0.5, -0.4, 0.1], [0] * 3, [0.01, 0.03, 0.6]).verdict() == "loses"


def test_loss_curves_of_the_deep_runs_are_reported(tmp_path):
    entry = fake_entry("plain_transformer_24x18", 1, 1.0, WRONG, baseline=None, show_loss_curve=True)
    ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer_24x18", 1), entry)
    text = ledger.report(tmp_path, REFERENCES, bench.paired_bootstrap, {}, [])
    assert "| `plain_transformer_24x18` | 1 | 9.00 | 7.50 | – |" in text


def test_every_study_run_is_a_known_arm_with_its_baseline_queued_alike():
    queue = study.study_queue()
    assert len({(run.arm, run.seed) for run in queue}) == len(queue)  # one ledger file per arm and seed
    budget = {(run.arm, run.seed): (run.max_steps, run.warmup_steps) for run in queue}
    for run in queue:
        assert run.arm in bench.MODELS, run.arm
        baseline = bench.MODELS[run.arm].baseline
        if baseline is not None:  # steps-matched with the baseline run of the same seed, queued before it
            assert budget[(baseline, run.seed)] == (run.max_steps, run.warmup_steps), run
            assert queue.index(next(r for r in queue if (r.arm, r.seed) == (baseline, run.seed))) < queue.index(run)
    assert [(r.arm, r.seed) for r in queue[:6]] == [
        (arm, seed) for seed in (1, 2, 3) for arm in ("plain_transformer", "gtrans")]  # priority 1 first


@pytest.mark.skipif(not MULTI30K.is_dir(), reason="needs ../shared/data/multi30k")
def test_readme_results_section_is_the_report_of_the_committed_ledger():
    expected = bench.report_text(ledger.DEFAULT_LEDGER, MULTI30K)
    assert ledger.readme_section(README.read_text(encoding="utf-8")) == expected, (
        "README's Multi30k section differs from the ledger: run "
        "`python benchmarks/bench_multi30k.py --report --update_readme`"
    )
