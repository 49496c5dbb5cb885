"""study/bench_multi30k.py without training: every arm is a valid config, baselines are added, the paired
bootstrap is sacreBLEU's, and an output dir refuses other settings."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from helpers import REPO_ROOT
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest
from transformers import CONFIG_MAPPING

import hf_layerfusion
import study.queue
from hf_layerfusion.cli import run_translation  # the benchmark trains through it
from study import bench_multi30k as bench


@pytest.mark.parametrize("arm_name", list(bench.MODELS))
def test_every_arm_builds_a_valid_config_and_has_a_known_baseline(arm_name):
    arm = bench.MODELS[arm_name]
    config = arm_config(arm_name)
    assert config.model_type == arm.model_type
    for key, value in arm.config.items():
        if value is not None:  # None = derived by the family (e.g. Re-Transformer's layer count from its layout)
            assert getattr(config, key) == value, key
    assert arm.baseline is None or bench.MODELS[arm.baseline].baseline is None
    if arm.baseline is not None:
        baseline = bench.MODELS[arm.baseline]
        assert baseline.training == arm.training  # same training options
        assert baseline.init_from == arm.init_from  # fine-tuned from the same run, or both from scratch
        baseline_config = arm_config(arm.baseline)
        assert baseline_config.normalize_before == config.normalize_before  # pre-norm against pre-norm
        if arm.model_type == "gtrans":  # same shape
            shape = ("encoder_layers", "decoder_layers")
            assert {k: arm.config.get(k) for k in shape} == {k: baseline.config.get(k) for k in shape}


def arm_config(arm_name: str):
    """The config run_translation builds for an arm, from the command-line keys the benchmark passes it (preset
    `multi30k`, `--config_overrides`) and the special ids of the benchmark's tokenizer (`<s>` 0, `<pad>` 1,
    `</s>` 2); for a fine-tuning arm, the starting arm's config read as the arm's family with the arm's overrides."""
    arm = bench.MODELS[arm_name]
    if arm.init_from is not None:
        saved = arm_config(arm.init_from).to_diff_dict()
        return CONFIG_MAPPING[arm.model_type].from_dict({**saved, **arm.config})
    overrides = ",".join(f"{key}={bench.format_value(value)}" for key, value in arm.config.items()) or None
    model_args = run_translation.ModelArguments(
        model_type=arm.model_type, preset="multi30k", config_overrides=overrides
    )
    return run_translation.build_config(model_args, 8000, dict(pad_token_id=1, bos_token_id=0, eos_token_id=2))


def test_paper_setting_arms():
    rtal = arm_config("rtal_paper")
    assert (rtal.aggregation_function, rtal.tree_residual, rtal.normalize_before) == ("ewp_ffn", "children", True)
    assert rtal.encoder_aggregation and rtal.decoder_aggregation and rtal.d_model == 256
    deep = arm_config("deep_representations_paper")
    assert (deep.encoder_aggregation, deep.decoder_aggregation, deep.diversity_weight) == ("hierarchical",
                                                                                          "hierarchical", 1.0)
    assert bench.MODELS["deep_representations_paper"].init_from == "plain_transformer"
    assert bench.MODELS["plain_transformer_continued"].init_from == "plain_transformer"
    assert arm_config("plain_transformer_continued").to_diff_dict() == arm_config("plain_transformer").to_diff_dict()


def test_layerwise_coordination_14_is_the_papers_model():
    """Sec. 4.2: 14 shared layers at the small size, parameter-matched to the 6 + 6 plain baseline; the decoder
    starts from SOS (Sec. 4.3)."""
    assert bench.MODELS["layerwise_coordination_14"].baseline == "plain_transformer"
    config = arm_config("layerwise_coordination_14")
    paper = hf_layerfusion.LayerwiseCoordinationConfig.from_preset("layerwise_paper_small", vocab_size=8000)
    keys = ("d_model", "encoder_layers", "decoder_layers", "encoder_ffn_dim", "encoder_attention_heads",
            "share_layer_parameters", "mixed_attention", "language_embeddings", "position_embeddings")
    assert {key: getattr(config, key) for key in keys} == {key: getattr(paper, key) for key in keys}
    assert config.decoder_start_token_id == 0 and arm_config("plain_transformer").decoder_start_token_id == 2
    with torch.device("meta"):
        sizes = [
            sum(p.numel() for p in hf_layerfusion.FAMILIES[config.model_type][2](config).parameters())
            for config in (config, arm_config("plain_transformer"))
        ]
    assert abs(sizes[0] / sizes[1] - 1) < 1e-3


def test_embedding_init_arms():
    """fairseq / THUMT embedding initialisation for the plain model and GTrans, GTrans compared with the plain one."""
    for name in ("plain_transformer_embed_init", "gtrans_embed_init"):
        assert arm_config(name).embedding_init == "rsqrt_d_model"
    assert arm_config("plain_transformer").embedding_init == arm_config("gtrans").embedding_init == "init_std"
    assert bench.MODELS["gtrans_embed_init"].baseline == "plain_transformer_embed_init"
    assert bench.MODELS["gtrans_embed_init"].config == {**bench.MODELS["gtrans"].config, **bench.EMBED_INIT}


