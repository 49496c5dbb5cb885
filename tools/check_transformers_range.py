#!/usr/bin/env python
"""Check the package on the oldest and the newest transformers release of its supported range.

    python tools/check_transformers_range.py                    # both ends of the range (CI runs this)
    python tools/check_transformers_range.py --ends oldest      # one end
    python tools/check_transformers_range.py --keep --workdir /tmp/range   # keep the environments and models
    python tools/check_transformers_range.py --torch-ends       # torch at the same ends too (GBs of CUDA wheels)

The range is `hf_layerfusion.version.TRANSFORMERS_REQUIREMENT` (`>=5.20,<5.26` today): the oldest end is its lower bound
(`transformers==5.20.0`), the newest the newest release the package index has inside it (`pip download --no-deps`,
whatever its dependencies). For each end, a throwaway virtual environment that sees this interpreter's packages (torch
and every other dependency as installed by the README's test command) gets that transformers release, installed with
the test constraints (`tests/constraints.txt`: every other package pinned to the versions the whole suite last passed
on, except a pin the release itself rules out, which pip then chooses and the tool names), and runs:

1. the test subsets that touch transformers' API: the family contract, fast generation (token-exact against
   `generate()`), training, the pipeline, checkpoint compatibility, the Hub code and packaging;
2. Hub checkpoints across the range: a tiny model of every family saved with the package under one end loads under the
   other end by its remote code alone (hf_layerfusion not importable) and gives the same greedy and beam-search tokens
   and the same logits (atol 1e-5), both ways.

With `--torch-ends` each end's environment also gets torch at the same end of `hf_layerfusion.version.TORCH_REQUIREMENT`
(`torch==2.6.0` beside the oldest transformers, the newest torch pip finds beside the newest), so the kernels are
compiled against, and the tests run on, both torch releases. PyPI's torch wheels for Linux bring CUDA's (several GB
per end), which is why CI leaves it to a release check (docs/testing.md, *torch versions*).

Where the index lacks a dependency of the newest release, pip's resolver would quietly install an older one, and the
check would not be of the newest end: the tool installs that release without its dependencies instead and names what is
missing. The one missing dependency it runs without is `kernels` (transformers 5.25 requires it, and its `from_pretrained`
then kernelizes every model by default; an index without `kernels>=0.19.1` makes every load fail): the newest end's steps
then run with `USE_HUB_KERNELS=0`, transformers' switch for that, and the tool says so. Any other missing dependency
fails the install step.

It prints each step with its result, closes with `steps: N passed, N failed`, and exits non-zero when any step fails.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import site
import subprocess
import sys
import email.parser
import tempfile
import time
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "tools"))
from refresh_test_constraints import CONSTRAINTS, read_constraints  # noqa: E402
TEST_SUBSETS = (
    "tests/test_compat.py",
    "tests/test_family_contract.py",
    "tests/test_fast_generation.py",
    "tests/test_beam_search_kernels.py",
    "tests/test_training_pipeline.py",
    "tests/test_adapters.py",
    "tests/test_pipeline.py",
    "tests/test_checkpoint_compatibility.py",
    "tests/test_hub.py",
    "tests/test_packaging.py",
    "tests/test_hub_kernels.py",
)
ENDS = ("oldest", "newest")

# run with the package, in one end's environment: every family's tiny model saved with its Hub code, and its outputs
SAVE = """
import json, sys
import torch
sys.path.insert(0, {tests!r})
from helpers import tiny_model
import hf_layerfusion, transformers

out = {out!r}
generator = torch.Generator().manual_seed(0)
input_ids = torch.randint(4, 20, (3, 7), generator=generator)  # the tiny vocabulary has 24 tokens
attention_mask = torch.ones_like(input_ids)
attention_mask[1, 5:] = 0
attention_mask[2, 3:] = 0
input_ids[attention_mask == 0] = 1
torch.save({{"input_ids": input_ids, "attention_mask": attention_mask}}, out + "/inputs.pt")
for model_type in hf_layerfusion.FAMILIES:
    model = tiny_model(model_type)
    model.save_pretrained(out + "/" + model_type)
    print(model_type, "saved under transformers", transformers.__version__)
