"""`tools/check_transformers_range.py` decides from transformers' own metadata which of its dependencies an environment
lacks: with the newest release installed without its dependencies, that list decides whether the newest end runs (with
`USE_HUB_KERNELS=0` for `kernels` alone) or fails its install step."""

import importlib.metadata
import importlib.util
import json
import subprocess
import sys

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