def test_baselines_and_starting_runs_are_added_before_their_arms():
    assert bench.with_prerequisites(["gtrans_ls0", "gtrans", "plain_transformer"]) == [
        "plain_transformer_ls0", "gtrans_ls0", "plain_transformer", "gtrans",
    ]
    assert bench.with_prerequisites(["deep_representations_paper"]) == [
        "plain_transformer", "plain_transformer_continued", "deep_representations_paper",
    ]
    # --run_only: no baselines, but the run a fine-tuning arm starts from
    assert bench.with_prerequisites(["deep_representations_paper"], baselines=False) == [
        "plain_transformer", "deep_representations_paper",
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
    # the numbers of sacreBLEU's own paired test, given the references each time (the study tokenizes each set once):
    # for two sets of references in turn, each pair against its own
    for pair_references in (references, [f"a dog {i}" for i in range(40)]):
        signatures, scores = PairedTest([("baseline", one), ("system", other)], {"BLEU": BLEU()},
                                        references=[pair_references], test_type="bs", n_samples=1000)()
        (name,) = signatures
        baseline_result, system_result = scores[name]
        tested = bench.paired_bootstrap(one, other, pair_references)
        assert tested == {"baseline_bleu": baseline_result.score, "bleu": system_result.score,
                          "p_value": system_result.p_value, "bootstrap_mean": system_result.mean,
                          "bootstrap_ci95": system_result.ci, "signature": str(signatures[name])}


def test_paired_bootstrap_finds_nothing_between_indistinguishable_systems():
    """sacreBLEU reports p = 1 / 1001 when every resampled difference is 0; two systems whose sentences score the same
    are indistinguishable: p = 1, not the smallest p there is."""
    references = [f"the cat number {i} sat on the mat" for i in range(40)]
    system = [("a dog" if i in (3, 4) else ref) for i, ref in enumerate(references)]
    same = bench.paired_bootstrap(system, list(system), references)
    assert same["bleu"] == same["baseline_bleu"] and same["p_value"] == 1.0
    # other words, wrong alike: the same statistics sentence by sentence
    alike = bench.paired_bootstrap(system, [("a cow" if i in (3, 4) else ref) for i, ref in enumerate(references)],
                                   references)
    assert alike["p_value"] == 1.0
    # the same BLEU from different sentences still gets sacreBLEU's p
    tied = bench.paired_bootstrap(system, [("a cow" if i in (30, 31) else ref) for i, ref in enumerate(references)],
                                  references)
    assert tied["bleu"] == pytest.approx(tied["baseline_bleu"]) and 0.2 < tied["p_value"] < 1.0


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
MULTI30K = Path(__file__).resolve().parents[2] / "shared" / "data" / "multi30k"


def fake_entry(arm, seed, bleu, hypotheses, baseline="plain_transformer", val_hypotheses=None, **extra):
    """A ledger entry with the fields the report reads; with `val_hypotheses`, the val translations of an entry
    written since issue 38. Each holds its own lists of translations, as read from JSON (a test that edits them
    leaves REFERENCES as it is)."""
    validation = {"bleu": bleu + 1.0, "signature": "sig"}
    if val_hypotheses is not None:
        validation.update(hypotheses=list(val_hypotheses), sentences=len(val_hypotheses))
        extra.setdefault("validation_references_sha256", ledger.sha256_lines(REFERENCES))
    return {
        "arm": arm, "family": arm.split("_")[0], "seed": seed, "baseline": baseline, "steps": 2000,
        "train_minutes": 30.0, "evaluation_minutes": 2.0, "commit": "abcdef0123", "dirty": False,
        "device": {"cpu": "Some CPU", "gpu": None, "torch_threads": 1},
        "tokenizer_sha256": "t", "test_references_sha256": ledger.sha256_lines(REFERENCES),
        "validation": validation,
        "test": {"bleu": bleu, "signature": "sig", "hypotheses": list(hypotheses), "sentences": len(hypotheses)},
        "loss_curve": [[50, 9.0], [100, 7.5]], "gtrans_decoder_groups": None, **extra,
    }


REFERENCES = [f"the cat number {i} sat on the mat today" for i in range(60)]
WRONG = [f"a dog {i}" for i in range(60)]
HALF_RIGHT = REFERENCES[:30] + WRONG[30:]  # right on the first half of the sentences, wrong on the rest
BOTH = {"test": REFERENCES, "validation": REFERENCES}  # the test and val references of the fake entries


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
    # an arm identical to its baseline ties (p 1: its translations are the baseline's), and one whose baseline has
    # no run yet says so
    ledger.write_entry(ledger.ledger_path(tmp_path, "rtal", 1), fake_entry("rtal", 1, 11.0, WRONG))
    ledger.write_entry(ledger.ledger_path(tmp_path, "deep", 1), fake_entry("deep", 1, 5.0, WRONG, baseline="absent"))
    text = ledger.report(tmp_path, BOTH, bench.paired_bootstrap, {"gtrans": "claimed +1."}, ["`x` seed 1"])
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ") for line in text.splitlines() if line.startswith("| `")}
    assert list(rows) == ["plain_transformer", "deep", "gtrans", "rtal"]  # baselines first
    gtrans = rows["gtrans"]
    assert gtrans[3:7] == ["2", "41.00 ± 0.00", "40.00 ± 0.00", "`plain_transformer`"]
    # test Δ per seed: 40 - 11 = 29 and 40 - 12 = 28; the test verdict, then val's beside it: these entries hold no
    # val translations (as before issue 38), so val is untested
    assert gtrans[7:10] == ["+28.50 ± 0.71", "0.001 / 0.001", "wins"]
    assert gtrans[10:13] == ["+28.50 ± 0.71", "– / –", "untested |"]
    assert rows["rtal"][7:10] == ["+0.00", "1.000", "ties"]
    assert rows["deep"][9] == "baseline not run yet" and rows["deep"][12] == "baseline not run yet |"
    assert ("- **gtrans**: *from scratch*: `gtrans` against `plain_transformer` wins on test (Δ +28.50 ± 0.71 BLEU "
            "over 2 seeds, p 0.001, 0.001), untested on val (Δ +28.50 ± 0.71; the ledger holds no val translations "
            "of seeds 1, 2): not a win yet") in text
    assert "The paper: claimed +1." in text
    assert text.rstrip().endswith("Next in the queue (`python -m study --list`): `x` seed 1.")
    with pytest.raises(ValueError, match="other test references"):
        ledger.report(tmp_path, {**BOTH, "test": REFERENCES[:-1]}, bench.paired_bootstrap, {}, [])


def test_verdict_needs_significance_on_a_majority_of_seeds():
    comparison = ledger.Comparison(seeds=[1, 2, 3], test_deltas=[0.5, 0.4, -0.1], val_deltas=[0, 0, 0],
                                   p_values=[0.01, 0.2, 0.6])
    assert comparison.verdict() == "ties"  # significantly better on 1 seed of 3
    assert ledger.Comparison([1, 2, 3], [-0.5, -0.4, 0.1], [0] * 3, [0.01, 0.03, 0.6]).verdict() == "loses"


def test_seeds_whose_arm_and_baseline_ran_on_other_hardware_are_marked(tmp_path):
    gpu = {"cpu": "Some CPU", "gpu": "Some GPU", "torch_threads": 1}
    for seed in (1, 2):
        ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer", seed),
                           fake_entry("plain_transformer", seed, 11.0, WRONG, baseline=None))
    ledger.write_entry(ledger.ledger_path(tmp_path, "gtrans", 1), fake_entry("gtrans", 1, 40.0, REFERENCES))
    ledger.write_entry(ledger.ledger_path(tmp_path, "gtrans", 2), fake_entry("gtrans", 2, 40.0, REFERENCES, device=gpu))
    text = ledger.report(tmp_path, BOTH, bench.paired_bootstrap, {}, [])
    gtrans = next(line for line in text.splitlines() if line.startswith("| `gtrans`")).split(" | ")
    assert gtrans[8] == "0.001 / 0.001†" and gtrans[11] == "– / –†"
    assert "†: the arm and its baseline of this seed were trained on different kinds of hardware" in text
    # without a cross-hardware pair there is no footnote
    (tmp_path / "gtrans" / "seed_2.json").unlink()
    assert "†" not in ledger.report(tmp_path, BOTH, bench.paired_bootstrap, {}, [])


def test_seeds_whose_arm_and_baseline_fine_tuned_different_starting_runs_are_marked(tmp_path):
    """A fine-tuning arm and its baseline must start from the same run of their starting arm for Δ to be the change
    of model alone; a seed whose two runs record different starting runs (`init_from`) is marked, with both starts."""
    def start(test_bleu):
        return {"arm": "plain_transformer", "seed": 2, "steps": 2000, "validation_bleu": 36.0, "test_bleu": test_bleu,
                "run_dir": "runs/x"}

    for seed in (1, 2):
        ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer_continued", seed), fake_entry(
            "plain_transformer_continued", seed, 11.0, WRONG, baseline=None, init_from=start(34.09)))
    ledger.write_entry(ledger.ledger_path(tmp_path, "gtrans_finetuned", 1), fake_entry(
        "gtrans_finetuned", 1, 40.0, REFERENCES, baseline="plain_transformer_continued", init_from=start(34.09)))
    ledger.write_entry(ledger.ledger_path(tmp_path, "gtrans_finetuned", 2), fake_entry(
        "gtrans_finetuned", 2, 40.0, REFERENCES, baseline="plain_transformer_continued", init_from=start(35.16)))
    text = ledger.report(tmp_path, BOTH, bench.paired_bootstrap, {}, [])
    row = next(line for line in text.splitlines() if line.startswith("| `gtrans_finetuned`")).split(" | ")
    assert row[8] == "0.001 / 0.001‡" and row[11] == "– / –‡"
    assert "‡: the arm and its baseline of this seed fine-tuned different runs of the arm they start from" in text
    assert "`gtrans_finetuned` seed 2 from test 35.16, its baseline from 34.09" in text
    assert "(seed 2 from another starting run than the baseline's ‡)" in text  # in the conclusions too
    # one starting run for both: no mark
    (tmp_path / "gtrans_finetuned" / "seed_2.json").unlink()
    assert "‡" not in ledger.report(tmp_path, BOTH, bench.paired_bootstrap, {}, [])


def start_record(test_bleu, seed=2):
    """An `init_from` of a fine-tuning entry: the plain run of `seed` it started from, told apart by its BLEU."""
    return {"arm": "plain_transformer", "seed": seed, "steps": 2000, "validation_bleu": 36.0, "test_bleu": test_bleu,
            "run_dir": "runs/x"}


def test_a_rerun_from_the_other_runs_start_stands_in_for_an_entry_in_that_seeds_comparison(tmp_path):
    """Seed 2 of the arm started from another plain run (35.16) than the baseline's entry (34.09); the seed's Δ is
    taken against the baseline's rerun from 35.16 (39 BLEU, not the entry's 11), unmarked ‡ and marked §, and the
    baseline's own row stays its entries'. Without that rerun, the arm's rerun from 34.09 pairs with the baseline's
    entry instead."""
    for seed in (1, 2):
        ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer_continued", seed), fake_entry(
            "plain_transformer_continued", seed, 11.0, WRONG, baseline=None, init_from=start_record(34.09, seed)))
        ledger.write_entry(ledger.ledger_path(tmp_path, "gtrans_finetuned", seed), fake_entry(
            "gtrans_finetuned", seed, 40.0, REFERENCES, baseline="plain_transformer_continued",
            init_from=start_record(34.09 if seed == 1 else 35.16, seed)))
    rerun = fake_entry("plain_transformer_continued", 2, 39.0, HALF_RIGHT, baseline=None,
                       init_from=start_record(35.16))
    path = ledger.rerun_path(tmp_path, "plain_transformer_continued", 2, ledger.start_tag(rerun["init_from"]))
    ledger.write_entry(path, rerun)
    assert path.name == f"seed_2_from_{ledger.start_tag(start_record(35.16))}.json"
    assert ledger.read_ledger(tmp_path)["plain_transformer_continued"][2]["test"]["bleu"] == 11.0  # not the rerun
    assert ledger.read_reruns(tmp_path) == {"plain_transformer_continued": {2: [ledger.read_entry(path)]}}
    text = ledger.report(tmp_path, BOTH, bench.paired_bootstrap, {}, [])
    row = next(line for line in text.splitlines() if line.startswith("| `gtrans_finetuned`")).split(" | ")
    assert row[7:9] == ["+15.00 ± 19.80", "0.001 / 0.001§"]  # Δ 40 - 11 and 40 - 39: seed 2 against the rerun
    assert row[11] == "– / –§"
    baseline_row = next(line for line in text.splitlines() if line.startswith("| `plain_transformer_continued`"))
    assert baseline_row.split(" | ")[5] == "11.00 ± 0.00"
    assert "‡" not in text and "§: compared through a rerun of the arm or its baseline" in text
    assert ("- `gtrans_finetuned` seed 2 against `plain_transformer_continued`, both from test 35.16: the arm's entry "
            "(val 41.00, test 40.00), the baseline's rerun (val 40.00, test 39.00; its entry, from test 34.09: val "
            "12.00, test 11.00)") in text
    # a rerun from a start no run of the arm had is not used, and the seed is marked as started apart again
    path.unlink()
    other = fake_entry("plain_transformer_continued", 2, 39.0, REFERENCES, baseline=None,
                       init_from=start_record(33.00))
    ledger.write_entry(ledger.rerun_path(tmp_path, "plain_transformer_continued", 2,
                                         ledger.start_tag(other["init_from"])), other)
    text = ledger.report(tmp_path, BOTH, bench.paired_bootstrap, {}, [])
    assert "0.001 / 0.001‡" in text and "§" not in text
    # the arm's rerun from the baseline entry's start (34.09, 20 BLEU) pairs with that entry
    arm_rerun = fake_entry("gtrans_finetuned", 2, 20.0, WRONG, baseline="plain_transformer_continued",
                           init_from=start_record(34.09))
    ledger.write_entry(ledger.rerun_path(tmp_path, "gtrans_finetuned", 2, ledger.start_tag(arm_rerun["init_from"])),
                       arm_rerun)
    text = ledger.report(tmp_path, BOTH, bench.paired_bootstrap, {}, [])
    row = next(line for line in text.splitlines() if line.startswith("| `gtrans_finetuned`")).split(" | ")
    assert row[4:8] == ["41.00 ± 0.00", "40.00 ± 0.00", "`plain_transformer_continued`", "+19.00 ± 14.14"]
    assert ("- `gtrans_finetuned` seed 2 against `plain_transformer_continued`, both from test 34.09: the arm's rerun "
            "(val 21.00, test 20.00; its entry, from test 35.16: val 41.00, test 40.00), the baseline's entry (val "
            "12.00, test 11.00)") in text and "‡" not in text


def test_a_rerun_entry_must_carry_the_start_its_name_says(tmp_path):
    entry = fake_entry("plain_transformer_continued", 2, 39.0, REFERENCES, baseline=None,
                       init_from=start_record(35.16))
    wrong = ledger.rerun_path(tmp_path, "plain_transformer_continued", 2, ledger.start_tag(start_record(34.09)))
    ledger.write_entry(wrong, entry)
    with pytest.raises(ledger.UnreadableResult, match="misplaced ledger entry"):
        ledger.read_reruns(tmp_path)


def test_the_study_queues_reruns_from_one_start_where_this_machine_holds_it(tmp_path, monkeypatch):
    """Priority 7: a seed none of whose fine-tuning arm's runs started where a run of its baseline did gets the
    baseline's rerun from each of the arm's starts and the arm's rerun from each of the baseline's, one per arm and
    start, pending only on a machine whose finished starting run is that start; once one has run, the seed is
    paired and its other reruns leave the queue."""
    monkeypatch.setattr(study.queue, "WORK_DIR", tmp_path / "work")
    ledger_dir = tmp_path / "ledger"
    for seed in (1, 2):
        ledger.write_entry(ledger.ledger_path(ledger_dir, "plain_transformer_continued", seed), fake_entry(
            "plain_transformer_continued", seed, 11.0, WRONG, baseline=None, init_from=start_record(34.09, seed)))
    for arm, seed, start in (("gtrans_finetuned", 1, 34.09), ("gtrans_finetuned", 2, 35.16),
                             ("rtal_finetuned", 2, 35.16), ("layerwise_coordination_finetuned", 2, 36.00)):
        ledger.write_entry(ledger.ledger_path(ledger_dir, arm, seed), fake_entry(
            arm, seed, 40.0, REFERENCES, baseline="plain_transformer_continued", init_from=start_record(start, seed)))

    def planned():
        return sorted((r.arm, r.seed, r.start_test_bleu, r.for_runs)
                      for r in study.queue.reruns_from_one_start(ledger_dir))

    continued = "`plain_transformer_continued` seed 2"
    assert planned() == sorted([
        ("plain_transformer_continued", 2, 35.16, ("`gtrans_finetuned` seed 2", "`rtal_finetuned` seed 2")),
        ("plain_transformer_continued", 2, 36.00, ("`layerwise_coordination_finetuned` seed 2",)),
        ("gtrans_finetuned", 2, 34.09, (continued,)), ("rtal_finetuned", 2, 34.09, (continued,)),
        ("layerwise_coordination_finetuned", 2, 34.09, (continued,)),
    ])
    reruns = study.queue.reruns_from_one_start(ledger_dir)
    # one run however many seeds it serves: a seed joining it while it runs does not make it another (`startable`
    # keeps a running run from starting twice by this equality)
    assert reruns[0] == __import__("dataclasses").replace(reruns[0], for_runs=("`x` seed 2",))
    queue = study.queue.study_queue(ledger_dir=ledger_dir)
    first_seed_2 = queue.index(study.queue.StudyRun(study.queue.FINE_TUNING_ARMS[0], 2))
    assert queue[first_seed_2 - 5: first_seed_2] == reruns  # before the fine-tuning arms' seeds 2-3

    def pending_reruns():
        pending = study.queue.pending_runs(ledger_dir, tmp_path / "probes")
        return [run for run in pending if isinstance(run, study.queue.Rerun)]

    assert pending_reruns() == []  # no start is on this machine
    assert [r for r in study.queue.pending_runs(ledger_dir, tmp_path / "probes", here=False)
            if isinstance(r, study.queue.Rerun)] == reruns  # the queue as the ledger alone says (the README's)
    # this machine's plain run of seed 2 is the one gtrans_finetuned and rtal_finetuned seed 2 started from
    start_dir = study.queue.StudyRun("plain_transformer", 2).run_dir()
    start_dir.mkdir(parents=True)
    (start_dir / "bench_results.json").write_text(json.dumps(
        {"train": {"global_step": 2000}, "validation": {"bleu": 36.0}, "test": {"bleu": 35.16}}))
    pending = pending_reruns()
    assert [(r.start_test_bleu, r.label) for r in pending] == [(35.16, (
        "`plain_transformer_continued` seed 2 again, from the start of `gtrans_finetuned` seed 2, `rtal_finetuned` "
        "seed 2 (test 35.16)"))]
    assert pending[0].run_dir() == study.queue.StudyRun("plain_transformer_continued", 2).run_dir()  # bench_multi30k's
    rerun = fake_entry("plain_transformer_continued", 2, 39.0, REFERENCES, baseline=None,
                       init_from={**start_record(35.16), "run_dir": str(start_dir)})
    ledger.write_entry(pending[0].result_file(ledger_dir), rerun)
    assert study.queue.result_state(pending[0], ledger_dir)[0] == "done"
    # layer-wise coordination's seed 2, from 36.00, can now pair with the baseline's rerun: its own rerun from 35.16
    assert [(r.arm, r.start_test_bleu) for r in pending_reruns()] == [("layerwise_coordination_finetuned", 35.16)]
    # gtrans and rtal seed 2 are paired now; layer-wise coordination's seed is not: the baseline from its start, or
    # the arm from either of the baseline's (34.09, and the rerun's 35.16)
    assert planned() == sorted([
        ("plain_transformer_continued", 2, 36.00, ("`layerwise_coordination_finetuned` seed 2",)),
        ("layerwise_coordination_finetuned", 2, 34.09, (continued,)),
        ("layerwise_coordination_finetuned", 2, 35.16, (continued,)),
    ])


def test_loss_curves_of_the_deep_runs_are_reported(tmp_path):
    entry = fake_entry("plain_transformer_24x18", 1, 1.0, WRONG, baseline=None, show_loss_curve=True)
    ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer_24x18", 1), entry)
    text = ledger.report(tmp_path, BOTH, bench.paired_bootstrap, {}, [])
    assert "| `plain_transformer_24x18` | 1 | 9.00 | 7.50 | – |" in text


def probe_result(directory, shape, seconds_per_step, final_loss):
    """A depth-probe result file with what the queue and the report read."""
    entry = {"family": "plain_transformer", "encoder_layers": shape[0], "decoder_layers": shape[1], "seed": 1,
             "steps": 600, "warmup_steps": 400, "seconds_per_step": seconds_per_step, "commit": "abcdef0123",
             "loss_curve": [{"step": 25 * i, "loss": 9.0 if i < 20 else final_loss} for i in range(1, 25)]}
    path = study.queue.depth_probes.result_file(directory, "plain_transformer", shape, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry))


@pytest.mark.parametrize("probes, pair", [
    # (seconds per step, final loss) per shape; the 6 + 6 reference ends at loss 4.0
    ({(24, 18): (3.0, 4.2), (18, 12): (2.0, 6.0), (12, 12): (1.5, 4.1)}, (24, 18)),  # 24 + 18 fits 60 min
    ({(24, 18): (4.0, 7.0), (18, 12): (3.0, 6.0), (12, 12): (2.0, 4.1)}, (18, 12)),  # shallowest failing, fits
    ({(24, 18): (4.0, 7.0), (18, 12): (3.0, 6.0), (12, 12): (2.0, float("nan"))}, (12, 12)),  # NaN fails too
    ({(24, 18): (4.0, 4.3), (18, 12): (3.0, 4.2), (12, 12): (2.0, 4.1)}, (18, 12)),  # all train: deepest that fits
    ({(24, 18): (4.0, 7.0), (18, 12): (4.0, 6.0), (12, 12): (3.7, 4.1)}, None),  # shallowest failing does not fit
    ({(24, 18): (4.0, 7.0), (18, 12): (2.0, 6.0)}, None),  # a probe has not run
])
def test_priority_2_pair_follows_the_depth_probes(tmp_path, probes, pair):
    probe_result(tmp_path, (6, 6), 1.0, 4.0)
    for shape, (seconds, loss) in probes.items():
        probe_result(tmp_path, shape, seconds, loss)
    shape, why = study.queue.deep_post_norm_pair(tmp_path)
    assert shape == pair, why
    queue = study.queue.study_queue(tmp_path)
    deep = [(run.arm, run.max_steps, run.warmup_steps) for run in queue if isinstance(run, study.queue.StudyRun)
            and run.max_steps == 1000]
    expected = [] if pair is None else [(f"{family}_{pair[0]}x{pair[1]}", 1000, 400)
                                        for family in ("plain_transformer", "gtrans")]
    assert deep == expected
    probes_queued = [(run.encoder_layers, run.decoder_layers) for run in queue
                     if isinstance(run, study.queue.DepthProbe)]
    assert probes_queued == [(6, 6), *study.queue.DEEP_SHAPES]
    last_probe = queue.index(study.queue.DepthProbe(24, 18))
    assert all(queue.index(run) > last_probe for run in queue
               if isinstance(run, study.queue.StudyRun) and run.max_steps == 1000)
    table = "\n".join(study.queue.depth_probes.report(tmp_path))
    assert "| 6 + 6 | 600 (400) | 4.00 | reference |" in table
    if (18, 12) in probes and probes[(18, 12)][1] == 6.0:
        assert f"| 18 + 12 | 600 (400) | 6.00 | fails (+2.00 nats) | {probes[(18, 12)][0]:.2f} |" in table


def test_depth_probe_rejects_bad_shapes_and_schedules():
    with pytest.raises(SystemExit):
        study.queue.depth_probes.parse_args(["--shapes", "24-18"])
    with pytest.raises(SystemExit):
        study.queue.depth_probes.parse_args(["--steps", "300", "--warmup_steps", "400"])
    with pytest.raises(SystemExit):
        study.queue.depth_probes.parse_args(["--steps", "99", "--warmup_steps", "10"])
    with pytest.raises(SystemExit):
        study.queue.depth_probes.parse_args(["--family", "marian"])
    with pytest.raises(SystemExit):
        study.queue.depth_probes.parse_args(["--seed", "0"])
    with pytest.raises(__import__("argparse").ArgumentTypeError, match="'0x6'"):
        study.queue.depth_probes.parse_shape("0x6")


def test_the_probed_depths_have_their_arms():
    assert study.queue.DEEP_SHAPES == bench.DEEP_POST_NORM_SHAPES
    for encoder, decoder in study.queue.DEEP_SHAPES:
        assert bench.MODELS[f"gtrans_{encoder}x{decoder}"].baseline == f"plain_transformer_{encoder}x{decoder}"
        assert bench.MODELS[f"gtrans_{encoder}x{decoder}"].config["encoder_layers"] == encoder


def test_every_study_run_is_a_known_arm_with_its_baseline_queued_alike(tmp_path):
    # an empty ledger: no baseline reruns (priority 7, the only runs sharing an arm and seed with another)
    queue = [run for run in study.queue.study_queue(ledger_dir=tmp_path) if isinstance(run, study.queue.StudyRun)]
    assert len({(run.arm, run.seed) for run in queue}) == len(queue)  # one ledger file per arm and seed
    budget = {(run.arm, run.seed): run.budget for run in queue}
    for run in queue:
        assert run.arm in bench.MODELS, run.arm
        # the arms trained to convergence take the converged budget, and no other arm does
        assert bench.MODELS[run.arm].converged == isinstance(run, study.queue.ConvergedRun), run.arm
        baseline = bench.MODELS[run.arm].baseline
        if baseline is not None:  # the budget of the baseline run of the same seed, queued before it
            assert budget[(baseline, run.seed)] == run.budget, run
            assert queue.index(next(r for r in queue if (r.arm, r.seed) == (baseline, run.seed))) < queue.index(run)
    assert [(r.arm, r.seed) for r in queue[:6]] == [
        (arm, seed) for seed in (1, 2, 3) for arm in ("plain_transformer", "gtrans")]  # priority 1 first
    # priority 3: the done-when's arms (layer-wise coordination, Re-Transformer) reach 3 seeds before the others' seed 2
    position = {(r.arm, r.seed): i for i, r in enumerate(queue)}
    done_when = ("layerwise_coordination_14", "re_transformer_2", "re_transformer_4")
    assert max(position[(arm, seed)] for arm in done_when for seed in (1, 2, 3)) < min(
        position[(arm, 2)] for arm in ("deep_representations_no_diversity", "rtal_paper", "deep_representations_paper"))


def test_the_queue_can_be_limited_to_some_arms(tmp_path):
    ledger_dir = tmp_path / "ledger"
    pending = study.queue.pending_runs(ledger_dir, arms=["re_transformer_4", "re_transformer_2"])
    assert [(run.arm, run.seed) for run in pending] == [
        (arm, seed) for seed in (1, 2, 3, 4, 5) for arm in ("re_transformer_2", "re_transformer_4")]  # queue order
    done = study.queue.StudyRun("re_transformer_2", 1).result_file(ledger_dir)
    ledger.write_entry(done, fake_entry("re_transformer_2", 1, 30.0, REFERENCES))
    pending = study.queue.pending_runs(ledger_dir, arms=["re_transformer_2"])
    assert study.queue.StudyRun("re_transformer_2", 1) not in pending
    unfiltered = {run.arm for run in study.queue.pending_runs(ledger_dir) if isinstance(run, study.queue.ArmRun)}
    assert {"plain_transformer", "re_transformer_2", "re_transformer_4"} < unfiltered
    with pytest.raises(SystemExit):
        study.queue.parse_args(["--arms", "re_transformer_2", "re_transformer_9"])


@pytest.mark.parametrize("option", ["--ledger_dir", "--probe_dir"])
def test_list_refuses_a_results_directory_that_does_not_exist(tmp_path, capsys, option):
    """Issue 73: a mistyped `--ledger_dir` listed every run as pending (a directory that is not there holds no
    result); it is refused before anything is listed or run."""
    with pytest.raises(SystemExit):
        study.queue.main(["--list", option, str(tmp_path / "no_such_dir")])
    said = capsys.readouterr()
    assert f"{option} {tmp_path / 'no_such_dir'} is not a directory" in said.err and said.out == ""


def test_starting_runs_of_the_queue_are_the_arms_init_from():
    fine_tuning = {run.arm for run in study.queue.study_queue() if isinstance(run, study.queue.StudyRun)
                   and bench.MODELS[run.arm].init_from is not None}
    assert study.queue.STARTING_RUNS == {arm: bench.MODELS[arm].init_from for arm in fine_tuning}


def package_snapshot(tmp_path: Path) -> Path:
    """A code snapshot of a commit of the study as a package (`study/__init__.py`), for the queue's commands."""
    (tmp_path / "snapshot" / "study").mkdir(parents=True, exist_ok=True)
    (tmp_path / "snapshot" / "study" / "__init__.py").touch()
    return tmp_path / "snapshot"


def test_a_run_resumes_with_the_script_of_its_commit_from_before_the_study_was_a_package(tmp_path):
    """A run started by a commit whose study scripts lay in benchmarks/ resumes with that snapshot's script; a
    snapshot of the package runs its module."""
    args = study.queue.parse_args(["--data_dir", str(tmp_path)])
    run = study.queue.StudyRun("gtrans", 1)
    old_snapshot = tmp_path / "old"
    old_script = old_snapshot / "benchmarks" / "bench_multi30k.py"
    assert run.command(old_snapshot, args)[:2] == [sys.executable, str(old_script)]
    assert run.command(package_snapshot(tmp_path), args)[:3] == [sys.executable, "-m", "study.bench_multi30k"]
    assert run.command(old_snapshot, args)[2:] == run.command(package_snapshot(tmp_path), args)[3:]


def test_the_queue_and_the_benchmark_agree_on_each_seeds_starting_run(tmp_path):
    """Issue 73: the queue's starting run of a fine-tuning arm's seed (`study.queue.starting_run`: what it waits for and
    times) is the run dir the benchmark's command of that seed fine-tunes, for every seed the queue holds."""
    args = study.queue.parse_args(["--data_dir", str(tmp_path)])
    fine_tuning = [run for run in study.queue.study_queue() if isinstance(run, study.queue.StudyRun)
                   and not isinstance(run, study.queue.Rerun) and run.arm in study.queue.STARTING_RUNS]
    assert any(isinstance(run, study.queue.ConvergedRun) for run in fine_tuning)
    assert {run.seed for run in fine_tuning} >= {1, 2, 3}
    for run in fine_tuning:
        parsed = bench.parse_args(run.command(package_snapshot(tmp_path), args)[3:])
        command = bench.run_translation_command(run.arm, run.seed, parsed, parsed.tokenizer_dir)
        assert f"--model_name_or_path={study.queue.starting_run(run).run_dir()}" in command, run.label


def test_parallel_runs_never_share_state_and_probes_run_alone(tmp_path, monkeypatch):
    monkeypatch.setattr(study.queue, "WORK_DIR", tmp_path / "work")  # no finished run here
    run = study.queue.StudyRun
    continued, deep, plain_2 = (run("plain_transformer_continued", 2), run("deep_representations_paper", 2),
                                run("plain_transformer", 2))
    pending = [continued, deep, run("gtrans", 2), run("gtrans", 3), run("rtal_paper", 2)]
    # the two fine-tuning arms of seed 2 share their starting run: only the first starts
    assert study.queue.startable(pending, [], 3) == [continued, run("gtrans", 2), run("gtrans", 3)]
    assert study.queue.startable(pending, [], 1) == [continued]
    assert study.queue.startable([plain_2, deep], [], 2) == [plain_2]  # nor with the starting run itself
    running = [study.queue.RunningRun(continued, None, Path("log"), 0.0)]
    # running ones are skipped
    assert study.queue.startable(pending, running, 3) == [run("gtrans", 2), run("gtrans", 3)]
    probe = study.queue.DepthProbe(12, 12)
    assert study.queue.startable([probe, run("gtrans", 2)], [], 4) == [probe]  # a probe alone ...
    assert study.queue.startable([run("gtrans", 2), probe, run("gtrans", 3)], [], 4) == [run("gtrans", 2)]  # ... after
    assert study.queue.startable([probe], running, 4) == []  # the runs before it
    assert study.queue.startable([run("gtrans", 2)], [study.queue.RunningRun(probe, None, Path("log"), 0.0)], 4) == []
    m2m = [study.queue.ManyToManyRun("plain_transformer_m2m", 1), study.queue.ManyToManyRun("gtrans_m2m", 1)]
    assert study.queue.startable(m2m, [], 4) == m2m[:1]  # they share their tokenizer
    plain_2.run_dir().mkdir(parents=True)
    (plain_2.run_dir() / "bench_results.json").write_text("{}")  # the starting run finished here: only read now
    assert study.queue.startable([continued, deep], [], 2) == [continued, deep]
    assert study.queue.startable([deep, run("deep_representations_paper", 3)], running, 3) == [
        deep, run("deep_representations_paper", 3)]


def test_the_queue_runs_n_at_a_time_and_stops_starting_runs_after_a_failure(tmp_path, monkeypatch, capsys):
    """run_queue with runs that are stand-ins (a subprocess that writes the run's ledger file, or fails): it keeps
    `--parallel` runs going, records when each started and ended, and starts nothing after a failure."""
    ledger_dir, events = tmp_path / "ledger", tmp_path / "events"
    events.mkdir()
    ledger_dir.mkdir()  # the queue refuses a ledger dir that does not exist
    arms = ["re_transformer_2", "re_transformer_4"]
    failing = {study.queue.StudyRun("re_transformer_4", 2)}
    at_once = {}

    def fake_start(run, args, runs_at_once):
        at_once[run.arm, run.seed] = runs_at_once
        result = run.result_file(args.ledger_dir)
        entry = json.dumps({"ledger_version": ledger.LEDGER_VERSION, **fake_entry(run.arm, run.seed, 30.0, WRONG)})
        script = (f"import pathlib, time; e = pathlib.Path({str(events)!r}); (e / '{run.arm}_{run.seed}.start')"
                  f".write_text(repr(time.monotonic())); "
                  + ("raise SystemExit(3)" if run in failing else "time.sleep(1.0); "
                     f"r = pathlib.Path({str(result)!r}); r.parent.mkdir(parents=True, exist_ok=True); "
                     f"r.write_text({entry!r})")
                  + f"; (e / '{run.arm}_{run.seed}.end').write_text(repr(time.monotonic()))")
        process = study.queue.subprocess.Popen([sys.executable, "-c", script])
        return study.queue.RunningRun(run, process, tmp_path / "log", study.queue.time.monotonic())

    monkeypatch.setattr(study.queue, "start", fake_start)
    args = study.queue.parse_args(["--arms", *arms, "--parallel", "2", "--ledger_dir", str(ledger_dir),
                             "--data_dir", str(tmp_path)])
    assert study.queue.run_queue(args) is False
    started = sorted(path.stem for path in events.glob("*.start"))
    # seeds 1 of both arms, then seeds 2 of both (re_transformer_4 seed 2 fails); seed 3 never starts
    assert started == ["re_transformer_2_1", "re_transformer_2_2", "re_transformer_4_1", "re_transformer_4_2"]
    times = {path.name: float(path.read_text()) for path in events.iterdir()}
    for name in ("re_transformer_2_1", "re_transformer_4_1"):  # the first two ran at the same time
        other = "re_transformer_4_1" if name == "re_transformer_2_1" else "re_transformer_2_1"
        assert times[f"{name}.start"] < times[f"{other}.end"]
    assert "`re_transformer_4` seed 2 FAILED (exit 3)" in capsys.readouterr().out
    assert set(at_once.values()) == {2}  # two at a time, as --parallel 2 allows
    left = [("re_transformer_4", 2), ("re_transformer_2", 3), ("re_transformer_4", 3)] + [
        (arm, seed) for seed in (4, 5) for arm in arms]  # priority 8's seeds 4-5 last
    assert [(r.arm, r.seed) for r in study.queue.pending_runs(ledger_dir, arms=arms)] == left
    # --parallel is a ceiling: with 7 runs left and 8 slots, each run records the 7 that really shared the device
    at_once.clear()
    args = study.queue.parse_args(["--arms", *arms, "--parallel", "8", "--ledger_dir", str(ledger_dir),
                             "--data_dir", str(tmp_path)])
    failing.clear()
    assert study.queue.run_queue(args) is True
    assert at_once == {run: len(left) for run in left}
    with pytest.raises(SystemExit):
        study.queue.parse_args(["--parallel", "0"])
    with pytest.raises(SystemExit):
        study.queue.parse_args(["--once", "--parallel", "2"])


def test_a_stopped_queue_stops_its_runs(tmp_path):
    """`kill` (SIGTERM) of `python -m study` stops the runs it started, as Ctrl-C does: a run left running would hold
    its run dir and make the next queue's start of it fail. The queue runs in a process of its own, its runs stand-ins
    that would sleep for a minute."""
    ledger_dir, pids = tmp_path / "ledger", tmp_path / "pids"
    ledger_dir.mkdir()
    pids.mkdir()
    driver = f"""
import subprocess, sys, time
from pathlib import Path
import study.queue as queue

def start(run, args, runs_at_once):
    script = ("import os, pathlib, time; pathlib.Path({str(pids)!r}, "
              f"'{{run.arm}}_{{run.seed}}').write_text(str(os.getpid())); time.sleep(60)")
    return queue.RunningRun(run, subprocess.Popen([sys.executable, "-c", script]), Path("log"), time.monotonic())

queue.start = start
queue.WORK_DIR = Path({str(tmp_path / "work")!r})  # not the checkout's runs/study (its lock)
# not niced: at 19 beside the suite's other workers on a busy core it may not start its runs within the deadline
queue.main(["--arms", "re_transformer_2", "--parallel", "2", "--nice", "0", "--ledger_dir", {str(ledger_dir)!r},
            "--data_dir", {str(tmp_path)!r}])
"""
    queue = subprocess.Popen([sys.executable, "-c", driver], cwd=REPO_ROOT, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while len([path for path in pids.iterdir() if path.read_text()]) < 2:
        assert queue.poll() is None and time.monotonic() < deadline, queue.communicate()
        time.sleep(0.05)
    runs = {path.name: int(path.read_text()) for path in pids.iterdir()}
    assert set(runs) == {"re_transformer_2_1", "re_transformer_2_2"}
    queue.send_signal(signal.SIGTERM)
    stdout, stderr = queue.communicate(timeout=120)
    assert queue.returncode == 128 + signal.SIGTERM, stderr
    for name, pid in runs.items():
        with pytest.raises(ProcessLookupError):  # stopped and reaped by the queue
            os.kill(pid, 0)
        arm, seed = name.rsplit("_", 1)
        assert f"stopped `{arm}` seed {seed} with the queue; it resumes from its last checkpoint" in stdout


def test_hours_starts_only_the_runs_expected_to_fit(tmp_path, monkeypatch, capsys):
    """`--hours`: a run's expected minutes are the median of its arm's CPU runs in the ledger (those on this CPU
    model and instruction set where there are any, else this model's entries that predate the set's record; of
    those, the ones with the queue's `--threads` where there are any; GPU runs never count), 90 without any, plus
    the starting run's while a fine-tuning arm must train that first; runs that do not fit are left for later ones
    that do, each said once."""
    monkeypatch.setattr(study.queue, "WORK_DIR", tmp_path / "work")
    ledger_dir = tmp_path / "ledger"

    def run_in_ledger(arm, seed, minutes, cpu, gpu=None, capability=None, threads=1, **extra):
        device = {"cpu": cpu, "gpu": gpu, "torch_threads": threads}
        if capability is not None:
            device["cpu_capability"] = capability
        ledger.write_entry(ledger.ledger_path(ledger_dir, arm, seed), fake_entry(
            arm, seed, 30.0, REFERENCES, train_minutes=minutes - 2.0, evaluation_minutes=2.0, device=device, **extra))

    run_in_ledger("plain_transformer_continued", 1, 100.0, "CPU A")
    run_in_ledger("plain_transformer_continued", 2, 40.0, "CPU B")
    run_in_ledger("plain_transformer_continued", 4, 60.0, "CPU B")
    run_in_ledger("plain_transformer_continued", 5, 3.0, "CPU A", gpu="Some GPU")
    run_in_ledger("plain_transformer", 1, 60.0, "CPU B")
    run_in_ledger("re_transformer_2", 1, 30.0, "CPU A", capability="AVX512")
    run_in_ledger("re_transformer_2", 2, 80.0, "CPU A")  # before the instruction set was recorded
    run_in_ledger("re_transformer_2", 3, 200.0, "CPU A", capability="AVX2")
    run_in_ledger("re_transformer_2", 4, 10.0, "CPU B", capability="AVX512")
    run_in_ledger("re_transformer_2", 6, 20.0, "CPU A", capability="AVX512", threads=2)
    run_in_ledger("re_transformer_2", 7, 90.0, "CPU A", capability="AVX512", runs_at_once=2)
    args = study.queue.parse_args(["--hours", "2", "--ledger_dir", str(ledger_dir)])
    re_transformer = study.queue.StudyRun("re_transformer_2", 5)
    # the runs with the queue's threads (1 by default), not the faster one with 2, nor their median; of those, not
    # the slower one that shared the machine with another run, while the ledger says nothing of the others' sharing
    assert study.queue.expected_minutes(re_transformer, args, ledger.CpuKind("CPU A", "AVX512"))[0] == 30.0
    two_at_once = study.queue.parse_args(["--hours", "2", "--ledger_dir", str(ledger_dir), "--parallel", "2"])
    assert study.queue.expected_minutes(re_transformer, two_at_once, ledger.CpuKind("CPU A", "AVX512"))[0] == 90.0
    two_threads = study.queue.parse_args(["--hours", "2", "--ledger_dir", str(ledger_dir), "--threads", "2"])
    assert study.queue.expected_minutes(re_transformer, two_threads, ledger.CpuKind("CPU A", "AVX512"))[0] == 20.0
    # no run with 4 threads: those of its CPU kind, whatever their threads
    four_threads = study.queue.parse_args(["--hours", "2", "--ledger_dir", str(ledger_dir), "--threads", "4"])
    assert study.queue.expected_minutes(re_transformer, four_threads, ledger.CpuKind("CPU A", "AVX512"))[0] == 25.0
    assert study.queue.expected_minutes(re_transformer, args, ledger.CpuKind("CPU A", "AVX2"))[0] == 200.0
    # a kind of CPU A no entry names: its entries from before the record, not those of another kind
    assert study.queue.expected_minutes(re_transformer, args, ledger.CpuKind("CPU A", "DEFAULT"))[0] == 80.0
    assert study.queue.expected_minutes(re_transformer, args, ledger.CpuKind("CPU C", "AVX512"))[0] == 55.0  # all CPUs
    # a run that recorded having the machine to itself, as the queue's will: it, not those from before the record
    run_in_ledger("re_transformer_2", 8, 34.0, "CPU A", capability="AVX512", runs_at_once=1)
    assert study.queue.expected_minutes(re_transformer, args, ledger.CpuKind("CPU A", "AVX512"))[0] == 34.0
    continued, untimed = study.queue.StudyRun("plain_transformer_continued", 3), study.queue.StudyRun("gtrans_12x6", 2)
    assert study.queue.expected_minutes(continued, args, ledger.CpuKind("CPU A", None))[0] == 100.0 + 60.0  # its starting run must train first
    assert study.queue.expected_minutes(continued, args, ledger.CpuKind("CPU C", None))[0] == 60.0 + 60.0  # no run on this model: all CPUs
    starting_run = study.queue.StudyRun("plain_transformer", 3)
    starting_run.run_dir().mkdir(parents=True)
    (starting_run.run_dir() / "bench_results.json").write_text("{}")  # finished here: bench_multi30k reuses it
    assert study.queue.expected_minutes(continued, args, ledger.CpuKind("CPU A", None)) == (100.0, "the median of its arm's 1 CPU run(s) in the ledger")
    assert study.queue.expected_minutes(untimed, args, ledger.CpuKind("CPU A", None))[0] == study.queue.UNTIMED_RUN_MINUTES
    skipped = set()
    for _ in range(2):
        assert study.queue.fitting_runs([continued, untimed], 95.0, args, ledger.CpuKind("CPU A", None), skipped) == [untimed]
    said = capsys.readouterr().out
    assert said.count("`plain_transformer_continued` seed 3 does not fit: expected 100 min") == 1
    assert said.count("; not starting it") == 1
    assert study.queue.fitting_runs([continued, untimed], 60.0, args, ledger.CpuKind("CPU A", None), skipped) == []
    for hours in ("0", "-1", "nan", "inf"):
        with pytest.raises(SystemExit):
            study.queue.parse_args(["--hours", hours])


def test_fill_starts_the_runs_that_do_not_fit_after_those_that_do(tmp_path, monkeypatch, capsys):
    """`--hours H --fill`: the runs expected to fit start first, whatever their place in the queue; once none waits,
    the free slots take the runs that do not fit, in queue order. Without `--fill` those never start."""
    ledger_dir = tmp_path / "ledger"
    ledger_dir.mkdir()
    arms = ["re_transformer_2", "re_transformer_4"]
    started = []

    def fake_start(run, args, runs_at_once):
        started.append((run.arm, run.seed))
        entry = json.dumps({"ledger_version": ledger.LEDGER_VERSION, **fake_entry(run.arm, run.seed, 30.0, WRONG)})
        script = (f"import pathlib; r = pathlib.Path({str(run.result_file(args.ledger_dir))!r}); "
                  f"r.parent.mkdir(parents=True, exist_ok=True); r.write_text({entry!r})")
        process = study.queue.subprocess.Popen([sys.executable, "-c", script])
        return study.queue.RunningRun(run, process, tmp_path / "log", study.queue.time.monotonic())

    monkeypatch.setattr(study.queue, "start", fake_start)
    # re_transformer_2, first in the queue, is expected to take longer than --hours leaves; re_transformer_4 fits
    monkeypatch.setattr(study.queue, "expected_minutes", lambda run, args, cpu: (
        (500.0 if run.arm == "re_transformer_2" else 5.0), "a stand-in"))
    seeds = [1, 2, 3, 4, 5]
    command = ["--arms", *arms, "--hours", "1", "--ledger_dir", str(ledger_dir), "--data_dir", str(tmp_path)]
    with pytest.raises(SystemExit):
        study.queue.parse_args([option for option in command if option not in ("--hours", "1")] + ["--fill"])
    assert study.queue.run_queue(study.queue.parse_args(command)) is True
    assert started == [("re_transformer_4", seed) for seed in seeds]
    assert "`re_transformer_2` seed 1 does not fit: expected 500 min (a stand-in), 60 min of --hours left; " \
           "not starting it" in capsys.readouterr().out
    assert study.queue.pending_runs(ledger_dir, arms=arms) == [study.queue.StudyRun("re_transformer_2", seed)
                                                               for seed in seeds]
    for arm_dir in ledger_dir.iterdir():
        shutil.rmtree(arm_dir)
    started.clear()
    assert study.queue.run_queue(study.queue.parse_args(command + ["--fill"])) is True
    assert started == [("re_transformer_4", seed) for seed in seeds] + [("re_transformer_2", seed) for seed in seeds]
    assert "--fill starts it when no run that fits waits for a free slot" in capsys.readouterr().out
    assert study.queue.pending_runs(ledger_dir, arms=arms) == []


def test_hours_counts_only_the_steps_a_resumed_run_has_left(tmp_path, monkeypatch, capsys):
    """A run a stop interrupted resumes from its latest checkpoint: `--hours` expects only the training of the steps
    after it (the evaluation in full), so a run longer than a session is carried across sessions instead of being
    refused each time for its full length."""
    monkeypatch.setattr(study.queue, "WORK_DIR", tmp_path / "work")
    ledger_dir = tmp_path / "ledger"
    ledger.write_entry(ledger.ledger_path(ledger_dir, "re_transformer_2", 1), fake_entry(
        "re_transformer_2", 1, 30.0, REFERENCES, train_minutes=200.0, evaluation_minutes=10.0,
        device={"cpu": "CPU A", "gpu": None, "torch_threads": 1}))
    args = study.queue.parse_args(["--hours", "2", "--ledger_dir", str(ledger_dir)])
    run, cpu = study.queue.StudyRun("re_transformer_2", 2), ledger.CpuKind("CPU A", None)
    assert study.queue.expected_minutes(run, args, cpu)[0] == 210.0
    run.run_dir().mkdir(parents=True)
    (run.run_dir() / "STUDY_COMMIT").write_text(study.queue.git("rev-parse", "HEAD") + "\n")
    for step in (500, 1500):
        (run.run_dir() / f"checkpoint-{step}").mkdir()
        (run.run_dir() / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    (run.run_dir() / "checkpoint-2000").mkdir()  # interrupted while saving: no trainer state, not resumed from
    minutes, source = study.queue.expected_minutes(run, args, cpu)
    assert minutes == 200.0 * 500 / 2000 + 10.0
    assert "the 500 steps left after its checkpoint at step 1500" in source
    assert study.queue.fitting_runs([run], 70.0, args, cpu, set()) == [run]
    (run.run_dir() / "STUDY_COMMIT").write_text("f" * 40 + "\n")  # an unknown commit: starts over, in full
    assert study.queue.expected_minutes(run, args, cpu)[0] == 210.0


def test_an_exported_tree_without_git_runs_its_own_code(tmp_path, monkeypatch):
    monkeypatch.setattr(study.queue, "REPO_ROOT", tmp_path)
    (tmp_path / study.queue.SNAPSHOT_COMMIT_FILE).write_text("0123abcd\n")
    assert study.queue.code_to_run() == ("0123abcd", tmp_path)


def test_an_interrupted_run_resumes_with_the_code_of_its_own_commit(tmp_path, monkeypatch):
    """A run dir with a checkpoint, left unfinished by a commit the repository has, resumes with that commit's code
    whatever HEAD is now; without a checkpoint, finished, or of an unknown commit, it does not."""
    monkeypatch.setattr(study.queue, "WORK_DIR", tmp_path / "work")
    run = study.queue.StudyRun("plain_transformer_continued", 2)
    run_dir = run.run_dir()
    assert study.queue.resumable_commit(run) is None  # no run dir
    run_dir.mkdir(parents=True)
    older = study.queue.git("rev-parse", "HEAD")  # any commit the repository has (a shallow clone has HEAD)
    (run_dir / "STUDY_COMMIT").write_text(older + "\n")
    assert study.queue.resumable_commit(run) is None  # nothing to resume from: starts over with HEAD
    (run_dir / "checkpoint-500").mkdir()
    assert study.queue.resumable_commit(run) == older  # in the repository, not exported yet
    exported = study.queue.WORK_DIR / "code" / "0123abcd"
    exported.mkdir(parents=True)
    (exported / study.queue.SNAPSHOT_COMMIT_FILE).write_text("0123abcd\n")
    (run_dir / "STUDY_COMMIT").write_text("0123abcd\n")
    assert study.queue.resumable_commit(run) == "0123abcd"  # exported before (its commit maybe gone since)
    assert study.queue.code_to_run("0123abcd") == ("0123abcd", exported)
    study.queue.discard_stale_run(run, "0123abcd")  # resumed: the checkpoint stays
    assert (run_dir / "checkpoint-500").is_dir()
    (run_dir / "STUDY_COMMIT").write_text("f" * 40 + "\n")
    assert study.queue.resumable_commit(run) is None  # neither exported nor in the repository: starts over
    (run_dir / "STUDY_COMMIT").write_text(older + "\n")
    (run_dir / "bench_results.json").write_text("{}")
    assert study.queue.resumable_commit(run) is None  # finished


# --- fine-tuning arms (init_from) -------------------------------------------------------------------------------

TOKENIZER_DIR = ledger.DEFAULT_LEDGER / "tokenizer"


def tiny_corpus(directory):
    for stem, count in (("train", 6), ("val", 3), ("test_2016_flickr", 3)):
        (directory / f"{stem}.en").write_text("".join(f"a man number {i}\n" for i in range(count)), encoding="utf-8")
        (directory / f"{stem}.de").write_text("".join(f"ein mann nummer {i}\n" for i in range(count)),
                                              encoding="utf-8")
    return directory


def finished_run_stand_in(calls: list, monkeypatch):
    """A stand-in for run_translation that writes what a finished run leaves behind (its BLEU 20 + the number of
    calls so far: 60 s of training, then 5 s of translating, on the benchmark's clock, which it replaces) and
    records each command in `calls`."""
    clock = [1000.0]
    monkeypatch.setattr(bench, "time", SimpleNamespace(monotonic=lambda: clock[0]))

    def fake_run_translation(command):
        calls.append(command)
        clock[0] += 65.0
        options = dict(item[2:].split("=", 1) for item in command if "=" in item)
        output_dir = Path(options["output_dir"])
        output_dir.mkdir(parents=True, exist_ok=True)
        steps = int(options["max_steps"])
        (output_dir / "trainer_state.json").write_text(json.dumps({
            "global_step": steps, "num_input_tokens_seen": 600, "log_history": [{"step": steps, "loss": 2.5}],
            "stateful_callbacks": {"TimeBudgetCallback": {"attributes": {"elapsed_seconds": 60.0}}},
        }))
        (output_dir / "config.json").write_text(json.dumps({"model_type": options["model_type"]}))
        bleu = 20.0 + len(calls)
        for split in ("validation", "test"):
            (output_dir / f"generated_predictions_{split}.txt").write_text("ein mann\n" * 3, encoding="utf-8")
        return {split: {"bleu": bleu, "signature": "sig"} for split in ("validation", "test")}

    return fake_run_translation


def test_fine_tuning_arm_starts_from_the_finished_run_and_records_it(tmp_path, monkeypatch):
    """`deep_representations_paper --run_only`: the plain run it starts from is trained first (once), the arm then
    runs run_translation.py on that run's directory read as deep representations, and both ledger entries are
    written, the arm's with what it started from. run_translation is replaced by a stand-in that writes what a
    finished run leaves behind."""
    calls = []
    monkeypatch.setattr(bench, "run_translation", finished_run_stand_in(calls, monkeypatch))
    output_dir, ledger_dir = tmp_path / "runs", tmp_path / "ledger"
    argv = ["--models", "deep_representations_paper", "--run_only", "--seeds", "1", "--max_steps_per_model", "3",
            "--output_dir", str(output_dir), "--ledger_dir", str(ledger_dir), "--tokenizer_dir", str(TOKENIZER_DIR),
            "--data_dir", str(tiny_corpus(tmp_path))]
    bench.main(argv)
    plain, deep = calls
    assert "--model_type=plain_transformer" in plain and "--preset=multi30k" in plain
    start_dir = output_dir / "plain_transformer" / "seed_1"
    assert f"--model_name_or_path={start_dir}" in deep and "--model_type=deep_representations" in deep
    assert not any(item.startswith("--preset") for item in deep)
    assert ("--config_overrides=encoder_aggregation=hierarchical,decoder_aggregation=hierarchical,"
            "diversity_weight=1.0") in deep
    assert "--max_steps=3" in deep and f"--output_dir={output_dir / 'deep_representations_paper' / 'seed_1'}" in deep

    entries = bench.ledger.read_ledger(ledger_dir)
    assert entries["plain_transformer"][1]["init_from"] is None
    assert entries["plain_transformer"][1]["runs_at_once"] == 1  # the default: the run had the device to itself
    entry = entries["deep_representations_paper"][1]
    assert entry["baseline"] == "plain_transformer_continued" and entry["steps"] == 3
    # its own session's times, not its starting run's (trained first, in the same process)
    assert (entry["train_minutes"], entry["evaluation_minutes"]) == pytest.approx((1.0, 5.0 / 60))
    assert entry["init_from"] == {"arm": "plain_transformer", "seed": 1, "steps": 3, "validation_bleu": 21.0,
                                  "test_bleu": 21.0, "run_dir": str(start_dir)}
    assert bench.ledger.steps_text(entry) == "3 + 3" and bench.ledger.steps_text(entries["plain_transformer"][1]) == "3"
    # the val translations, for the report's val verdict
    assert entry["validation"]["hypotheses"] == ["ein mann"] * 3

    bench.main(argv)  # finished runs are read back, not redone
    assert len(calls) == 2


def test_each_seed_of_a_fine_tuning_arm_starts_from_and_records_its_own_seeds_run(tmp_path, monkeypatch):
    """Issue 73: with one seed, a fine-tuning arm of seed N that fine-tuned seed 1's run passed the suite (its entry
    still recorded seed N's run). With two, each seed's command fine-tunes its own seed's starting run, and its entry
    records that run: its directory, seed and BLEU (the stand-in gives each run another BLEU)."""
    calls = []
    monkeypatch.setattr(bench, "run_translation", finished_run_stand_in(calls, monkeypatch))
    output_dir, ledger_dir = tmp_path / "runs", tmp_path / "ledger"
    bench.main(["--models", "rtal_finetuned", "--run_only", "--seeds", "1", "2", "--max_steps_per_model", "3",
                "--output_dir", str(output_dir), "--ledger_dir", str(ledger_dir), "--tokenizer_dir",
                str(TOKENIZER_DIR), "--data_dir", str(tiny_corpus(tmp_path))])
    entries = bench.ledger.read_ledger(ledger_dir)
    fine_tuning = [command for command in calls if "--model_type=rtal" in command]
    assert len(fine_tuning) == 2
    for seed, command in zip((1, 2), fine_tuning):
        start_dir = output_dir / "plain_transformer" / f"seed_{seed}"
        assert f"--seed={seed}" in command and f"--model_name_or_path={start_dir}" in command
        start = entries["plain_transformer"][seed]
        assert entries["rtal_finetuned"][seed]["init_from"] == {
            "arm": "plain_transformer", "seed": seed, "steps": 3, "validation_bleu": start["validation"]["bleu"],
            "test_bleu": start["test"]["bleu"], "run_dir": str(start_dir)}
    assert entries["plain_transformer"][1]["test"]["bleu"] != entries["plain_transformer"][2]["test"]["bleu"]


def test_a_fine_tuning_run_from_another_start_than_its_entry_is_written_beside_it(tmp_path, monkeypatch):
    """`plain_transformer_continued --run_only` where the ledger's entry of the seed fine-tuned another plain run
    (trained on another machine): the entry stays, the run lands in its rerun file, and a second call writes
    nothing."""
    monkeypatch.setattr(bench, "run_translation", finished_run_stand_in([], monkeypatch))
    output_dir, ledger_dir = tmp_path / "runs", tmp_path / "ledger"
    elsewhere = fake_entry("plain_transformer_continued", 1, 11.0, WRONG, baseline=None,
                           init_from=start_record(34.09, seed=1))
    entry_path = ledger.ledger_path(ledger_dir, "plain_transformer_continued", 1)
    ledger.write_entry(entry_path, elsewhere)
    before = entry_path.read_text()
    argv = ["--models", "plain_transformer_continued", "--run_only", "--seeds", "1", "--max_steps_per_model", "3",
            "--output_dir", str(output_dir), "--ledger_dir", str(ledger_dir), "--tokenizer_dir", str(TOKENIZER_DIR),
            "--data_dir", str(tiny_corpus(tmp_path))]
    bench.main(argv)
    assert entry_path.read_text() == before
    start = bench.starting_run(bench.parse_args(argv), "plain_transformer_continued", 1)
    rerun = ledger.read_reruns(ledger_dir)["plain_transformer_continued"][1]
    assert [entry["init_from"] for entry in rerun] == [start]
    assert (ledger_dir / "plain_transformer_continued" / f"seed_1_from_{ledger.start_tag(start)}.json").is_file()
    bench.main(argv)
    assert sorted(p.name for p in (ledger_dir / "plain_transformer_continued").iterdir()) == [
        "seed_1.json", f"seed_1_from_{ledger.start_tag(start)}.json"]


def test_run_translation_reads_a_checkpoint_as_another_family(tmp_path):
    """The mechanism of the fine-tuning arms: run_translation.py --model_name_or_path <plain run> --model_type
    deep_representations loads every backbone weight of the checkpoint, adds fresh AGG nodes, applies the overrides
    and logs each stack's D and the memory's spread (learning rate 0: the weights stay the checkpoint's)."""
    from hf_layerfusion import (
        DeepRepresentationsForConditionalGeneration,
        PlainTransformerConfig,
        PlainTransformerForConditionalGeneration,
    )
    from hf_layerfusion.training.data import builtin_number_corpus
    from hf_layerfusion.training.tokenization import train_joint_tokenizer

    corpus = builtin_number_corpus("de", "en", 20, 4, 4)
    texts = [pair[lang] for pair in corpus["train"]["translation"] for lang in ("de", "en")]
    tokenizer = train_joint_tokenizer(texts, 60)
    plain = PlainTransformerForConditionalGeneration(PlainTransformerConfig(
        vocab_size=len(tokenizer), d_model=16, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.eos_token_id,
    ))
    plain.save_pretrained(tmp_path / "plain")
    tokenizer.save_pretrained(tmp_path / "plain")
    bench.run_translation([
        "--builtin_corpus", "--builtin_num_train=20", "--builtin_num_valid=4", "--builtin_num_test=4",
        "--source_lang=de", "--target_lang=en", f"--model_name_or_path={tmp_path / 'plain'}",
        "--model_type=deep_representations",
        "--config_overrides=encoder_aggregation=hierarchical,decoder_aggregation=hierarchical,diversity_weight=1.0",
        f"--output_dir={tmp_path / 'deep'}", "--do_train", "--max_steps=2", "--learning_rate=0", "--logging_steps=1",
        "--per_device_train_batch_size=4", "--use_cpu=True", "--report_to=none", "--save_strategy=no",
        "--disable_tqdm=True", "--log_fusion_weights=False",
    ])
    model = DeepRepresentationsForConditionalGeneration.from_pretrained(tmp_path / "deep")
    assert (model.config.encoder_aggregation, model.config.diversity_weight) == ("hierarchical", 1.0)
    for name, value in plain.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    assert any(".connection.nodes." in name for name in model.state_dict())
    history = json.loads((tmp_path / "deep" / "trainer_state.json").read_text())["log_history"]
    logged = [entry for entry in history if "loss" in entry]
    assert len(logged) == 2
    for key in ("layer_diversity", "encoder_layer_diversity", "decoder_layer_diversity", "memory_spread"):
        assert all(0 < entry[key] <= 1 for entry in logged), key


def test_every_registered_family_has_an_arm():
    """The arms' families come from the registry: a family without an arm of its own gets one with its defaults."""
    assert {arm.model_type for arm in bench.MODELS.values()} == set(hf_layerfusion.FAMILIES)


# --- issue 38: val verdicts, the new arms and the queue's order; issue 40: unreadable result files ---------------


def test_val_verdict_beside_the_test_verdict_and_a_win_needs_both(tmp_path):
    """Entries written since issue 38 hold their val translations: val is tested like test (paired bootstrap per
    seed, the majority rule), and the conclusion calls an arm a win only where both sets say so."""
    for seed in (1, 2):
        ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer", seed), fake_entry(
            "plain_transformer", seed, 10.0 + seed, WRONG, baseline=None, val_hypotheses=WRONG))
        # better on test and val
        ledger.write_entry(ledger.ledger_path(tmp_path, "gtrans", seed), fake_entry(
            "gtrans", seed, 40.0, REFERENCES, val_hypotheses=REFERENCES))
        # better on test, its baseline's translations (and BLEU) on val
        rtal = fake_entry("rtal", seed, 40.0, REFERENCES, val_hypotheses=WRONG)
        rtal["validation"]["bleu"] = 11.0 + seed
        ledger.write_entry(ledger.ledger_path(tmp_path, "rtal", seed), rtal)
    text = ledger.report(tmp_path, BOTH, bench.paired_bootstrap, {}, [])
    rows = {line.split(" | ")[0].strip("| `"): line.split(" | ") for line in text.splitlines() if line.startswith("| `")}
    assert rows["gtrans"][8:13] == ["0.001 / 0.001", "wins", "+28.50 ± 0.71", "0.001 / 0.001", "wins |"]
    assert rows["rtal"][9] == "wins" and rows["rtal"][12] == "ties |"
    assert ("`gtrans` against `plain_transformer` wins on test (Δ +28.50 ± 0.71 BLEU over 2 seeds, p 0.001, 0.001) "
            "and wins on val (Δ +28.50 ± 0.71, p 0.001, 0.001)") in text
    assert "`rtal` against `plain_transformer` wins on test (Δ +28.50 ± 0.71 BLEU over 2 seeds" in text
    assert "0.001, 0.001) but ties on val (Δ +0.00 ± 0.00, p 1.000, 1.000)" in text  # the same val translations
    with pytest.raises(ValueError, match="other val references"):
        ledger.report(tmp_path, {**BOTH, "validation": WRONG}, bench.paired_bootstrap, {}, [])


def test_val_and_test_verdicts_together_say_which_way_they_differ():
    def comparison(test_p, val_p, deltas=(1.0, 1.0, 1.0)):
        return ledger.Comparison(seeds=[1, 2, 3], test_deltas=list(deltas), val_deltas=list(deltas),
                                 p_values=test_p, val_p_values=val_p)

    test = "on test (Δ +1.00 ± 0.00 BLEU over 3 seeds, p 0.010, 0.010, 0.010)"
    assert comparison([0.01] * 3, [0.01] * 3).summary() == (
        f"wins {test} and wins on val (Δ +1.00 ± 0.00, p 0.010, 0.010, 0.010)")
    assert comparison([0.5] * 3, [0.01] * 3).summary().startswith("ties on test (Δ +1.00 ± 0.00 BLEU over 3 seeds, "
                                                                  "p 0.500, 0.500, 0.500) but wins on val")
    # a seed without val translations counts as no significant difference: one tested seed is no majority
    assert comparison([0.01] * 3, [0.01, None, None]).summary() == (
        f"wins {test} but ties on val (Δ +1.00 ± 0.00, p 0.010, tested on seed 1 of 3)")
    assert comparison([0.01] * 3, [0.01, 0.01, None]).summary() == (
        f"wins {test} and wins on val (Δ +1.00 ± 0.00, p 0.010, 0.010, tested on seeds 1, 2 of 3)")
    one_tested_win = ledger.Comparison(seeds=[1, 2, 3, 4], test_deltas=[-1.0] * 4, val_deltas=[-1.5, -1.0, -1.2, 2.0],
                                       p_values=[0.5] * 4, val_p_values=[None, None, None, 0.001])
    assert one_tested_win.val_verdict() == "ties"
    assert comparison([0.01] * 3, [None] * 3).summary() == (
        f"wins {test}, untested on val (Δ +1.00 ± 0.00; the ledger holds no val translations of seeds 1, 2, 3): "
        "not a win yet")
    losing = comparison([0.01] * 3, [0.5] * 3, deltas=(-1.0, -1.0, -1.0))
    assert (losing.verdict(), losing.val_verdict()) == ("loses", "ties")
    assert " but ties on val " in losing.summary()


def test_a_verdict_sentence_says_which_seeds_mixed_gpu_and_cpu_or_starting_runs():
    """The conclusions and the depth answers stand apart from the main table and its marks: the sentence itself says
    which seeds' arm and baseline trained on different hardware (†) or from different starting runs (‡)."""
    def comparison(**marks):
        return ledger.Comparison(seeds=[1, 2, 3], test_deltas=[1.0] * 3, val_deltas=[1.0] * 3, p_values=[0.01] * 3,
                                 val_p_values=[0.01] * 3, **marks)

    plain = comparison().summary()
    assert plain.endswith("p 0.010, 0.010, 0.010)")
    assert comparison(cross_hardware_seeds=[2, 3]).summary() == (
        plain + " (seeds 2, 3 with the arm and its baseline trained on different hardware, one on a GPU and the "
        "other on a CPU †)")
    assert comparison(cross_hardware_seeds=[3], other_start_seeds=[1]).summary() == (
        plain + " (seed 3 with the arm and its baseline trained on different hardware, one on a GPU and the other "
        "on a CPU †; seed 1 from another starting run than the baseline's ‡)")
    untested = ledger.Comparison(seeds=[1], test_deltas=[1.0], val_deltas=[1.0], p_values=[0.5], val_p_values=[None],
                                 cross_hardware_seeds=[1])
    assert untested.summary().endswith("of seed 1) (seed 1 with the arm and its baseline trained on different "
                                       "hardware, one on a GPU and the other on a CPU †)")


def test_conclusions_answer_each_setting_of_a_family(tmp_path):
    """From scratch, added to a trained model, deep post-norm: each family's line, in that order."""
    for seed in (1,):
        for arm, baseline, extra in (("plain_transformer", None, {}),
                                     ("plain_transformer_continued", None, {"init_from": {"steps": 2000}}),
                                     ("plain_transformer_24x18_2000steps", None, {"show_loss_curve": True}),
                                     ("gtrans_24x18_2000steps", "plain_transformer_24x18_2000steps",
                                      {"show_loss_curve": True}),
                                     ("gtrans_finetuned", "plain_transformer_continued", {"init_from": {"steps": 2000}}),
                                     ("gtrans", "plain_transformer", {})):
            ledger.write_entry(ledger.ledger_path(tmp_path, arm, seed),
                               fake_entry(arm, seed, 30.0, REFERENCES, baseline=baseline, **extra))
    text = ledger.report(tmp_path, BOTH, bench.paired_bootstrap, {}, [])
    line = next(line for line in text.splitlines() if line.startswith("- **gtrans**"))
    assert line.index("*from scratch*: `gtrans` ") < line.index("*added to a trained model*: `gtrans_finetuned` ") < (
        line.index("*deep post-norm, from scratch*: `gtrans_24x18_2000steps` "))


def test_fine_tuning_arms_of_every_family_load_a_plain_checkpoint(tmp_path):
    """Issue 38: GTrans, RTAL (post-norm, like the checkpoint) and layer-wise coordination (the layout a plain
    checkpoint fits) added to a trained plain model through the class-based path of the fine-tuning arms: every plain
    weight loads unchanged, only the family's own weights start fresh. The paper's layer-wise coordination (shared
    layers, mixed attention) cannot hold a plain checkpoint: loading one is refused."""
    from transformers import AutoModelForSeq2SeqLM

    arms = ("gtrans_finetuned", "rtal_finetuned", "layerwise_coordination_finetuned")
    assert {name: (bench.MODELS[name].init_from, bench.MODELS[name].baseline) for name in arms} == {
        name: ("plain_transformer", "plain_transformer_continued") for name in arms}
    assert tuple(study.queue.FINE_TUNING_ARMS) == arms
    rtal = arm_config("rtal_finetuned")
    assert (rtal.aggregation_function, rtal.tree_residual, rtal.normalize_before) == ("ewp_ffn", "children", False)
    gtrans = arm_config("gtrans_finetuned")
    assert (gtrans.encoder_group_size, gtrans.decoder_group_size, gtrans.normalize_before) == (3, 2, False)
    layerwise = arm_config("layerwise_coordination_finetuned")
    assert (layerwise.share_layer_parameters, layerwise.mixed_attention, layerwise.layerwise_memory) == (
        False, False, True)

    tiny = dict(vocab_size=50, d_model=16, encoder_layers=6, decoder_layers=6, encoder_attention_heads=2,
                decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32, max_position_embeddings=32,
                decoder_start_token_id=2)
    plain = hf_layerfusion.PlainTransformerForConditionalGeneration(hf_layerfusion.PlainTransformerConfig(**tiny))
    plain.save_pretrained(tmp_path)
    fresh = {"gtrans_finetuned": ".readout.", "rtal_finetuned": ".readout.functions.",
             "layerwise_coordination_finetuned": ".language_embedding."}
    for name in arms:
        arm = bench.MODELS[name]
        config = CONFIG_MAPPING[arm.model_type].from_dict({**plain.config.to_diff_dict(), **arm.config})
        model, info = AutoModelForSeq2SeqLM.from_pretrained(tmp_path, config=config, output_loading_info=True)
        for key, value in plain.state_dict().items():
            assert torch.equal(model.state_dict()[key], value), (name, key)
        assert info["missing_keys"] and all(fresh[name] in key for key in info["missing_keys"]), name
        assert not info["unexpected_keys"], name
    paper_layout = CONFIG_MAPPING["layerwise_coordination"].from_dict(plain.config.to_diff_dict())
    with pytest.raises(Exception, match="encoder_attn"):
        AutoModelForSeq2SeqLM.from_pretrained(tmp_path, config=paper_layout)


def test_long_depth_arms_keep_the_1000_step_ledger_apart():
    assert study.queue.LONG_DEPTH_SUFFIX == bench.LONG_DEPTH_SUFFIX
    for encoder, decoder in study.queue.DEEP_SHAPES:
        plain, gtrans = (f"{family}_{encoder}x{decoder}{bench.LONG_DEPTH_SUFFIX}"
                         for family in ("plain_transformer", "gtrans"))
        assert bench.MODELS[gtrans].baseline == plain and bench.MODELS[plain].show_loss_curve
        assert bench.MODELS[gtrans].config == bench.MODELS[f"gtrans_{encoder}x{decoder}"].config
    long_runs = [run for run in study.queue.study_queue() if isinstance(run, study.queue.StudyRun)
                 and run.arm.endswith(study.queue.LONG_DEPTH_SUFFIX)]
    assert {(run.max_steps, run.warmup_steps) for run in long_runs} == {(2000, 400)}


def test_the_queue_puts_issue_38_in_order_of_value(tmp_path):
    """Issue 38 item 5: 24 + 18 with 3 seeds first, then seed 1 of every family's fine-tuning arm, then the seeds
    4-5 of deep representations' recipe (and the runs it needs) and the many-to-many pair, then the rest, 18 + 12
    last (an empty ledger: no baseline reruns, whose place `test_the_study_queues_a_baseline_rerun...` checks)."""
    queue = study.queue.study_queue(ledger_dir=tmp_path)
    first = next(i for i, run in enumerate(queue) if isinstance(run, study.queue.ArmRun)
                 and run.arm.endswith(study.queue.LONG_DEPTH_SUFFIX))
    assert all(isinstance(run, (study.queue.StudyRun, study.queue.DepthProbe)) and
               (not isinstance(run, study.queue.StudyRun) or run.seed <= 3) for run in queue[:first])
    long = study.queue.LONG_DEPTH_SUFFIX
    expected = [(f"{family}_24x18{long}", seed) for seed in (1, 2, 3) for family in ("plain_transformer", "gtrans")]
    expected += [(arm, 1) for arm in study.queue.FINE_TUNING_ARMS]
    expected += [(arm, seed) for seed in (4, 5)
                 for arm in ("plain_transformer", "plain_transformer_continued", "deep_representations_paper")]
    expected += [(arm, seed) for seed in (1, 2, 3) for arm in ("plain_transformer_m2m", "gtrans_m2m")]
    expected += [(arm, seed) for seed in (2, 3) for arm in study.queue.FINE_TUNING_ARMS]
    expected += [(f"{family}_12x12{long}", seed) for seed in (1, 2, 3) for family in ("plain_transformer", "gtrans")]
    expected += [(arm, seed) for seed in (1, 2) for arm in ("plain_transformer_12x6", "gtrans_12x6")]
    expected += [(f"{family}_18x12{long}", 1) for family in ("plain_transformer", "gtrans")]
    expected += [(arm, seed) for seed in (4, 5) for arm in study.queue.FROM_SCRATCH_ARMS]  # priority 8
    # priority 9, after the rest
    expected += [(run.arm, run.seed) for run in study.queue.converged_and_deep_baselines()]
    assert [(run.arm, run.seed) for run in queue[first:]] == expected
    listed = subprocess_list()
    assert listed.index("`plain_transformer_24x18_2000steps` seed 1") < listed.index("`gtrans_finetuned` seed 1") < (
        listed.index("`deep_representations_paper` seed 4")) < listed.index("`gtrans_18x12_2000steps` seed 1")


def test_every_fusion_family_gets_from_scratch_seeds_with_val_translations(tmp_path):
    """Priority 8: each fusion family has a from-scratch arm (no `init_from`, at the 6 + 6 budget) with seeds 4-5
    queued, and so does the baseline of each such arm, so that every family's from-scratch verdict gets a val side."""
    import hf_layerfusion

    queue = {(run.arm, run.seed) for run in study.queue.study_queue(ledger_dir=tmp_path)
             if isinstance(run, study.queue.StudyRun)}
    fusion_families = set(hf_layerfusion.FAMILIES) - {"plain_transformer"}
    covered = {bench.MODELS[arm].model_type for arm in study.queue.FROM_SCRATCH_ARMS}
    assert fusion_families <= covered
    for arm in study.queue.FROM_SCRATCH_ARMS:
        assert bench.MODELS[arm].init_from is None and not bench.MODELS[arm].show_loss_curve, arm
        for seed in (4, 5):
            assert (arm, seed) in queue
            baseline = bench.MODELS[arm].baseline
            assert baseline is None or (baseline, seed) in queue, (arm, baseline)


def subprocess_list(*extra) -> str:
    import subprocess

    return subprocess.run([sys.executable, "-m", "study", "--list", *extra], capture_output=True, text=True,
                          check=True, cwd=REPO_ROOT).stdout


def test_long_depth_runs_are_timed_from_the_same_models_shorter_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(study.queue, "WORK_DIR", tmp_path / "work")
    ledger_dir = tmp_path / "ledger"
    ledger.write_entry(ledger.ledger_path(ledger_dir, "gtrans_24x18", 1), fake_entry(
        "gtrans_24x18", 1, 30.0, REFERENCES, steps=1000, train_minutes=60.0, evaluation_minutes=5.0))
    args = study.queue.parse_args(["--ledger_dir", str(ledger_dir)])
    minutes, source = study.queue.expected_minutes(study.queue.StudyRun("gtrans_24x18_2000steps", 1, 2000, 400), args,
                                                   ledger.CpuKind("Some CPU", "AVX2"))
    assert minutes == 125.0 and "`gtrans_24x18`" in source and "scaled to 2000 steps" in source


def test_depth_runs_read_the_study_runs_not_the_probe_rule(tmp_path):
    ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer", 1),
                       fake_entry("plain_transformer", 1, 35.0, REFERENCES, baseline=None))
    ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer_24x18_2000steps", 1), fake_entry(
        "plain_transformer_24x18_2000steps", 1, 2.0, WRONG, baseline=None, show_loss_curve=True))
    lines = bench.depth_runs(ledger.read_ledger(tmp_path))
    assert "The study runs decide, not the probe's 600-step rule" in lines[0] and "test BLEU 35.00." in lines[0]
    assert lines[2:] == ["- 24 + 18, `plain_transformer_24x18_2000steps` (2,000 steps, 1 seed(s)): test BLEU 2.00, "
                         "training loss 7.50 at its last log"]
    assert bench.depth_runs({})[2:] == ["- No deep post-norm study run has finished yet."]


def edited_entry_text(edit) -> str:
    """The JSON text of a `re_transformer_2` seed 1 entry after `edit(entry)`; an infinite value is written as
    1e400, a number JSON reads as inf."""
    entry = {"ledger_version": ledger.LEDGER_VERSION, **fake_entry("re_transformer_2", 1, 30.0, REFERENCES)}
    edit(entry)
    return json.dumps(entry).replace("Infinity", "1e400")


@pytest.mark.parametrize("content, problem", [
    ('{"arm": "gtrans", "seed": 1', "cannot be read as JSON"),  # cut short
    ("[1, 2]", "holds a JSON list, not an object"),
    # a key the report reads is missing (issue 40: KeyError: 'test')
    (lambda entry: entry["test"].pop("hypotheses"), "lacks 'test.hypotheses'"),
    # values no run produces (issue 73: published into the README, or a crash naming no file, and counted as done)
    (lambda entry: entry["test"].update(bleu=-5), "field 'test.bleu' is -5, not a BLEU score"),
    (lambda entry: entry["validation"].update(bleu=340), "field 'validation.bleu' is 340, not a BLEU score"),
    (lambda entry: entry["test"].update(bleu=float("nan")), "field 'test.bleu' is nan, not a BLEU score"),
    (lambda entry: entry["test"].update(bleu=float("inf")), "field 'test.bleu' is inf, not a BLEU score"),
    (lambda entry: entry["test"].update(bleu="34.5"), "field 'test.bleu' is '34.5', not a BLEU score"),
    (lambda entry: entry.update(seed="1"), "field 'seed' is '1' (str), not a whole number"),
    (lambda entry: entry.update(evaluation_minutes=-17.8), "field 'evaluation_minutes' is -17.8, not a time"),
    (lambda entry: entry.update(train_minutes=float("nan")), "field 'train_minutes' is nan, not a time"),
    (lambda entry: entry.update(init_from={"arm": "plain_transformer", "seed": 1, "steps": 2000,
                                           "validation_bleu": 36.0, "test_bleu": 340.0}),
     "field 'init_from.test_bleu' is 340.0, not a BLEU score"),
    (lambda entry: entry["test"]["hypotheses"].pop(),
     "field 'test.hypotheses' holds 59 translations, but 'test.sentences' is 60"),
], ids=["cut-short", "list", "key-missing", "bleu-negative", "bleu-340", "bleu-nan", "bleu-1e400", "bleu-string",
        "seed-string", "evaluation-minutes-negative", "train-minutes-nan", "start-bleu-340", "hypotheses-truncated"])
def test_an_unreadable_ledger_file_is_named_by_list_and_report_and_rerun(tmp_path, capsys, content, problem):
    ledger_dir = tmp_path / "ledger"
    path = ledger.ledger_path(ledger_dir, "re_transformer_2", 1)
    path.parent.mkdir(parents=True)
    path.write_text(content if isinstance(content, str) else edited_entry_text(content))
    with pytest.raises(ledger.UnreadableResult, match=re.escape(problem)) as error:
        ledger.read_ledger(ledger_dir)
    assert str(path) in str(error.value) and "the rerun replaces it" in str(error.value)
    with pytest.raises(SystemExit, match=str(path)):
        bench.main(["--report", "--ledger_dir", str(ledger_dir), "--data_dir", str(tiny_corpus(tmp_path))])
    run = study.queue.StudyRun("re_transformer_2", 1)
    assert study.queue.result_state(run, ledger_dir)[0] == "unreadable" and run in study.queue.pending_runs(ledger_dir)
    study.queue.main(["--list", "--ledger_dir", str(ledger_dir)])
    listed = capsys.readouterr().out
    assert " BAD  `re_transformer_2` seed 1 " in listed and f"unreadable result {path}: {problem}" in listed
    # the rerun replaces it; a readable entry is never replaced
    ledger.write_entry(path, fake_entry("re_transformer_2", 1, 30.0, REFERENCES))
    assert "replacing the unreadable" in capsys.readouterr().out
    assert study.queue.result_state(run, ledger_dir) == ("done", None)
    assert run not in study.queue.pending_runs(ledger_dir)
    with pytest.raises(FileExistsError):
        ledger.write_entry(path, fake_entry("re_transformer_2", 1, 31.0, REFERENCES))


def test_values_no_run_produces_are_never_written_and_name_their_many_to_many_field(tmp_path):
    """Issue 73: `write_entry` refuses what `read_entry` would (before writing anything), and a many-to-many entry's
    scores are checked per direction."""
    path = ledger.ledger_path(tmp_path / "ledger", "gtrans", 1)
    with pytest.raises(ValueError, match=r"seed_1\.json not written: field 'validation\.bleu' is 346\.0"):
        ledger.write_entry(path, fake_entry("gtrans", 1, 345.0, REFERENCES))
    assert not (tmp_path / "ledger").exists()
    m2m = {"ledger_version": ledger.LEDGER_VERSION, "arm": "gtrans_m2m", "seed": 1, "signature": "sig",
           "train_sizes": {}, "starting_model": {},
           "directions": {"en-de": {"bleu": 340.0, "sentences": 60, "hypotheses": REFERENCES}}}
    m2m_path = ledger.ledger_path(tmp_path / "m2m", "gtrans_m2m", 1)
    m2m_path.parent.mkdir(parents=True)
    m2m_path.write_text(json.dumps(m2m))
    assert ledger.entry_problem(m2m_path, ledger.MANY_TO_MANY_REQUIRED_KEYS) == (
        "field 'directions.en-de.bleu' is 340.0, not a BLEU score (a finite number in [0, 100])")


def test_unreadable_probe_and_many_to_many_results_are_named(tmp_path):
    probe_dir, ledger_dir = tmp_path / "probes", tmp_path / "ledger"
    probe_result(probe_dir, (6, 6), 1.0, 4.0)
    bad_probe = study.queue.depth_probes.result_file(probe_dir, "plain_transformer", (12, 12), 1)
    bad_probe.write_text('{"encoder_layers": 12')
    with pytest.raises(ledger.UnreadableResult, match="cannot be read as JSON") as error:
        study.queue.depth_probes.read_results(probe_dir)
    assert str(bad_probe) in str(error.value)
    assert study.queue.result_state(study.queue.DepthProbe(12, 12), ledger_dir, probe_dir)[0] == "unreadable"
    assert study.queue.result_state(study.queue.DepthProbe(6, 6), ledger_dir, probe_dir) == ("done", None)
    m2m = study.queue.ManyToManyRun("gtrans_m2m", 1)
    m2m.result_file(ledger_dir).parent.mkdir(parents=True)
    m2m.result_file(ledger_dir).write_text(json.dumps({"ledger_version": ledger.LEDGER_VERSION, "arm": "gtrans_m2m",
                                                       "seed": 1}))
    state, problem = study.queue.result_state(m2m, ledger_dir)
    assert state == "unreadable" and "'directions'" in problem


@pytest.mark.parametrize("arm, computes_table", [
    ("gtrans", True), ("gtrans_12x12_2000steps", True), ("gtrans_24x18_2000steps", False),
    ("plain_transformer_24x18_2000steps", False),
])
def test_table_vi_is_computed_for_gtrans_arms_of_at_most_six_decoder_groups(tmp_path, monkeypatch, arm,
                                                                               computes_table):
    """24 + 18's 9 decoder groups would take 17 beam passes over test before its ledger entry is written."""
    tables = []
    monkeypatch.setattr(bench, "decoder_group_table", lambda model_dir, pairs: tables.append(model_dir) or [{"k": 1}])
    monkeypatch.setattr(bench, "ledger_entry", lambda args, arm_name, seed, results, tokenizer_dir, references,
                        table_vi: fake_entry(arm_name, seed, 30.0, REFERENCES, gtrans_decoder_groups=table_vi))
    args = bench.parse_args(["--output_dir", str(tmp_path / "runs"), "--ledger_dir", str(tmp_path / "ledger")])
    path = bench.record_in_ledger(args, arm, 1, {}, tmp_path / "tokenizer", {}, [])
    assert len(tables) == int(computes_table)
    assert (json.loads(path.read_text())["gtrans_decoder_groups"] is not None) == computes_table