"""

# run without the package (hf_layerfusion not importable), in either end's environment: every saved model loaded by
# its remote code; greedy and beam-search tokens and the logits of a forward pass
RUN_REMOTE = """
import json
import torch
import transformers
from transformers import AutoModelForSeq2SeqLM

saved, result = {saved!r}, {result!r}
inputs = torch.load(saved + "/inputs.pt")
outputs = {{}}
for model_type in {families!r}:
    model = AutoModelForSeq2SeqLM.from_pretrained(saved + "/" + model_type, trust_remote_code=True).eval()
    assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
    decoder_input_ids = torch.full((3, 1), model.config.decoder_start_token_id)
    with torch.no_grad():
        outputs[model_type] = {{
            "greedy": model.generate(**inputs, max_new_tokens=6, do_sample=False),
            "beam": model.generate(**inputs, max_new_tokens=6, num_beams=3, do_sample=False),
            "logits": model(**inputs, decoder_input_ids=decoder_input_ids).logits,
        }}
    print(model_type, "ran by remote code under transformers", transformers.__version__)
torch.save(outputs, result)
"""

VERSIONS = "import json, torch, transformers; print(json.dumps({'transformers': transformers.__version__, 'torch': torch.__version__}))"

COMPARE = """
import torch
first, second = torch.load({first!r}), torch.load({second!r})
assert sorted(first) == sorted(second), (sorted(first), sorted(second))
for model_type in first:
    for search in ("greedy", "beam"):
        assert first[model_type][search].tolist() == second[model_type][search].tolist(), (model_type, search)
    torch.testing.assert_close(first[model_type]["logits"], second[model_type]["logits"], atol=1e-5, rtol=0)
print("same tokens (greedy, beam) and logits for", sorted(first))
"""


# the dependency of a transformers release the check runs without (see the docstring), and the setting that does so
KERNELS_SWITCH_OFF = {"kernels": {"USE_HUB_KERNELS": "0"}}

UNMET = """
import importlib.metadata, json
from packaging.requirements import Requirement
unmet = []
for text in importlib.metadata.requires("transformers") or []:
    requirement = Requirement(text)
    if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
        continue  # an extra's requirement
    try:
        installed = importlib.metadata.version(requirement.name)
    except importlib.metadata.PackageNotFoundError:
        installed = None
    if installed is None or not requirement.specifier.contains(installed, prereleases=True):
        unmet.append([requirement.name, str(requirement), installed])
