"""`python -m study.report`: the committed generated texts (study/README.md's full tables, README.md's summary,
docs/results.md) are what the committed results give; the summary's verdicts and speeds come from the ledger and
the results files; `--check` fails on a stale text and the command rewrites exactly the generated parts."""

import json
import os
import re
import subprocess

import pytest
from helpers import require_shared
from test_bench_multi30k import BOTH, HALF_RIGHT, MULTI30K, REFERENCES, WRONG, fake_entry, ledger
from test_study_converged import converged_entry
from test_inference_workload_report import processes_file

from study import report


def test_the_committed_generated_texts_are_what_the_committed_results_give():
    require_shared(MULTI30K, "Multi30k data")
    files = report.generated_files(ledger.DEFAULT_LEDGER, report.inference.DEFAULT_RESULTS, MULTI30K)
    stale = report.stale_files(files)
    assert stale == [], f"not what the committed results generate: {stale}; run `python -m study.report`"


def test_the_summary_gives_each_familys_verdict_at_2000_steps_and_converged(tmp_path):
    for seed in (1, 2):
        ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer", seed),
                           fake_entry("plain_transformer", seed, 10.0 + seed, WRONG, baseline=None))
        ledger.write_entry(ledger.ledger_path(tmp_path, "gtrans", seed), fake_entry("gtrans", seed, 40.0, REFERENCES))
    ledger.write_entry(ledger.ledger_path(tmp_path, "gtrans_converged", 1),
                       fake_entry("gtrans_converged", 1, 40.0, REFERENCES, baseline="plain_transformer_converged"))
    rows = {line.split(" | ")[0].strip("| "): line for line in report.quality_summary(tmp_path, BOTH)[2:]}
    assert list(rows) == ["gtrans", "layerwise_coordination", "rtal", "re_transformer", "deep_representations"]
    assert rows["gtrans"] == ("| gtrans | `gtrans` against `plain_transformer` | wins / untested (test Δ +28.50 "
                              "± 0.71, 2 seeds) | `plain_transformer_converged` not run yet "
                              "| `plain_transformer_converged` not run yet |")
    assert rows["rtal"].endswith("| `rtal_paper` against `plain_transformer_prenorm` | not run yet | not run yet "
                                 "| not run yet |")
    # trained to convergence: the val-best checkpoints tie (the same translations), the averages of the last
    # checkpoints do not (the baseline's translates half the sentences)
    ledger.ledger_path(tmp_path, "gtrans_converged", 1).unlink()
    ledger.write_entry(ledger.ledger_path(tmp_path, "gtrans_converged", 1),
                       converged_entry("gtrans_converged", 1, 35.0, REFERENCES, averaged_bleu=36.0))
    ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer_converged", 1), converged_entry(
        "plain_transformer_converged", 1, 35.0, REFERENCES, baseline=None, averaged_bleu=30.0,
        averaged_hypotheses=HALF_RIGHT))
    rows = {line.split(" | ")[0].strip("| "): line for line in report.quality_summary(tmp_path, BOTH)[2:]}
    assert rows["gtrans"].split(" | ")[3:] == ["ties / ties (test Δ +0.00, 1 seed)",
                                               "wins / wins (test Δ +6.00, 1 seed) |"]

    # the summary has no legend for the results page's marks: seeds that mixed GPU and CPU are said in words
    gpu = {"cpu": "Some CPU", "gpu": "Some GPU", "torch_threads": 1}
    ledger.write_entry(ledger.ledger_path(tmp_path, "layerwise_coordination_14", 2),
                       fake_entry("layerwise_coordination_14", 2, 40.0, REFERENCES, device=gpu))
    ledger.write_entry(ledger.ledger_path(tmp_path, "layerwise_coordination_14", 1),
                       fake_entry("layerwise_coordination_14", 1, 40.0, REFERENCES))
    rows = {line.split(" | ")[0].strip("| "): line for line in report.quality_summary(tmp_path, BOTH)[2:]}
    assert rows["layerwise_coordination"].split(" | ")[2] == (
        "wins / untested (test Δ +28.50 ± 0.71, 2 seeds; 1 with the arm and its baseline trained on different "
        "hardware, GPU and CPU)")
    # and seeds whose arm and baseline fine-tuned different runs of their starting arm (the results page's ‡)

    def start(test_bleu):
        return {"arm": "plain_transformer", "seed": 1, "steps": 2000, "validation_bleu": 36.0, "test_bleu": test_bleu}

    for seed, arm_start in ((1, 34.09), (2, 35.16)):
        ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer_continued", seed), fake_entry(
            "plain_transformer_continued", seed, 11.0, WRONG, baseline=None, init_from=start(34.09)))
        ledger.write_entry(ledger.ledger_path(tmp_path, "deep_representations_paper", seed), fake_entry(
            "deep_representations_paper", seed, 40.0, REFERENCES, baseline="plain_transformer_continued",
            init_from=start(arm_start)))
    rows = {line.split(" | ")[0].strip("| "): line for line in report.quality_summary(tmp_path, BOTH)[2:]}
    assert rows["deep_representations"].split(" | ")[2] == (
        "wins / untested (test Δ +29.00 ± 0.00, 2 seeds; 1 from another starting run than the baseline's)")


