"""Every command-line script says what it does and how to call it: `--help` prints a description (the module
docstring) and at least one example command line for that script."""

from __future__ import annotations

import ast
import configparser
import importlib
import os
import re
import runpy
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(
    path.relative_to(REPO_ROOT)
    for folder in ("examples", "tools")
    for path in (REPO_ROOT / folder).glob("*.py")
    if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")
)
# the study's modules that run as `python -m study.<name>` (study/README.md)
STUDY_MODULES = sorted(
    f"study.{path.stem}" for path in (REPO_ROOT / "study").glob("*.py")
    if 'if __name__ == "__main__":' in path.read_text(encoding="utf-8")
)


def first_docstring_line(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))).splitlines()[0]


def has_example(help_text: str, command: str) -> bool:
    """A line of the help that runs `command` (possibly after `cmd |` or before arguments)."""
    return re.search(rf"^\s*(.*\|\s*)?{re.escape(command)}(\s|$)", help_text, flags=re.MULTILINE) is not None


def test_every_script_is_checked():
    assert {path.parts[0] for path in SCRIPTS} == {"examples", "tools"} and len(SCRIPTS) >= 5
    assert {"study.queue", "study.report", "study.bench_multi30k"} <= set(STUDY_MODULES) and len(STUDY_MODULES) >= 15


@pytest.mark.parametrize("script", SCRIPTS, ids=str)
def test_help_has_a_description_and_an_example(script, monkeypatch, capsys):
    # run as `python <script> --help` would, in this process (imports are shared: seconds instead of minutes):
    # the script's folder first on sys.path, the script as __main__
    monkeypatch.setattr(sys, "path", [str(REPO_ROOT / script.parent), *sys.path])
    monkeypatch.setattr(sys, "argv", [str(REPO_ROOT / script), "--help"])
    monkeypatch.chdir(REPO_ROOT)
    with pytest.raises(SystemExit) as exit_info:
        runpy.run_path(str(REPO_ROOT / script), run_name="__main__")
    assert exit_info.value.code in (0, None)
    help_text = capsys.readouterr().out
    assert first_docstring_line(REPO_ROOT / script) in help_text
    assert has_example(help_text, f"python {script}"), help_text[:3000]


@pytest.mark.parametrize("module", STUDY_MODULES)
def test_study_module_help_has_a_description_and_an_example(module, monkeypatch, capsys):
    # run as `python -m <module> --help` would, in this process (imports are shared: seconds instead of minutes)
    monkeypatch.setattr(sys, "argv", [module, "--help"])
    monkeypatch.chdir(REPO_ROOT)
    with pytest.raises(SystemExit) as exit_info, warnings.catch_warnings():
        # a module another study module imported is in sys.modules already: runpy warns, and runs it anew
        warnings.filterwarnings("ignore", "'study.", RuntimeWarning)
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    assert exit_info.value.code in (0, None)
    help_text = capsys.readouterr().out
    assert first_docstring_line(REPO_ROOT / "study" / f"{module.removeprefix('study.')}.py") in help_text
    # `python -m study` runs the queue (study/__main__.py)
    command = "python -m study" if module == "study.queue" else f"python -m {module}"
    assert has_example(help_text, command), help_text[:3000]