print(json.dumps(unmet))
"""


def requirement_ends(requirement_text: str) -> dict[str, str]:
    """pip requirement of each end of a supported range (`name>=lower...`): `name==lower` and the range itself."""
    from packaging.requirements import Requirement

    requirement = Requirement(requirement_text)
    (lower,) = [spec.version for spec in requirement.specifier if spec.operator == ">="]
    oldest = lower if lower.count(".") == 2 else f"{lower}.0"
    return {"oldest": f"{requirement.name}=={oldest}", "newest": requirement_text}


class Steps:
    """Runs and reports the steps; remembers the failures."""

    def __init__(self):
        self.failures: list[str] = []
        self.count = 0

    def run(self, name: str, command: list[str], fallback: str | None = None, **kwargs) -> subprocess.CompletedProcess:
        """Run one step; with `fallback` (what is done instead), a failure is reported but not counted."""
        start = time.monotonic()
        self.count += 1
        print(f"--- {name}\n    $ {' '.join(command)}", flush=True)
        result = subprocess.run(command, text=True, capture_output=True, **kwargs)
        output = (result.stdout + result.stderr).strip().splitlines()
        for line in output[-25:] if result.returncode else output[-3:]:
            print(f"    {line}")
        verdict = "ok" if result.returncode == 0 else f"FAILED (exit {result.returncode})"
        if result.returncode and fallback is not None:
            verdict = f"not possible (exit {result.returncode}): {fallback}"
        print(f"    {verdict} in {time.monotonic() - start:.0f} s", flush=True)
        if result.returncode and fallback is None:
            self.failures.append(name)
        return result

    def fail(self, name: str) -> None:
        self.count += 1
        self.failures.append(name)
        print(f"--- {name}\n    FAILED", flush=True)


def create_environment(env: Path, end: str, steps: Steps) -> Path:
    """A new virtual environment at `env` that sees this interpreter's site-packages folders after its own; its
    interpreter. It has no pip of its own: this interpreter's pip and setuptools (a new environment's bundled
    setuptools is too old to build the package's wheel) install into it.

    A `.pth` file in its site-packages adds those folders as site folders (so their `.pth` files, the editable
    install's import hook among them, run too). `venv --system-site-packages` would not do: created from a virtual
    environment's interpreter (the README's test command run in a venv), it sees the base installation's folders,
    not the venv's, and neither hf_layerfusion nor the suite's pinned packages would be there."""
    python = env / "bin" / "python"
    if steps.run(f"{end}: environment", [sys.executable, "-m", "venv", "--without-pip", str(env)]).returncode:
        raise SystemExit(f"could not create the virtual environment {env} (above)")
    own = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        text=True, capture_output=True, check=True,
    ).stdout.strip()
    user = [site.getusersitepackages()] if site.ENABLE_USER_SITE else []  # ahead of the others, as here
    folders = [folder for folder in user + site.getsitepackages() if Path(folder).is_dir()]
    Path(own).mkdir(parents=True, exist_ok=True)
    # a .pth line that starts with `import` is executed as the environment's interpreter starts (in a scope a
    # comprehension would not see `site` from)
    (Path(own) / "_range_check_parent_packages.pth").write_text(
        f"import site; list(map(site.addsitedir, {folders!r}))\n", encoding="utf-8"
    )
    return python


def without_package(python: Path, script: str) -> list[str]:
    """`python -S -c` arguments that run `script` with the environment's site-packages folders (its own, then those
    of the interpreter running the check, `create_environment`) but not their .pth files (the editable install's
    import hook), asserting that hf_layerfusion cannot be imported."""
    site_packages = json.loads(subprocess.run(
        [str(python), "-c", "import json, sys; print(json.dumps([p for p in sys.path if p.endswith('site-packages')]))"],
        text=True, capture_output=True, check=True,
    ).stdout)
    preamble = (
        f"import sys\nsys.path.extend({site_packages!r})\n"
        "try:\n    import hf_layerfusion\nexcept ModuleNotFoundError:\n    pass\n"
        "else:\n    raise SystemExit('hf_layerfusion is importable in the process without the package')\n"
    )
    return ["-S", "-c", preamble + script]


def download_release(python: Path, end: str, requirement_text: str, folder: Path, steps: Steps) -> tuple[str, list[str]]:
    """`name==version` of the newest release matching `requirement_text` on the package index (whatever its
    dependencies), and the requirements its wheel's metadata states."""
    result = steps.run(
        f"{end}: the release on the index",
        [str(python), "-m", "pip", "download", "-q", "--no-deps", "--dest", str(folder), requirement_text],
    )
    if result.returncode:
        raise SystemExit(f"no release of {requirement_text} on the package index")
    (wheel,) = folder.glob("*.whl")
    name, version = wheel.name.split("-")[:2]
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [entry for entry in archive.namelist() if entry.endswith(".dist-info/METADATA")]
        message = email.parser.Parser().parsestr(archive.read(metadata).decode("utf-8"))
    return f"{name}=={version}", message.get_all("Requires-Dist") or []


