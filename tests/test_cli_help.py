"""Every command-line script says what it does and how to call it: `--help` prints a description (the module
docstring) and at least one example command line for that script. The console scripts print it at once after the
first time (hf_layerfusion_cli: the text their parser printed, cached), and the same text."""

from __future__ import annotations

import ast
import configparser
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
import re
import runpy
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

import hf_layerfusion_cli

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


def console_script_commands() -> dict[str, hf_layerfusion_cli.Command]:
    """The launcher (`hf_layerfusion_cli.Command`) each console script of setup.cfg names, by script name."""
    commands = {}
    for name, target in console_scripts().items():
        module, attribute = target.split(":")
        assert module == "hf_layerfusion_cli", f"{name} = {target}: not a launcher, its --help imports the package"
        commands[name] = getattr(hf_layerfusion_cli, attribute)
    return commands


def test_every_command_line_module_is_a_console_script():
    """The tools of hf_layerfusion/cli and every package module with a command line (`def main(argv)` behind
    `if __name__ == "__main__"`, or a package's `__main__.py`) are console scripts, each a launcher of
    hf_layerfusion_cli of the script's name, naming a function that exists and the module's parser."""
    commands = console_script_commands()
    assert all(command.name == name for name, command in commands.items()), commands
    modules = {command.module for command in commands.values()}
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
    for name, command in commands.items():
        module = importlib.import_module(command.module)
        assert callable(getattr(module, command.function)) and callable(module.build_parser), name


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


# The console scripts' `--help` (hf_layerfusion_cli): the command's own text, cached. The tests fix the width argparse
# wraps to (COLUMNS), and a cache of their own (XDG_CACHE_HOME).
COLUMNS = "100"
HEAVY_PACKAGES = ("hf_layerfusion", "torch", "transformers")