def test_the_summary_answers_the_depth_questions_or_names_the_runs_they_wait_for(tmp_path):
    def rows():
        return {line.split(" | ")[0].strip("| "): line.split(" | ", 1)[1]
                for line in report.depth_summary(tmp_path, BOTH)[2:]}

    assert rows() == {
        "GTrans against a 12 + 12 baseline that trains": ("– | no data yet: `plain_transformer_prenorm_12x12_2000steps`, "
                                                          "`plain_transformer_12x12_warmup4000` not run yet |"),
        "GTrans against a 24 + 18 baseline that trains": ("– | no data yet: `plain_transformer_prenorm_24x18_2000steps` "
                                                          "not run yet |"),
        "the best deep model against the best 6 + 6 one": ("– | no data yet: `plain_transformer_prenorm_12x12_2000steps`, "
                                                           "`plain_transformer_12x12_warmup4000`, "
                                                           "`plain_transformer_prenorm_24x18_2000steps` not run yet |"),
    }
    # the 6 + 6 plain model right on every sentence, GTrans 24 + 18 on half, the pre-norm 24 + 18 on none
    half_right = REFERENCES[:30] + WRONG[30:]
    for seed in (1, 2):
        ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer", seed),
                           fake_entry("plain_transformer", seed, 36.0, REFERENCES, baseline=None))
        ledger.write_entry(ledger.ledger_path(tmp_path, "gtrans_24x18_2000steps", seed),
                           fake_entry("gtrans_24x18_2000steps", seed, 30.0, half_right,
                                      baseline="plain_transformer_24x18_2000steps"))
    ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer_prenorm_24x18_2000steps", 1),
                       fake_entry("plain_transformer_prenorm_24x18_2000steps", 1, 20.0, WRONG, baseline=None))
    answers = rows()
    assert answers["GTrans against a 24 + 18 baseline that trains"] == (
        "`gtrans_24x18_2000steps` against `plain_transformer_prenorm_24x18_2000steps` | wins / untested (test Δ "
        "+10.00, 1 seed) |")
    assert answers["GTrans against a 12 + 12 baseline that trains"].startswith("– | no data yet")
    assert answers["the best deep model against the best 6 + 6 one"] == (
        "`gtrans_24x18_2000steps` against `plain_transformer` | loses / untested (test Δ -6.00 ± 0.00, 2 seeds) |")
    # the best 6 + 6 model on val trained to convergence, the best deep one for 2,000 steps: the row says so
    ledger.write_entry(ledger.ledger_path(tmp_path, "plain_transformer_converged", 1),
                       fake_entry("plain_transformer_converged", 1, 37.0, REFERENCES, baseline=None))
    assert rows()["the best deep model against the best 6 + 6 one"].startswith(
        "`gtrans_24x18_2000steps` against `plain_transformer_converged` (trained to different budgets: "
        "`gtrans_24x18_2000steps` 2,000 steps, `plain_transformer_converged` trained to convergence) | loses / ")


