#!/usr/bin/env python
"""Check the package on the oldest and the newest transformers release of its supported range.

    python tools/check_transformers_range.py                    # both ends of the range (CI runs this)
    python tools/check_transformers_range.py --ends oldest      # one end
    python tools/check_transformers_range.py --keep --workdir /tmp/range   # keep the environments and models
    python tools/check_transformers_range.py --torch-ends       # torch at the same ends too (GBs of CUDA wheels)

The range is `hf_layerfusion.version.TRANSFORMERS_REQUIREMENT` (`>=5.20,<5.25` today): the oldest end is its lower bound
(`transformers==5.20.0`), the newest the newest release pip finds inside it. For each end, a throwaway virtual
environment that sees this interpreter's packages (torch and every other dependency as installed by the README's test
command) gets that transformers release, and runs:

1. the test subsets that touch transformers' API: the family contract, fast generation (token-exact against
   `generate()`), training, the pipeline, checkpoint compatibility, the Hub code and packaging;
2. Hub checkpoints across the range: a tiny model of every family saved with the package under one end loads under the
   other end by its remote code alone (hf_layerfusion not importable) and gives the same greedy and beam-search tokens
   and the same logits (atol 1e-5), both ways.

With `--torch-ends` each end's environment also gets torch at the same end of `hf_layerfusion.version.TORCH_REQUIREMENT`
(`torch==2.6.0` beside the oldest transformers, the newest torch pip finds beside the newest), so the kernels are
compiled against, and the tests run on, both torch releases. PyPI's torch wheels for Linux bring CUDA's (several GB
per end), which is why CI leaves it to a release check (docs/testing.md, *torch versions*).

It prints each step with its result, closes with `steps: N passed, N failed`, and exits non-zero when any step fails.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
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

    def run(self, name: str, command: list[str], **kwargs) -> subprocess.CompletedProcess:
        start = time.monotonic()
        self.count += 1
        print(f"--- {name}\n    $ {' '.join(command)}", flush=True)
        result = subprocess.run(command, text=True, capture_output=True, **kwargs)
        output = (result.stdout + result.stderr).strip().splitlines()
        for line in output[-25:] if result.returncode else output[-3:]:
            print(f"    {line}")
        verdict = "ok" if result.returncode == 0 else f"FAILED (exit {result.returncode})"
        print(f"    {verdict} in {time.monotonic() - start:.0f} s", flush=True)
        if result.returncode:
            self.failures.append(name)
        return result


def without_package(python: Path, script: str) -> list[str]:
    """`python -S -c` arguments that run `script` with the environment's site-packages folders (its own, then the
    system's it sees) but not their .pth files (the editable install's import hook), asserting that hf_layerfusion
    cannot be imported."""
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ends", nargs="+", choices=ENDS, default=list(ENDS), help="Which ends of the range to check.")
    parser.add_argument("--workdir", type=Path, help="Where the environments and models go (default: a temporary folder).")
    parser.add_argument("--keep", action="store_true", help="Keep the work folder.")
    parser.add_argument("--tests", nargs="*", default=list(TEST_SUBSETS), help="Test files to run at each end.")
    parser.add_argument(
        "--torch-ends", action="store_true",
        help="Install torch at the same end of its requirement in each environment (torch==2.6.0 / the newest).",
    )
    args = parser.parse_args(argv)
    if args.workdir is not None and args.workdir.exists() and any(args.workdir.iterdir()):
        parser.error(f"--workdir {args.workdir} is not empty: give a new or empty folder (nothing there is replaced).")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="transformers-range-"))
    workdir.mkdir(parents=True, exist_ok=True)

    sys.path.insert(0, str(REPO_ROOT))
    from hf_layerfusion.version import TORCH_REQUIREMENT, TRANSFORMERS_REQUIREMENT

    transformers_ends = requirement_ends(TRANSFORMERS_REQUIREMENT)
    torch_ends = requirement_ends(TORCH_REQUIREMENT)
    steps = Steps()
    pythons: dict[str, Path] = {}
    versions: dict[str, dict[str, str]] = {}
    labels: dict[str, str] = {}
    try:
        for end in args.ends:
            env = workdir / f"env-{end}"
            python = env / "bin" / "python"
            # without a pip of its own: this interpreter's pip and setuptools (a new environment's bundled setuptools
            # is too old to build the package's wheel) install into it
            steps.run(
                f"{end}: environment",
                [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(env)],
            )
            # --upgrade: the newest release in the range, not the one this interpreter has
            packages = [transformers_ends[end], *([torch_ends[end]] if args.torch_ends else [])]
            steps.run(
                f"{end}: install {' '.join(packages)}",
                [str(python), "-m", "pip", "install", "-q", "--upgrade", *packages],
            )
            versions[end] = json.loads(subprocess.run(
                [str(python), "-c", VERSIONS], text=True, capture_output=True, check=True,
            ).stdout)
            labels[end] = f"transformers {versions[end]['transformers']} (torch {versions[end]['torch']})"
            print(f"    {end} end: {labels[end]}", flush=True)
            pythons[end] = python
            if args.tests:
                steps.run(
                    f"{end}: tests under {labels[end]}",
                    [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", *args.tests],
                    cwd=REPO_ROOT,
                )
            saved = workdir / f"saved-{end}"
            saved.mkdir()
            steps.run(
                f"{end}: save every family with the package",
                [str(python), "-c", SAVE.format(tests=str(REPO_ROOT / "tests"), out=str(saved))],
                cwd=workdir,
            )
        families = sorted(path.name for path in (workdir / f"saved-{args.ends[0]}").iterdir() if path.is_dir())
        for saved_end in args.ends:
            for loading_end in args.ends:
                result = workdir / f"saved-{saved_end}-run-{loading_end}.pt"
                script = RUN_REMOTE.format(saved=str(workdir / f"saved-{saved_end}"), result=str(result), families=families)
                steps.run(
                    f"saved under {labels[saved_end]}, loaded by remote code under {labels[loading_end]}",
                    [str(pythons[loading_end]), *without_package(pythons[loading_end], script)],
                    cwd=workdir,
                )
        if len(args.ends) == 2:
            for saved_end in args.ends:
                runs = [workdir / f"saved-{saved_end}-run-{end}.pt" for end in args.ends]
                steps.run(
                    f"saved under {labels[saved_end]}: remote code under {' and '.join(labels.values())} agree",
                    [sys.executable, "-c", COMPARE.format(first=str(runs[0]), second=str(runs[1]))],
                )
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print(json.dumps({"versions": versions, "failed": steps.failures}))
    print(f"steps: {steps.count - len(steps.failures)} passed, {len(steps.failures)} failed")
    return 1 if steps.failures else 0


if __name__ == "__main__":
    sys.exit(main())