def test_checkpoint_averaging_module_help_without_runpy_warning():
    """`python -m hf_layerfusion.checkpoint_averaging` runs the package's `__main__` module: no RuntimeWarning about
    a module found in sys.modules before its execution (run with warnings as errors, in a fresh process)."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    result = subprocess.run(
        [sys.executable, "-W", "error", "-m", "hf_layerfusion.checkpoint_averaging", "--help"],
        capture_output=True, text=True, env=env, cwd=REPO_ROOT, timeout=120,
    )
    assert result.returncode == 0 and "RuntimeWarning" not in result.stderr, result.stderr[-3000:]
    assert "Average the weights of the last N Trainer checkpoints" in result.stdout
    assert has_example(result.stdout, "python -m hf_layerfusion.checkpoint_averaging")


def console_scripts() -> dict[str, str]:
    setup = configparser.ConfigParser()
    setup.read(REPO_ROOT / "setup.cfg", encoding="utf-8")
    lines = [line for line in setup["options.entry_points"]["console_scripts"].split("\n") if line.strip()]
    return dict(tuple(part.strip() for part in line.split("=")) for line in lines)


def test_every_command_line_module_is_a_console_script():
    """The tools of hf_layerfusion/cli and every package module with a command line (`def main(argv)` behind
    `if __name__ == "__main__"`, or a package's `__main__.py`) are console scripts; each names a function that exists."""
    targets = console_scripts()
    modules = {target.split(":")[0] for target in targets.values()}
    package = REPO_ROOT / "hf_layerfusion"
    with_command_line = set()
    for path in package.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        module = ".".join(path.relative_to(REPO_ROOT).with_suffix("").parts)
        if path.name == "__main__.py":
            module = re.search(r"^from ([\w.]+) import main$", text, flags=re.MULTILINE).group(1)
        elif 'if __name__ == "__main__":' not in text:
            continue
        with_command_line.add(module)
    assert with_command_line == modules, (sorted(with_command_line - modules), sorted(modules - with_command_line))
    for name, target in targets.items():
        module, function = target.split(":")
        assert callable(getattr(importlib.import_module(module), function)), name


@pytest.mark.parametrize("module", ["hf_layerfusion.cli.translate", "hf_layerfusion.cli.run_translation",
                                    "hf_layerfusion.cli.run_multilingual", "hf_layerfusion.inference.build"])
def test_python_m_runs_each_tool_without_runpy_warning(module):
    result = subprocess.run(
        [sys.executable, "-W", "error", "-m", module, "--help"], capture_output=True, text=True, cwd=REPO_ROOT, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "usage:" in result.stdout


def help_sections(help_text: str, headings: list[str]) -> list[str]:
    """The text under each of `headings` (argparse's `title:` lines), in the order they come; a heading missing or out
    of order is a failure naming it."""
    starts = [help_text.find(f"\n{heading}:\n") for heading in headings]
    assert -1 not in starts and starts == sorted(starts), dict(zip(headings, starts))
    return [help_text[start:end] for start, end in zip(starts, [*starts[1:], len(help_text)])]


def option_names(section: str) -> set[str]:
    """The long options a `--help` section describes (an option's line starts with it, after the indentation)."""
    return set(re.findall(r"^\s{2}(--\w+)", section, flags=re.MULTILINE))


@pytest.mark.parametrize("module_name", ["hf_layerfusion.cli.run_translation", "hf_layerfusion.cli.run_multilingual"])
def test_training_help_groups_the_commands_options_before_the_trainers(module_name, capsys):
    """`--help` of a training command: each argument dataclass of the command under its own heading, in order, then
    every option of `Seq2SeqTrainingArguments` under one heading, last; each option under its own group's heading."""
    import dataclasses

    from transformers import Seq2SeqTrainingArguments

    from hf_layerfusion.cli.run_translation import TrainerArguments

    module = importlib.import_module(module_name)
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--help"])
    assert exit_info.value.code == 0
    help_text = capsys.readouterr().out
    own = [module.ModelArguments, module.DataArguments, module.RunArguments]
    groups = [*own, Seq2SeqTrainingArguments]
    headings = [arguments._argument_group_name for arguments in own] + [TrainerArguments._argument_group_name]
    for arguments, section in zip(groups, help_sections(help_text, headings), strict=True):
        fields = {f"--{field.name}" for field in dataclasses.fields(arguments) if field.init}
        assert fields <= option_names(section), (arguments.__name__, sorted(fields - option_names(section)))
    assert "Seq2SeqTrainingArguments" in headings[-1]