def test_the_summary_gives_the_fast_loops_speed_against_ctranslate2(tmp_path):
    assert report.speed_summary(tmp_path) == [
        "- No run of `python -m study.bench_workload_processes --results-dir` is committed yet."]
    (tmp_path / "processes_amd-epyc_def5678.json").write_text(json.dumps(processes_file()), encoding="utf-8")
    lines = report.speed_summary(tmp_path)  # CTranslate2's median seconds over the fast loop's (PROCESS_MEDIANS)
    # the model and the test BLEU of its fast float32 translations (PROCESS_BLEU: 33.0 greedy, 33.5 beam-4)
    assert lines[0] == ("- AMD EPYC (family 25, model 17), OMP_WAIT_POLICY=ACTIVE, 1,000 sentences, model `runs/plain` "
                        "(test BLEU 33.00 greedy / 33.50 beam-4) (`processes_amd-epyc_def5678.json`):")
    assert lines[1] == ("  - 1 thread: fast float32 1.35x greedy / 1.27x beam-4 CTranslate2 float32's speed; fast int8 "
                        "0.94x greedy / 1.27x beam-4 CTranslate2 int8's speed.")
    assert lines[2].startswith("  - 2 threads: fast float32 ")
    # PROCESS_MEDIANS: CTranslate2 int8 is slower at 2 threads than at 1 (8.8 s against 1.7 s greedy)
    assert lines[2].endswith(" CTranslate2 int8's speed. CTranslate2 int8 ran slower here than at 1 thread (below), "
                             "so the int8 ratios measure that slowdown on this machine as much as the fast loop.")
    # each engine's seconds at 1 thread over its seconds at 2
    seconds = {(row["engine"], row["threads"], row["num_beams"]): row["median_seconds"]
               for row in processes_file()["rows"]}
    gain = seconds["fast int8", 1, 4] / seconds["fast int8", 2, 4]
    assert lines[3].startswith("  - 2 threads against 1: fast float32 ") and "fast int8 " in lines[3]
    assert f"{gain:.2f}x beam-4; CTranslate2 int8 " in lines[3]
    assert len(lines) == 4
    # a run of batches side by side says so
    (tmp_path / "processes_amd-epyc_def5678.json").write_text(json.dumps({**processes_file(), "inter_threads": 2}),
                                                                 encoding="utf-8")
    assert ", OMP_WAIT_POLICY=ACTIVE, 2 batches side by side, 1,000 sentences, " in report.speed_summary(tmp_path)[0]


def with_greedy_bleu(record: dict, greedy_bleu: float) -> dict:
    """`record` whose fast float32 greedy translations scored `greedy_bleu` on test."""
    for row in record["rows"]:
        if row["engine"] == "fast float32" and row["num_beams"] == 1:
            row["bleu"] = greedy_bleu
    return record


@pytest.mark.parametrize("greedy_bleu, barely", [(33.0, False), (10.0, False), (9.99, True), (1.62, True)])
def test_the_summary_leaves_the_numbers_of_a_model_that_barely_translates_to_the_full_tables(
        tmp_path, greedy_bleu, barely):
    """A run on a model far from trained (the committed AMD runs at 58e7b19 translated with one of greedy BLEU 1.62)
    times real source sentences but not real translations: the summary names its setting, file and model in one item
    that says so, without its numbers."""
    (tmp_path / "processes_amd-epyc_def5678.json").write_text(
        json.dumps(with_greedy_bleu(processes_file(), greedy_bleu)), encoding="utf-8")
    lines = report.speed_summary(tmp_path)
    model = f"model `runs/plain` (test BLEU {greedy_bleu:.2f} greedy / 33.50 beam-4)"
    if barely:
        assert lines == [
            f"- Settings run only with {model}, which barely translates (greedy test BLEU below 10: the times of real "
            "source sentences, not of real translations); their numbers are in the full tables only: AMD EPYC (family "
            "25, model 17), "
            "OMP_WAIT_POLICY=ACTIVE (`processes_amd-epyc_def5678.json`)."]
    else:
        assert lines[0].endswith(f", 1,000 sentences, {model} (`processes_amd-epyc_def5678.json`):")
        assert len(lines) == 4 and "barely" not in "".join(lines)


def test_the_summary_flags_ratios_against_a_ctranslate2_that_more_threads_slowed(tmp_path):
    """On the Intel VM CTranslate2 ran slower at 2 threads than at 1 (0.12-0.61x): the fast loop's 2-thread ratios
    against it (up to 13x) say as much about that as about the fast loop, and the line says so, naming the engines."""
    record = processes_file()
    medians = {(row["engine"], row["threads"], row["num_beams"]): row["median_seconds"] for row in record["rows"]}

    def summary_at_two_threads(factors: dict) -> str:
        """The 2-thread line with each CTranslate2 engine's 2-thread seconds at `factors[engine, search]` times its
        1-thread seconds."""
        for row in record["rows"]:
            factor = factors.get((row["engine"], row["num_beams"]))
            if factor is not None and row["threads"] == 2:
                median = factor * medians[row["engine"], 1, row["num_beams"]]
                row["seconds"], row["median_seconds"] = [median, 1.3 * median, 0.95 * median], median
        (tmp_path / "processes_amd-epyc_def5678.json").write_text(json.dumps(record), encoding="utf-8")
        lines = report.speed_summary(tmp_path)
        assert lines[1].endswith("CTranslate2 int8's speed.")  # never a caveat at the first thread count
        return lines[2]

    faster = {(engine, beams): 0.8 for engine in ("CTranslate2 float32", "CTranslate2 int8") for beams in (1, 4)}
    assert summary_at_two_threads(faster).endswith(" CTranslate2 int8's speed.")
    assert summary_at_two_threads({**faster, ("CTranslate2 int8", 4): 1.01}).endswith(  # slower in one search
        " CTranslate2 int8's speed. CTranslate2 int8 ran slower here than at 1 thread (below), so the int8 ratios "
        "measure that slowdown on this machine as much as the fast loop.")
    assert summary_at_two_threads({("CTranslate2 float32", 1): 3.0}).endswith(
        " CTranslate2 float32 and int8 ran slower here than at 1 thread (below), so the float32 and int8 ratios "
        "measure that slowdown on this machine as much as the fast loop.")


