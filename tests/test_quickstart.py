"""examples/quickstart.py's own pieces, on tiny inputs (the script itself trains for minutes and is run by hand, see
README): translations marked right or wrong against their expected English, the phase clock, the training
arguments (compact logging on), and `--help`."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def quickstart():
    spec = importlib.util.spec_from_file_location("quickstart_under_test", REPO_ROOT / "examples" / "quickstart.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_translations_are_marked_right_only_when_they_are_the_expected_words(quickstart):
    assert quickstart.is_right("forty-two", "forty-two")
    assert quickstart.is_right("  three hundred  and one ", "three hundred and one")  # whitespace does not count
    assert not quickstart.is_right("forty-three", "forty-two")
    assert not quickstart.is_right("forty-two thousand", "forty-two")  # a prefix is not the answer
    assert not quickstart.is_right("Forty-two", "forty-two")
    assert not quickstart.is_right("", "forty-two")
    assert quickstart.mark("third", "third") == quickstart.RIGHT == "✓"
    assert quickstart.mark("thirty", "third") == quickstart.WRONG == "✗"
    assert quickstart.right_count(["a", "b c", "d"], ["a", "b  c", "e"]) == "2 of 3 right"
    assert quickstart.right_count([], []) == "0 of 0 right"
    with pytest.raises(ValueError, match="2 outputs for 3"):
        quickstart.right_count(["a", "b"], ["a", "b", "c"])


def test_new_inputs_have_num2words_answers(quickstart):
    from num2words import num2words

    expected = [num2words(n, lang=quickstart.TARGET_LANG, to=kind) for n, kind in quickstart.NEW_NUMBERS]
    assert expected[:2] == ["forty-two", "nineteen eighty-seven"] and len(set(expected)) == len(expected)


def test_phase_clock_counts_wall_and_cpu_seconds(quickstart, capsys):
    clock = quickstart.PhaseClock()
    with clock("busy", "Doing something"):
        sum(i * i for i in range(200_000))
    with clock("child"):
        subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)
    assert capsys.readouterr().out == "\n>>> Doing something\n"
    (name, wall, cpu), (_, _, child_cpu) = clock.phases
    assert name == "busy" and wall > 0 and cpu > 0
    assert child_cpu > 0.1  # the child process's CPU time counts (spawning it takes this process milliseconds)
    table = clock.table().splitlines()
    assert table[0].split() == ["phase", "wall", "s", "CPU", "s"] and table[1].startswith("busy")
    assert table[-1].startswith("total")


def test_training_arguments_log_compactly_and_parse(quickstart, tmp_path):
    from hf_layerfusion.cli.run_translation import parse_args

    for model_type in quickstart.MODELS:
        argv = quickstart.train_args(model_type, tmp_path / model_type, 40, None, seed=3)
        model_args, data_args, run_args, training_args = parse_args(argv)
        assert run_args.compact_logging and training_args.max_steps == 40 and training_args.seed == 3
        assert model_args.model_type == model_type and data_args.num_beams == quickstart.NUM_BEAMS
        assert 1 <= training_args.logging_steps <= 40


def test_help_describes_the_script_and_its_options(quickstart):
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "examples/quickstart.py", "--help"], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    # the options as argparse lists them, and the docstring
    for text in ("[--output_dir OUTPUT_DIR]", "[--steps STEPS]", "[--seed SEED]", "Quickstart:",
                 "python examples/quickstart.py --seed 1", "right or wrong", "progress bar"):
        assert text in result.stdout, text
    assert f"# {quickstart.STEPS} training steps per model" in result.stdout  # the docstring says the default


def test_side_by_side_runs_return_cpu_seconds_and_stop_at_a_failure(quickstart, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    cpu = quickstart.run_side_by_side({"first": ["--help"], "second": ["--help"]})
    assert set(cpu) == {"first", "second"} and all(seconds > 0 for seconds in cpu.values())
    with pytest.raises(SystemExit, match=r"Training second failed \(exit status [1-9]"):
        quickstart.run_side_by_side({"first": ["--help"], "second": ["--no_such_option"]})


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--steps", "0"], "--steps must be a positive number of training steps, got 0."),
        (["--steps", "-5"], "--steps must be a positive number of training steps, got -5."),
        (["--seed", "-1"], "--seed must lie in [0, 2**32 - 1] (numpy's seed range), got -1."),
    ],
    ids=["steps-zero", "steps-negative", "seed-negative"],
)
def test_bad_arguments_are_refused_before_the_tokenizer_is_written(quickstart, tmp_path, capsys, extra, message):
    """Before, `--steps 0` wrote <output_dir>/tokenizer and only then failed, in both training processes (`--max_steps
    0`). The script's own arguments are checked before its first write."""
    with pytest.raises(SystemExit):
        quickstart.main(["--output_dir", str(tmp_path / "qs"), *extra])
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_an_output_dir_that_is_a_file_is_refused_and_the_help_says_a_rerun_replaces_files(quickstart, tmp_path, capsys):
    a_file = tmp_path / "qs"
    a_file.write_text("keep me\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        quickstart.main(["--output_dir", str(a_file)])
    assert "is a file, not a directory" in capsys.readouterr().err
    assert a_file.read_text(encoding="utf-8") == "keep me\n"
    with pytest.raises(SystemExit):
        quickstart.main(["--help"])
    assert "a rerun replaces the files there" in " ".join(capsys.readouterr().out.split())
