"""study/bench_backbone.py without benchmarking: its memory subprocesses run a bounded number at a time, and a
ratio measured too few times gets no met / NOT met verdict."""

import json
import subprocess
import threading
import time
from types import SimpleNamespace

import pytest
from transformers import MarianConfig, MarianMTModel

from study import bench_backbone as bench


def test_git_revision_ignores_results_waiting_to_be_committed(monkeypatch, tmp_path):
    """A results file a benchmark wrote (untracked or changed under study/results) leaves the revision clean; a
    changed or new file anywhere else marks it "+uncommitted changes"."""
    def git(*arguments):
        subprocess.run(["git", *arguments], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "study" / "results").mkdir(parents=True)
    (tmp_path / "code.py").write_text("x = 1\n")
    (tmp_path / "study" / "results" / "old.json").write_text("{}")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "start")
    monkeypatch.setattr(bench, "REPO_ROOT", tmp_path)
    commit = bench.git_revision()
    assert len(commit) >= 7 and "+" not in commit
    (tmp_path / "study" / "results" / "new.json").write_text("{}")
    (tmp_path / "study" / "results" / "old.json").write_text("[]")
    assert bench.git_revision() == commit
    (tmp_path / "study" / "new_bench.py").write_text("")
    assert bench.git_revision() == commit + "+uncommitted changes"
    (tmp_path / "study" / "new_bench.py").unlink()
    (tmp_path / "code.py").write_text("x = 2\n")
    assert bench.git_revision() == commit + "+uncommitted changes"


def test_verdicts_need_three_samples():
    assert bench.target_verdict(1.2, ">=", 1.0, samples=3) == "met"
    assert bench.target_verdict(0.9, ">=", 1.0, samples=5) == "NOT met"
    assert bench.target_verdict(1.3, "<=", 1.25, samples=3) == "NOT met"
    # a --quick run: one sample, whichever side of the bound it falls
    for ratio in (0.5, 2.0):
        assert bench.target_verdict(ratio, ">=", 1.0, samples=1) == "not judged (1 sample(s): unreliable)"


@pytest.mark.parametrize("cpus, threads, expected", [(2, 2, 1), (16, 2, 8), (4, 1, 4), (1, 2, 1)])
def test_memory_workers_fill_the_cpus_and_no_more(monkeypatch, cpus, threads, expected):
    monkeypatch.setattr(bench, "available_cpus", lambda: cpus)
    assert bench.memory_workers_at_once(threads) == expected


@pytest.mark.parametrize("models_per_process, processes", [(1, 8), (3, 3)])
def test_memory_subprocesses_run_a_bounded_number_at_a_time(monkeypatch, models_per_process, processes):
    """Eight models, CPUs for two workers at a time: never more than two subprocesses at once, each measuring
    `--memory-models-per-process` models, every model's result under its own name."""
    monkeypatch.setattr(bench, "available_cpus", lambda: 4)
    running, most, calls = 0, 0, []
    lock = threading.Lock()

    def fake_worker(command, **kwargs):
        nonlocal running, most
        group = command[command.index("--worker-model") + 1 :]
        with lock:
            running += 1
            most = max(most, running)
            calls.append(group)
        time.sleep(0.05)
        with lock:
            running -= 1
        report = {"peak_increase_kib": {name: [len(name) * 1024] for name in group}}
        return subprocess.CompletedProcess(command, 0, json.dumps(report), "")

    monkeypatch.setattr(bench.subprocess, "run", fake_worker)
    marian = MarianMTModel(
        MarianConfig(vocab_size=16, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=1,
                     decoder_attention_heads=1, encoder_ffn_dim=8, decoder_ffn_dim=8, max_position_embeddings=8,
                     pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    )
    names = list(bench.MODELS)[:8]
    args = SimpleNamespace(threads=2, seed=0, memory_models_per_process=models_per_process)
    peaks = bench.measure_peak_memory(args, names, marian, [])
    assert most == 2 and len(calls) == processes and sorted(name for group in calls for name in group) == sorted(names)
    assert peaks == {name: [float(len(name))] for name in names}


def test_quick_measures_memory_in_as_few_processes_as_run_at_once(monkeypatch):
    monkeypatch.setattr(bench, "available_cpus", lambda: 2)
    assert bench.parse_args(["--quick"]).memory_models_per_process == len(bench.MODELS)  # one process
    assert bench.parse_args([]).memory_models_per_process == 1  # a full run: every model alone