def commits(repository, count: int) -> list[str]:
    """`count` commits made in a new repository at `repository`, a day apart, oldest first (short hashes)."""
    def git(*arguments, **environment):
        return subprocess.run(["git", "-C", str(repository), *arguments], check=True, capture_output=True, text=True,
                              env={**os.environ, **environment}).stdout.strip()
    git("init", "-q")
    made = []
    for day in range(count):
        date = f"2026-01-{day + 1:02d}T12:00:00"
        git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", f"day {day}",
            GIT_AUTHOR_DATE=date, GIT_COMMITTER_DATE=date)
        made.append(git("rev-parse", "--short=7", "HEAD"))
    return made


def test_the_summary_gives_the_latest_run_of_each_setting(tmp_path, monkeypatch):
    """Of runs of one CPU, wait policy and batches side by side, the summary gives the one of the latest commit (by
    the checkout's history; a commit it lacks counts as oldest); other settings keep theirs."""
    repository, results = tmp_path / "repository", tmp_path / "results"
    repository.mkdir()
    results.mkdir()
    older, newer, newest = commits(repository, 3)
    monkeypatch.setattr(report, "REPO_ROOT", repository)
    # the latest is neither the first file by name nor the last
    for name, revision in (("1", older), ("2", newer), ("3", "0000000")):
        (results / f"processes_amd-epyc_{name}.json").write_text(json.dumps(processes_file(revision)),
                                                                 encoding="utf-8")
    (results / "processes_amd-epyc-wait-passive_1.json").write_text(
        json.dumps({**processes_file(older), "omp_wait_policy": "PASSIVE"}), encoding="utf-8")
    runs = [line for line in report.speed_summary(results) if line.startswith("- ")]
    model = "model `runs/plain` (test BLEU 33.00 greedy / 33.50 beam-4)"
    assert runs == [
        ("- AMD EPYC (family 25, model 17), OMP_WAIT_POLICY=PASSIVE, 1,000 sentences, "
         f"{model} (`processes_amd-epyc-wait-passive_1.json`):"),
        f"- AMD EPYC (family 25, model 17), OMP_WAIT_POLICY=ACTIVE, 1,000 sentences, {model} (`processes_amd-epyc_2.json`):",
    ]
    # a later run with a model that barely translates does not replace the latest run with one that translates (the
    # committed AMD runs: 58e7b19's model scored 1.62, 6d18e71's 33.00)
    (results / "processes_amd-epyc_4.json").write_text(
        json.dumps(with_greedy_bleu(processes_file(newest), 1.62)), encoding="utf-8")
    runs = [line for line in report.speed_summary(results) if line.startswith("- ")]
    assert runs[1] == (f"- AMD EPYC (family 25, model 17), OMP_WAIT_POLICY=ACTIVE, 1,000 sentences, {model} "
                       "(`processes_amd-epyc_2.json`):")
    assert len(runs) == 2


def study_page(ledger_section: str, inference_section: str) -> str:
    """A study/README.md with its two generated blocks holding these sections, between text of its own."""
    ledger_block, inference_block = ledger.LEDGER_REPORT, report.inference.INFERENCE_REPORT
    return (f"# Study\n\n{ledger_block.start}\n{ledger_section}{ledger_block.end}\n\n"
            f"{inference_block.start}\n{inference_section}{inference_block.end}\n\nafter\n")


