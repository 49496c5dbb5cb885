"""The package's layers import only downward (hf_layerfusion/__init__.py lists them), read from the ast of every
module: `hub/` and `translation/` import nothing from `training/`, so that translating works without the `train`
extra, and `translation/` nothing from `hub/`."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "hf_layerfusion"

# each part of the package, by its height: a part imports from lower ones only; parts of one height (`training/` and
# `hub/`) from neither. The command-line parts and the package's `__init__` sit on top of everything.
HEIGHTS = {
    "version": 0,
    "compat": 1,
    "file_checks": 1,
    "modeling": 2,
    "models": 3,
    "inference": 4,
    "translation": 5,
    "training": 6,
    "hub": 6,
}
TOP_LEVEL = ("__init__", "cli", "checkpoint_averaging", "ctranslate2_export")


def package_part(module: str) -> str:
    """`hf_layerfusion.modeling.model` -> `modeling`; the package itself -> `__init__`."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def module_name(path: Path, package_dir: Path = PACKAGE) -> str:
    parts = path.relative_to(package_dir.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_imports(path: Path, package_dir: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, absolute module) of every import of a package module in `path`, at any depth of the file (an import
    inside a function counts as much as one at the top)."""
    module = module_name(path, package_dir)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module
            # `from . import models`: the names may be modules of the package
            targets = [f"{target}.{alias.name}" for alias in node.names] if target == "hf_layerfusion" else [target]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        found += [(node.lineno, target) for target in targets if target.split(".")[0] == "hf_layerfusion"]
    return found


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_part_of_the_package_has_a_height():
    parts = {package_part(module_name(path)) for path in MODULES}
    assert parts == set(HEIGHTS) | set(TOP_LEVEL), parts ^ (set(HEIGHTS) | set(TOP_LEVEL))


def upward_imports(path: Path, package_dir: Path = PACKAGE) -> list[str]:
    """The imports of `path` that are not of a lower part of the package (nor of its own part), one line each."""
    part = package_part(module_name(path, package_dir))
    if part in TOP_LEVEL:
        return []
    return [
        f"{path.relative_to(package_dir.parent)}:{line} imports {target} ({package_part(target)}/ is not below {part}/)"
        for line, target in package_imports(path, package_dir)
        if package_part(target) != part
        and (package_part(target) in TOP_LEVEL or HEIGHTS[package_part(target)] >= HEIGHTS[part])
    ]


@pytest.mark.parametrize("path", MODULES, ids=lambda path: str(path.relative_to(PACKAGE)))
def test_modules_import_only_downward(path):
    upward = upward_imports(path)
    assert not upward, "\n".join(upward)


@pytest.mark.parametrize(
    ("part", "source", "expected"),
    [
        ("translation", "from ..training.data import builtin_number_corpus\nfrom ..inference import fast_generate\n",
         ["hf_layerfusion/translation/planted.py:1 imports hf_layerfusion.training.data"]),
        ("hub", "import hf_layerfusion.training.trainer\nfrom ..translation.translate import translate\n",
         ["hf_layerfusion/hub/planted.py:1 imports hf_layerfusion.training.trainer"]),
        ("translation", "def f():\n    from ..hub.pipeline import padding_last\n",
         ["hf_layerfusion/translation/planted.py:2 imports hf_layerfusion.hub.pipeline"]),
        ("training", "from ..translation.bleu import corpus_bleu\nfrom . import data\n", []),
    ],
)
def test_the_check_reads_each_kind_of_import(part, source, expected, tmp_path):
    """Relative, absolute and function-level imports, in a package written here."""
    planted = tmp_path / "hf_layerfusion" / part / "planted.py"
    planted.parent.mkdir(parents=True)
    planted.write_text(source)
    found = upward_imports(planted, tmp_path / "hf_layerfusion")
    assert [line.split(" (")[0] for line in found] == expected


def test_importing_the_package_imports_nothing_of_training():
    """`import hf_layerfusion` (in a fresh interpreter) imports no module of training/ nor what only training needs;
    the package's training names come on first use, each from the module TRAINING_NAMES says, and are in `__all__`."""
    import hf_layerfusion

    code = (
        "import sys, hf_layerfusion\n"
        "print(sorted(name for name in sys.modules if name.startswith('hf_layerfusion.training')"
        " or name.split('.')[0] in ('datasets', 'evaluate', 'num2words')))\n"
    )
    environment = {**os.environ, "PYTHONPATH": str(PACKAGE.parent)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
    for name, module in hf_layerfusion.TRAINING_NAMES.items():
        assert getattr(hf_layerfusion, name).__module__ == f"hf_layerfusion.training.{module}"
    assert set(hf_layerfusion.TRAINING_NAMES) <= set(hf_layerfusion.__all__) and "translate" in hf_layerfusion.__all__


def test_the_console_scripts_launchers_import_only_the_standard_library():
    """hf_layerfusion_cli, beside the package, prints the console scripts' `--help` without importing the package (nor
    torch or transformers, which the package imports): it imports the standard library alone, and a command's module
    by name (importlib) only to run it or render its help."""
    launchers = PACKAGE.parent / "hf_layerfusion_cli.py"
    imported = set()
    for node in ast.walk(ast.parse(launchers.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            imported.add("." if node.level else node.module.split(".")[0])
    assert imported and imported <= sys.stdlib_module_names, sorted(imported - sys.stdlib_module_names)