def pinned_constraints(
    constraints: dict[str, str], release: str, requires: list[str], free: frozenset[str] = frozenset()
) -> tuple[str, list[str]]:
    """The test constraints for one end (a constraints file's text): every pin but the released package's own, those
    the release itself rules out (its `requires`, extras' requirements aside), which pip then chooses, and the `free`
    ones (torch with `--torch-ends`). Returns the text and what was left unpinned, one line each."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    released = canonicalize_name(release.split("==")[0])
    needs = {}
    for text in requires:
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            needs[canonicalize_name(requirement.name)] = requirement
    lines, unpinned = [], []
    for name, version in sorted(constraints.items()):
        name = canonicalize_name(name)
        if name == released:
            continue
        if name in free:
            unpinned.append(f"{name}=={version} (installed at this end of its own range)")
            continue
        if name in needs and not needs[name].specifier.contains(version, prereleases=True):
            unpinned.append(f"{name}=={version} (the release requires {needs[name]})")
            continue
        lines.append(f"{name}=={version}")
    return "\n".join(lines) + "\n", unpinned


def install_transformers(python: Path, end: str, release: str, constraints: Path, steps: Steps) -> dict[str, str]:
    """Install `release` with its dependencies, pinned by `constraints`, or without the ones the index lacks (see the
    docstring); returns the environment settings the end's steps run with."""
    command = [str(python), "-m", "pip", "install", "-q", "--upgrade", "-c", str(constraints), release]
    result = steps.run(f"{end}: install {release}", command, fallback="the release without its dependencies")
    if result.returncode == 0:
        return {}
    steps.run(f"{end}: install {release} without its dependencies", [*command, "--no-deps"])
    unmet = json.loads(subprocess.run([str(python), "-c", UNMET], text=True, capture_output=True, check=True).stdout)
    settings: dict[str, str] = {}
    for name, requirement, installed in unmet:
        if name in KERNELS_SWITCH_OFF:
            settings |= KERNELS_SWITCH_OFF[name]
            print(f"    {requirement} is not installable here (installed: {installed}): the steps of this end run with "
                  f"{KERNELS_SWITCH_OFF[name]}", flush=True)
        else:
            steps.fail(f"{end}: {release} needs {requirement}, which the index lacks (installed: {installed})")
    return settings


# the transformers releases the last passing check of the whole range ran (committed): tests/test_packaging.py holds
# the range's ceiling to its newest, so a ceiling widened past what was checked fails the suite until the check ran
CHECKED_RANGE = REPO_ROOT / "tools" / "transformers_range_checked.json"