@pytest.fixture
def pages(tmp_path, monkeypatch):
    """The generated files as copies in `tmp_path`, generated from fixed sections (no ledger, no data)."""
    study_readme, main_readme, results_page = (tmp_path / "study_README.md", tmp_path / "README.md",
                                               tmp_path / "results.md")
    study_readme.write_text(study_page("old ledger\n", ""), encoding="utf-8")
    main_readme.write_text(f"# Title\n\n{report.SUMMARY.start}\nold\n{report.SUMMARY.end}\n\nrest\n", encoding="utf-8")
    for name, path in (("STUDY_README", study_readme), ("MAIN_README", main_readme), ("RESULTS_PAGE", results_page),
                       ("REPO_ROOT", tmp_path)):
        monkeypatch.setattr(report, name, path)
    monkeypatch.setattr(report.bench_multi30k, "report_text",
                        lambda ledger_dir, data_dir, plot_link: "LEDGER TABLES\n")
    monkeypatch.setattr(report.bench_multi30k, "report_references", lambda data_dir: BOTH)
    monkeypatch.setattr(report.inference, "render", lambda results_dir: "INFERENCE TABLES\n")
    monkeypatch.setattr(report, "summary_block", lambda ledger_dir, results_dir, references: "SUMMARY\n")
    # the family pages: each one's findings, between its markers, among the page's own text
    docs = tmp_path / "docs"
    docs.mkdir()
    findings = report.ledger.FAMILY_FINDINGS
    for model_type in report.hf_layerfusion.FAMILIES:
        (docs / f"{model_type}.md").write_text(f"# {model_type}\n\n{findings.start}\nold\n{findings.end}\n\nrest\n",
                                               encoding="utf-8")
    monkeypatch.setattr(report, "DOCS", docs)
    monkeypatch.setattr(report.ledger, "family_findings",
                        lambda ledger_dir, references, bootstrap, claims, family, extra: f"FINDINGS {family}\n")
    monkeypatch.setattr(report, "depth_summary", lambda ledger_dir, references: [])
    return study_readme, main_readme, results_page


def test_check_fails_on_stale_texts_and_the_report_rewrites_only_the_generated_parts(pages, tmp_path):
    study_readme, main_readme, results_page = pages
    arguments = ["--ledger_dir", str(tmp_path), "--results_dir", str(tmp_path)]
    with pytest.raises(SystemExit, match="study_README.md, README.md, results.md"):
        report.main([*arguments, "--check"])
    report.main(arguments)
    assert study_readme.read_text(encoding="utf-8") == study_page("LEDGER TABLES\n", "INFERENCE TABLES\n")
    summary = report.SUMMARY
    assert main_readme.read_text(encoding="utf-8") == f"# Title\n\n{summary.start}\nSUMMARY\n{summary.end}\n\nrest\n"
    page = results_page.read_text(encoding="utf-8")
    assert page.splitlines()[0] == report.RESULTS_PAGE_HEADER and "generated by `python -m study.report`" in page
    assert "LEDGER TABLES" in page and "INFERENCE TABLES" in page
    findings = report.ledger.FAMILY_FINDINGS
    for model_type in report.hf_layerfusion.FAMILIES:
        assert (tmp_path / "docs" / f"{model_type}.md").read_text(encoding="utf-8") == (
            f"# {model_type}\n\n{findings.start}\nFINDINGS {model_type}\n{findings.end}\n\nrest\n")
    report.main([*arguments, "--check"])  # up to date now


def test_every_image_the_generated_pages_show_lies_where_their_link_points():
    """The epoch curves' plot is drawn into study/results/ and linked from study/README.md and (through its copy in
    docs/images/, the only files the site serves) docs/results.md, each relative to its own page: a link from the
    repository root (as the ledger section first had it) shows nothing on either page and fails the site's strict
    build."""
    pages = [report.STUDY_README, report.MAIN_README, report.RESULTS_PAGE]
    for page in pages:
        for target in re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", page.read_text(encoding="utf-8")):
            assert (page.parent / target).is_file(), f"{page.name} shows {target}, which is not there"
    study_link, docs_link = report.plot_links(ledger.DEFAULT_LEDGER)
    assert (study_link, docs_link) == ("results/multi30k_epoch_curves.png", "images/multi30k_epoch_curves.png")


def test_results_name_paths_inside_the_repository_relative_to_it(tmp_path, monkeypatch):
    """A model or results dir inside the checkout is recorded and shown relative to it, whatever the checkout's
    absolute path or the working directory; one outside stays absolute."""
    from study.common import REPO_ROOT, display_path

    monkeypatch.chdir(tmp_path)
    assert display_path(REPO_ROOT / "runs" / "bench" / "model") == "runs/bench/model"
    assert display_path(REPO_ROOT / "runs" / ".." / "study" / "results") == "study/results"
    assert display_path(tmp_path / "model") == str((tmp_path / "model").resolve())
