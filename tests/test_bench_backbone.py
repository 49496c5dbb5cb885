"""benchmarks/bench_backbone.py without benchmarking: its memory subprocesses run a bounded number at a time, and a
ratio measured too few times gets no met / NOT met verdict."""

import importlib.util
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from transformers import MarianConfig, MarianMTModel

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_backbone.py"
spec = importlib.util.spec_from_file_location("bench_backbone", BENCH)
bench = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = bench  # dataclasses look their module up there
spec.loader.exec_module(bench)


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


def test_memory_subprocesses_run_a_bounded_number_at_a_time(monkeypatch):
    """Eight models, CPUs for two workers at a time: never more than two subprocesses at once, every model's
    result under its own name."""
    monkeypatch.setattr(bench, "available_cpus", lambda: 4)
    running, most = 0, 0
    lock = threading.Lock()

    def fake_worker(command, **kwargs):
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1
        name = command[command.index("--worker-model") + 1]
        return subprocess.CompletedProcess(command, 0, json.dumps({"peak_increase_kib": [len(name) * 1024]}), "")

    monkeypatch.setattr(bench.subprocess, "run", fake_worker)
    marian = MarianMTModel(
        MarianConfig(vocab_size=16, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=1,
                     decoder_attention_heads=1, encoder_ffn_dim=8, decoder_ffn_dim=8, max_position_embeddings=8,
                     pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)
    )
    names = list(bench.MODELS)[:8]
    peaks = bench.measure_peak_memory(SimpleNamespace(threads=2, seed=0), names, marian, [])
    assert most == 2
    assert peaks == {name: [float(len(name))] for name in names}