def record_checked_range(versions: dict[str, dict[str, str]], requirement: str, path: Path = CHECKED_RANGE) -> None:
    """Write the transformers release each end of a passing check ran (`versions`) beside the `requirement` it
    checked, through a temporary file renamed into place."""
    record = {"requirement": requirement, **{end: versions[end]["transformers"] for end in ENDS}}
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    os.replace(temporary, path)
    print(f"recorded the checked releases in {path}: commit it", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ends", nargs="+", choices=ENDS, default=list(ENDS), help="Which ends of the range to check.")
    parser.add_argument("--workdir", type=Path, help="Where the environments and models go (default: a temporary folder).")
    parser.add_argument("--keep", action="store_true", help="Keep the work folder.")
    parser.add_argument("--tests", nargs="*", default=list(TEST_SUBSETS), help="Test files to run at each end.")
    parser.add_argument(
        "--constraints", type=Path, default=CONSTRAINTS,
        help="The test constraints every package but transformers (and what it requires otherwise) is pinned to.",
    )
    parser.add_argument(
        "--torch-ends", action="store_true",
        help="Install torch at the same end of its requirement in each environment (torch==2.6.0 / the newest).",
    )
    args = parser.parse_args(argv)
    if args.workdir is not None and args.workdir.exists() and not args.workdir.is_dir():
        parser.error(f"--workdir {args.workdir} is a file, not a folder: give a new or empty folder.")
    if args.workdir is not None and args.workdir.exists() and any(args.workdir.iterdir()):
        parser.error(f"--workdir {args.workdir} is not empty: give a new or empty folder (nothing there is replaced).")
    if args.constraints.is_dir():
        parser.error(f"--constraints {args.constraints} is a folder, not a constraints file: name the file itself.")
    if not args.constraints.is_file():
        parser.error(f"--constraints {args.constraints} does not exist.")
    # stopped with SIGTERM (kill, a CI timeout), the work folder (environments, hundreds of MB) is removed as at a
    # normal end: the signal raises SystemExit, so the `finally` below runs and subprocess.run kills the step's child
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    sys.path.insert(0, str(REPO_ROOT))
    from hf_layerfusion.version import TORCH_REQUIREMENT, TRANSFORMERS_REQUIREMENT

    transformers_ends = requirement_ends(TRANSFORMERS_REQUIREMENT)
    torch_ends = requirement_ends(TORCH_REQUIREMENT)
    steps = Steps()
    pythons: dict[str, Path] = {}
    versions: dict[str, dict[str, str]] = {}
    labels: dict[str, str] = {}
    env_settings: dict[str, dict[str, str]] = {}
    workdir = None
    try:
        # made inside the `try`, so that a SIGTERM from here on removes it
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="transformers-range-"))
        workdir.mkdir(parents=True, exist_ok=True)
        for end in args.ends:
            python = create_environment(workdir / f"env-{end}", end, steps)
            if args.torch_ends:
                # --upgrade: the newest torch of its range, not the one this interpreter has
                steps.run(f"{end}: install {torch_ends[end]}",
                          [str(python), "-m", "pip", "install", "-q", "--upgrade", torch_ends[end]])
            release, requires = download_release(python, end, transformers_ends[end], workdir / f"release-{end}", steps)
            text, unpinned = pinned_constraints(
                read_constraints(args.constraints), release, requires, frozenset({"torch"} if args.torch_ends else ())
            )
            end_constraints = workdir / f"constraints-{end}.txt"
            end_constraints.write_text(text, encoding="utf-8")
            print(f"    {end}: pinned to {args.constraints.name} but for {release}"
                  + "".join(f"\n      unpinned: {line}" for line in unpinned), flush=True)
            env_settings[end] = install_transformers(python, end, release, end_constraints, steps)
            versions[end] = json.loads(subprocess.run(
                [str(python), "-c", VERSIONS], text=True, capture_output=True, check=True,
            ).stdout)
            labels[end] = f"transformers {versions[end]['transformers']} (torch {versions[end]['torch']})" + "".join(
                f" with {name}={value}" for name, value in env_settings[end].items()
            )
            print(f"    {end} end: {labels[end]}", flush=True)
            pythons[end] = python
            if args.tests:
                steps.run(
                    f"{end}: tests under {labels[end]}",
                    [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.tests],
                    cwd=REPO_ROOT, env=os.environ | env_settings[end],
                )
            saved = workdir / f"saved-{end}"
            saved.mkdir()
            steps.run(
                f"{end}: save every family with the package",
                [str(python), "-c", SAVE.format(tests=str(REPO_ROOT / "tests"), out=str(saved))],
                cwd=workdir, env=os.environ | env_settings[end],
            )
        families = sorted(path.name for path in (workdir / f"saved-{args.ends[0]}").iterdir() if path.is_dir())
        for saved_end in args.ends:
            for loading_end in args.ends:
                result = workdir / f"saved-{saved_end}-run-{loading_end}.pt"
                script = RUN_REMOTE.format(saved=str(workdir / f"saved-{saved_end}"), result=str(result), families=families)
                steps.run(
                    f"saved under {labels[saved_end]}, loaded by remote code under {labels[loading_end]}",
                    [str(pythons[loading_end]), *without_package(pythons[loading_end], script)],
                    cwd=workdir, env=os.environ | env_settings[loading_end],
                )
        if len(args.ends) == 2:
            for saved_end in args.ends:
                runs = [workdir / f"saved-{saved_end}-run-{end}.pt" for end in args.ends]
                steps.run(
                    f"saved under {labels[saved_end]}: remote code under {' and '.join(labels.values())} agree",
                    [sys.executable, "-c", COMPARE.format(first=str(runs[0]), second=str(runs[1]))],
                )
    finally:
        if workdir is not None and not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({"versions": versions, "failed": steps.failures}))
    print(f"steps: {steps.count - len(steps.failures)} passed, {len(steps.failures)} failed")
    if not steps.failures and sorted(versions) == sorted(ENDS) and args.tests == list(TEST_SUBSETS):
        record_checked_range(versions, TRANSFORMERS_REQUIREMENT)
    return 1 if steps.failures else 0


if __name__ == "__main__":
    sys.exit(main())
