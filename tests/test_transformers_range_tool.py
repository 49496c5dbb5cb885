"""`tools/check_transformers_range.py` decides from transformers' own metadata which of its dependencies an environment
lacks: with the newest release installed without its dependencies, that list decides whether the newest end runs (with
`USE_HUB_KERNELS=0` for `kernels` alone) or fails its install step. Its environments see the packages of the
interpreter that runs it, a venv's included."""

import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO_ROOT, fake_package_versions
from packaging.requirements import Requirement


def load_tool():
    spec = importlib.util.spec_from_file_location("check_transformers_range", REPO_ROOT / "tools/check_transformers_range.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def unmet_requirements(fake_versions: dict[str, str | None]) -> list[list]:
    """The tool's check run in this interpreter, with `importlib.metadata` reporting `fake_versions` (None: not
    installed) for those packages."""
    script = fake_package_versions(fake_versions) + load_tool().UNMET
    return json.loads(subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout)


def test_the_installed_transformers_has_every_dependency_it_requires():
    # the README's test command installs transformers with its dependencies (extras' requirements are not asked for)
    assert unmet_requirements({}) == []


def test_a_missing_or_too_old_dependency_is_named_with_its_requirement():
    required = {Requirement(text).name for text in importlib.metadata.requires("transformers") if "extra ==" not in text}
    assert {"tokenizers", "safetensors"} <= required
    unmet = unmet_requirements({"tokenizers": "0.0.1", "safetensors": None})
    assert {name: installed for name, _, installed in unmet} == {"tokenizers": "0.0.1", "safetensors": None}


def test_each_end_is_pinned_to_the_test_constraints_but_for_what_the_release_rules_out():
    constraints = {"transformers": "5.25.0", "tokenizers": "0.23.3", "huggingface_hub": "2.4.0", "torch": "2.13.0",
                   "pytest": "8.4.2"}
    requires = ["tokenizers<=0.23.0,>=0.22.0", "huggingface-hub<3.0,>=1.0", "numpy>=1.17",
                'pytest>=9; extra == "testing"']
    text, unpinned = load_tool().pinned_constraints(constraints, "transformers==5.20.0", requires)
    assert text.splitlines() == ["huggingface-hub==2.4.0", "pytest==8.4.2", "torch==2.13.0"]
    assert unpinned == ["tokenizers==0.23.3 (the release requires tokenizers<=0.23.0,>=0.22.0)"]
    text, unpinned = load_tool().pinned_constraints(constraints, "transformers==5.20.0", [], frozenset({"torch"}))
    assert "torch" not in text and "tokenizers==0.23.3" in text
    assert unpinned == ["torch==2.13.0 (installed at this end of its own range)"]


def test_a_passing_check_records_the_release_of_each_end(tmp_path):
    """What tests/test_packaging.py holds the range's ceiling to (issue 73): the releases the check ran, not a number
    typed beside the requirement."""
    path = tmp_path / "checked.json"
    versions = {"oldest": {"transformers": "5.20.0", "torch": "2.13.0"}, "newest": {"transformers": "5.25.0",
                                                                                  "torch": "2.13.0"}}
    load_tool().record_checked_range(versions, "transformers>=5.20,<5.26", path)
    assert json.loads(path.read_text()) == {"requirement": "transformers>=5.20,<5.26", "oldest": "5.20.0",
                                            "newest": "5.25.0"}
    assert [child.name for child in tmp_path.iterdir()] == ["checked.json"]


def test_an_environment_sees_the_packages_of_the_venv_that_runs_the_check(tmp_path):
    """Run from a virtual environment (the README's test command in a venv), the check's environments must see that
    venv's packages, hf_layerfusion's editable install among them, not the base installation's: with
    `venv --system-site-packages` every step that imports the package failed with ModuleNotFoundError."""
    parent = tmp_path / "parent"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(parent)], check=True)
    parent_python = parent / "bin" / "python"
    parent_site = Path(subprocess.run(
        [str(parent_python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip())
    # a module installed in the venv, and one reached through a .pth file there, as an editable install is
    (parent_site / "only_in_the_parent_venv.py").write_text("WHERE = 'parent venv'\n")
    (tmp_path / "editable").mkdir()
    (tmp_path / "editable" / "editable_in_the_parent_venv.py").write_text("WHERE = 'editable'\n")
    (parent_site / "editable.pth").write_text(str(tmp_path / "editable") + "\n")
    create = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('tool', {str(REPO_ROOT / 'tools/check_transformers_range.py')!r})\n"
        "tool = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(tool)\n"
        f"print(tool.create_environment(tool.Path({str(tmp_path / 'child')!r}), 'oldest', tool.Steps()))\n"
    )
    created = subprocess.run([str(parent_python), "-c", create], capture_output=True, text=True, check=True)
    child_python = created.stdout.strip().splitlines()[-1]
    assert child_python == str(tmp_path / "child" / "bin" / "python")
    script = ("import json, sys, only_in_the_parent_venv as a, editable_in_the_parent_venv as b; "
              "print(json.dumps([a.WHERE, b.WHERE, sys.prefix]))")
    seen = subprocess.run([child_python, "-c", script], capture_output=True, text=True, cwd=tmp_path, check=False)
    assert seen.returncode == 0, seen.stderr
    assert json.loads(seen.stdout) == ["parent venv", "editable", str(tmp_path / "child")]


def run_tool(temporary: Path, *arguments: str) -> subprocess.Popen:
    """The tool started in a process of its own, its temporary work folder made under `temporary`."""
    return subprocess.Popen([sys.executable, str(REPO_ROOT / "tools/check_transformers_range.py"), *arguments],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=os.environ | {"TMPDIR": str(temporary)})


def test_a_bad_argument_stops_the_check_before_it_writes_anything(tmp_path):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    missing = tmp_path / "no_such_constraints.txt"
    tool = run_tool(temporary, "--constraints", str(missing))
    _, stderr = tool.communicate(timeout=120)
    assert tool.returncode == 2 and f"--constraints {missing} does not exist" in stderr
    assert list(temporary.iterdir()) == []  # no work folder left behind


def test_a_check_stopped_with_sigterm_removes_its_work_folder(tmp_path):
    """The environments take hundreds of MB: a check killed by `kill` or a CI timeout must not leave them behind."""
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    tool = run_tool(temporary, "--ends", "oldest", "--tests")
    deadline = time.monotonic() + 120
    while not list(temporary.glob("transformers-range-*/env-oldest")) and tool.poll() is None:
        assert time.monotonic() < deadline, "the check made no environment in 2 minutes"
        time.sleep(0.05)
    assert tool.poll() is None, tool.communicate()
    tool.send_signal(signal.SIGTERM)
    tool.communicate(timeout=120)
    assert tool.returncode == 128 + signal.SIGTERM
    assert list(temporary.iterdir()) == []


def test_a_workdir_or_constraints_of_the_wrong_kind_is_named(tmp_path, capsys):
    """Before, `--constraints <a folder>` was said not to exist, and `--workdir <a file>` ended in a NotADirectoryError
    traceback. Each says what is wrong with it, before anything is made."""
    tool = load_tool()
    a_file = tmp_path / "a_file"
    a_file.write_text("x\n", encoding="utf-8")
    with pytest.raises(SystemExit):
        tool.main(["--constraints", str(tmp_path)])
    assert f"--constraints {tmp_path} is a folder, not a constraints file" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        tool.main(["--workdir", str(a_file)])
    assert f"--workdir {a_file} is a file, not a folder" in capsys.readouterr().err
    assert sorted(path.name for path in tmp_path.iterdir()) == ["a_file"]
