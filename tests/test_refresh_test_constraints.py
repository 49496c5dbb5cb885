"""`tools/refresh_test_constraints.py` rewrites tests/constraints.txt only after the whole suite passed on the newest
releases, and prints what changed; the committed file pins what the suite needs."""

import importlib.util
import json
import subprocess

import pytest
from helpers import REPO_ROOT


def load_tool():
    spec = importlib.util.spec_from_file_location("refresh_test_constraints", REPO_ROOT / "tools/refresh_test_constraints.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


tool = load_tool()
NEWEST = [
    {"name": "transformers", "version": "5.26.0"},
    {"name": "torch", "version": "2.13.0+cpu"},
    {"name": "Kernels", "version": "0.19.1"},
    {"name": "pip", "version": "26.0"},
    {"name": "pytest_timeout", "version": "2.4.0"},
]
OLD = "# pins\ntransformers==5.25.0\ntorch==2.13.0\nkernels==0.19.1\nsafetensors==0.8.0\n"


def fake_runner(suite_exit: int, commands: list):
    def runner(command, **kwargs):
        commands.append(command)
        if command[-3:] == ["list", "--format=json", "--exclude-editable"]:
            return subprocess.CompletedProcess(command, 0, json.dumps(NEWEST), "")
        if "pytest" in command:
            assert kwargs["cwd"] == tool.REPO_ROOT and kwargs["env"]["CI"] == "true"
            return subprocess.CompletedProcess(command, suite_exit, "1 failed, 9 passed\n" if suite_exit else "10 passed\n", "")
        return subprocess.CompletedProcess(command, 0, "", "")

    return runner


def test_the_file_is_rewritten_only_after_the_whole_suite_passed(tmp_path, capsys):
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(OLD, encoding="utf-8")
    commands = []
    assert tool.refresh(tmp_path, constraints, runner=fake_runner(1, commands)) == 1
    assert constraints.read_text(encoding="utf-8") == OLD
    output = capsys.readouterr().out
    assert "changed transformers 5.25.0 -> 5.26.0" in output and "unchanged" in output and "1 failed" in output
    # the whole suite: no test selection, from the checkout, in the new environment
    assert commands[-1] == [str(tmp_path / "env/bin/python"), "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    assert any(command[-2:] == ["-e", f"{tool.REPO_ROOT}[test]"] for command in commands)
    assert not any("-c" in command for command in commands), "the refresh installs the newest releases, unpinned"

    assert tool.refresh(tmp_path, constraints, runner=fake_runner(0, [])) == 0
    output = capsys.readouterr().out
    assert tool.read_constraints(constraints) == {
        "transformers": "5.26.0", "torch": "2.13.0", "kernels": "0.19.1", "pytest-timeout": "2.4.0",
    }
    for line in ("changed transformers 5.25.0 -> 5.26.0", "added   pytest-timeout==2.4.0", "removed safetensors==0.8.0"):
        assert line in output
    assert not list(tmp_path.glob(".constraints.txt.*")), "no temporary file left"


def test_a_line_that_is_not_a_pin_is_named(tmp_path):
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("torch==2.13.0\ntransformers>=5.20\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"constraints.txt:2: 'transformers>=5.20' is not a `name==version` pin"):
        tool.read_constraints(constraints)
    with pytest.raises(SystemExit):
        tool.main(["--constraints", str(constraints), "--workdir", str(tmp_path / "work")])


def test_the_committed_constraints_pin_what_the_suite_installs():
    pins = tool.read_constraints(tool.CONSTRAINTS)
    for name in ("torch", "transformers", "kernels", "tokenizers", "accelerate", "datasets", "evaluate", "peft",
                 "ctranslate2", "sentencepiece", "safetensors", "huggingface-hub", "pytest", "pytest-xdist",
                 # the site's build (tests/test_docs_site.py) and the distributions' check (tests/test_packaging.py)
                 "mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python", "griffelib", "twine"):
        assert name in pins, name
    assert pins["torch"] == tool.TORCH.split("==")[1]
    assert "hf-layerfusion" not in pins and "pip" not in pins


@pytest.mark.parametrize("mode", [0o644, 0o664])
def test_the_rewritten_file_keeps_its_mode_and_is_on_disk_before_it_replaces_the_old(tmp_path, monkeypatch, mode):
    """Before, the file was written through mkstemp, whose 0o600 replaced the committed file's 0o644, and renamed into
    place without an fsync (a crash could leave an empty file under the name). The new file keeps the old one's mode,
    and its data is synced before the rename."""
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(OLD, encoding="utf-8")
    constraints.chmod(mode)
    synced = []
    fsync = tool.os.fsync
    monkeypatch.setattr(tool.os, "fsync", lambda descriptor: (synced.append(descriptor), fsync(descriptor)))
    assert tool.refresh(tmp_path, constraints, runner=fake_runner(0, [])) == 0
    assert (constraints.stat().st_mode & 0o777) == mode and synced
    assert "transformers==5.26.0" in constraints.read_text(encoding="utf-8")


def test_a_workdir_or_constraints_of_the_wrong_kind_is_named(tmp_path, capsys):
    """Before, `--workdir <a file>` ended in a NotADirectoryError traceback, `--constraints <a folder>` in an
    IsADirectoryError traceback. Both are refused by name, before anything is made."""
    a_file = tmp_path / "a_file"
    a_file.write_text("x\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        tool.main(["--workdir", str(a_file), "--constraints", str(tmp_path / "constraints.txt")])
    assert f"--workdir {a_file} is a file, not a folder" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tool.main(["--workdir", str(tmp_path / "work"), "--constraints", str(tmp_path)])
    assert f"--constraints {tmp_path} is a folder" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a_file"]