def launch(name: str, arguments: list[str], cache: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The console script `name` run as its wrapper runs it (`sys.exit(launcher())`, `name` as `sys.argv[0]`) in a
    fresh process, with `arguments`; its result, and which of HEAVY_PACKAGES it imported."""
    attribute = console_scripts()[name].split(":")[1]
    code = (
        f"import json, sys, hf_layerfusion_cli\nsys.argv[0] = {name!r}\n"
        f"try:\n    status = hf_layerfusion_cli.{attribute}()\n"
        f"finally:\n    print(json.dumps(sorted({{module.split('.')[0] for module in sys.modules}} & {set(HEAVY_PACKAGES)!r})),"
        " file=sys.stderr)\nsys.exit(status)\n"
    )
    environment = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "XDG_CACHE_HOME": str(cache), "COLUMNS": COLUMNS}
    result = subprocess.run(
        [sys.executable, "-c", code, *arguments], check=False, capture_output=True, text=True, env=environment,
        timeout=300,
    )
    return result, json.loads(result.stderr.strip().splitlines()[-1])


def commands_own_help(name: str, monkeypatch, capsys, columns: str = COLUMNS) -> str:
    """What the command prints for `name --help` by itself (the function the launcher runs, as the console script ran
    it before there were launchers), `columns` wide."""
    command = console_script_commands()[name]
    monkeypatch.setenv("COLUMNS", columns)
    monkeypatch.setattr(sys, "argv", [name, "--help"])
    with pytest.raises(SystemExit) as exit_info:
        getattr(importlib.import_module(command.module), command.function)()
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def cache_file(cache: Path, name: str) -> Path:
    return cache / "hf_layerfusion" / "help" / f"{name}.json"


@pytest.fixture(scope="module")
def first_train_help(tmp_path_factory) -> tuple[Path, str]:
    """`hf-layerfusion-train --help` through its launcher with an empty cache (seconds: it renders the text): the
    cache folder it filled, and what it printed."""
    cache = tmp_path_factory.mktemp("cache")
    result, imported = launch("hf-layerfusion-train", ["--help"], cache)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "hf_layerfusion" in imported  # rendered: a miss
    return cache, result.stdout


def test_the_first_help_is_the_commands_own_and_cached(first_train_help, monkeypatch, capsys):
    cache, first = first_train_help
    assert first == commands_own_help("hf-layerfusion-train", monkeypatch, capsys)
    assert json.loads(cache_file(cache, "hf-layerfusion-train").read_text(encoding="utf-8"))["help"] == first


def test_a_cached_help_is_the_same_text_without_importing_torch_or_transformers(first_train_help):
    cache, first = first_train_help
    result, imported = launch("hf-layerfusion-train", ["--help"], cache)
    assert result.returncode == 0 and result.stdout == first, result.stderr[-3000:]
    assert imported == []


@pytest.mark.parametrize("name", sorted(console_scripts()))
def test_every_launcher_prints_its_commands_own_help(name, tmp_path, monkeypatch, capsys):
    """In this process (the commands' modules imported once for all): rendered, then cached, the command's text."""
    own = commands_own_help(name, monkeypatch, capsys)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for _ in range(2):
        assert console_script_commands()[name]() is None
        assert capsys.readouterr() == (own, "")
    assert cache_file(tmp_path, name).exists()


def renders(monkeypatch) -> list[str]:
    """The commands whose help hf_layerfusion_cli renders from now on, in order (the misses of its cache)."""
    rendered = []
    render_help = hf_layerfusion_cli.Command.render_help

    def recorded(command):
        rendered.append(command.name)
        return render_help(command)

    monkeypatch.setattr(hf_layerfusion_cli.Command, "render_help", recorded)
    return rendered


@pytest.fixture
def train_cache(first_train_help, tmp_path, monkeypatch, capsys) -> tuple[Path, str]:
    """A copy of the cache `first_train_help` filled, this process's cache, which holds its key; and the command's own
    help."""
    cache = tmp_path / "cache"
    shutil.copytree(first_train_help[0], cache)
    own = commands_own_help("hf-layerfusion-train", monkeypatch, capsys)
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache, own


def test_another_width_renders_the_help_anew(train_cache, monkeypatch, capsys):
    _, own = train_cache
    rendered = renders(monkeypatch)
    hf_layerfusion_cli.train()
    assert capsys.readouterr().out == own and rendered == []  # this process's key is the cached one
    narrow = commands_own_help("hf-layerfusion-train", monkeypatch, capsys, columns="60")
    assert narrow != own
    hf_layerfusion_cli.train()
    assert capsys.readouterr().out == narrow and rendered == ["hf-layerfusion-train"]


@pytest.mark.parametrize("part", ["prog", "hf_layerfusion", "transformers", "torch", "sources", "python", "columns"])
def test_every_part_of_the_key_changes_it(part, tmp_path, monkeypatch):
    """Each of what can change a help text, changed alone, changes the key the cache is read under."""
    package = tmp_path / "hf_layerfusion"
    package.mkdir()
    (package / "__init__.py").write_text("FAMILIES = {}\n")
    spec = importlib.machinery.ModuleSpec("hf_layerfusion", None, is_package=True)
    spec.submodule_search_locations.append(str(package))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: spec if name == "hf_layerfusion" else None)
    monkeypatch.setattr(sys, "argv", ["hf-layerfusion-train", "--help"])
    monkeypatch.setenv("COLUMNS", COLUMNS)
    before = hf_layerfusion_cli.help_key()
    if part == "prog":
        monkeypatch.setattr(sys, "argv", ["run_translation.py", "--help"])
    elif part in hf_layerfusion_cli.HELP_DISTRIBUTIONS:
        version = importlib.metadata.version
        monkeypatch.setattr(importlib.metadata, "version", lambda name: "99.0" if name == part else version(name))
    elif part == "sources":
        (package / "__init__.py").write_text("FAMILIES = {'another': None}\n")
    elif part == "python":
        monkeypatch.setattr(sys, "version", f"{sys.version} and another build")
    elif part == "columns":
        monkeypatch.setenv("COLUMNS", "60")
    assert hf_layerfusion_cli.help_key() != before


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe not UTF-8", b'{"key": {', b"[]", b'{"help": "usage: stale"}', b"", "directory"],
    ids=["not-utf8", "cut-short", "not-a-dict", "no-key", "empty", "a-directory"],
)
def test_a_cache_file_that_cannot_be_read_is_rendered_anew(content, train_cache, monkeypatch, capsys):
    """No traceback, nothing on stderr: the command's own text, then cached again where a file can be written."""
    cache, own = train_cache
    path = cache_file(cache, "hf-layerfusion-train")
    path.unlink()
    if content == "directory":  # neither read nor replaced
        path.mkdir()
    else:
        path.write_bytes(content)
    rendered = renders(monkeypatch)
    assert hf_layerfusion_cli.train() is None
    assert capsys.readouterr() == (own, "") and rendered == ["hf-layerfusion-train"]
    hf_layerfusion_cli.train()
    assert capsys.readouterr().out == own
    assert rendered == ["hf-layerfusion-train"] * (2 if content == "directory" else 1)
    assert [entry.name for entry in path.parent.iterdir()] == [path.name]  # no temporary file left


def test_a_cache_that_cannot_be_written_still_prints_the_help(train_cache, tmp_path, monkeypatch, capsys):
    """The cache's folder cannot be made (XDG_CACHE_HOME is a file): the help every time, rendered every time."""
    _, own = train_cache
    (tmp_path / "a_file").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a_file"))
    rendered = renders(monkeypatch)
    for _ in range(2):
        assert hf_layerfusion_cli.train() is None
        assert capsys.readouterr() == (own, "")
    assert rendered == ["hf-layerfusion-train"] * 2


@pytest.mark.parametrize(
    ("arguments", "asks"),
    [
        (["--help"], True),
        (["-h"], True),
        (["--model_type", "gtrans", "-h", "--do_train"], True),
        (["--", "-h"], False),  # after `--` every argument is a value
        (["--tgt_lang=-h"], False),
        (["--hel"], False),  # an abbreviation: the command's parser answers it
        ([], False),
    ],
)
def test_which_command_lines_ask_for_help(arguments, asks):
    assert hf_layerfusion_cli.asks_for_help(arguments) is asks


@pytest.mark.parametrize(
    ("name", "arguments", "error"),
    [
        ("hf-layerfusion-train", ["--num_beams", "four"], "argument --num_beams/--num-beams: invalid int value: 'four'"),
        # a value: the command has no positional argument (Python before 3.12 names the `--` too)
        ("hf-layerfusion-build-kernels", ["--", "-h"], "unrecognized arguments: (-- )?-h"),
    ],
)
def test_other_command_lines_reach_the_command(name, arguments, error, tmp_path, monkeypatch, capsys):
    """Not a help: the command parses the command line itself (here: refuses it, naming the argument), and nothing is
    cached."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(sys, "argv", [name, *arguments])
    with pytest.raises(SystemExit) as exit_info:
        console_script_commands()[name]()
    assert exit_info.value.code == 2
    assert re.search(f": error: {error}$", capsys.readouterr().err, flags=re.MULTILINE)
    assert not (tmp_path / "hf_layerfusion").exists()
