"""transformers' own common model tests (ModelTesterMixin, GenerationTesterMixin, ConfigTester, PipelineTesterMixin)
for every family of `hf_layerfusion.FAMILIES`, through the harness tests/hf_common/test_external_layerfusion.py.

The HF mixins live in ../shared/hf-common-tests (transformers ships no tests in its wheel); they import `tests.…` of
that tree, so they run in a scratch copy of it (as its README shows), in a subprocess. What runs: every test of the
four mixins for every family, the harness's own checks, and the harness's documented overrides where a family differs
by design; nothing is deselected. The HF suite's own skips (GPU, flash attention, slow, pipeline, Hub tests, ...)
are what Marian's reference run skips too. Two xdist workers (the suite's machine has 2 cores).
"""

import collections
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import transformers
from helpers import TINY_CONFIGS_DIR, require_shared

HF_COMMON_TESTS = Path(__file__).resolve().parents[2] / "shared" / "hf-common-tests"
HARNESS = Path(__file__).resolve().parent / "hf_common" / "test_external_layerfusion.py"
TIMEOUT_S = 1800
# Outcomes of each family's test class, exactly: a common test that turns into a skip (or a class that goes missing)
# fails here. Measured with transformers 5.23 and ../shared/hf-common-tests; the skips are the HF suite's own (GPU,
# flash attention, slow, pipeline, Hub, ...), as in Marian's reference run. When transformers or the shared tests
# change, re-measure (the failure prints the table) and check that each new skip is one Marian's run has too.
EXPECTED_PER_FAMILY = {"passed": 138, "skipped": 143}


def test_transformers_common_tests_pass_for_every_family(tmp_path):
    require_shared(HF_COMMON_TESTS, "transformers' common tests")
    tree = tmp_path / "hf-common-tests"
    shutil.copytree(HF_COMMON_TESTS, tree)
    for path in [tree, *tree.rglob("*")]:  # the shared copy is read-only
        path.chmod(path.stat().st_mode | 0o200)
    (tree / "src").mkdir()
    (tree / "src" / "transformers").symlink_to(Path(transformers.__file__).parent)
    (tree / "external").mkdir()
    shutil.copy(HARNESS, tree / "external")
    shutil.copytree(TINY_CONFIGS_DIR, tree / "external" / TINY_CONFIGS_DIR.name)
    env = dict(os.environ, HF_HUB_OFFLINE="1", RUN_PIPELINE_TESTS="0")
    report = tmp_path / "report.xml"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rfE", "--timeout=600", "-n", "2"]
    result = subprocess.run(
        [*command, f"--junitxml={report}", "external/"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    output = result.stdout + result.stderr
    assert report.is_file(), f"no test report (exit code {result.returncode}):\n{output[-6000:]}"
    per_class = results_per_test_class(report)
    table = "\n".join(f"  {name}: {dict(counts)}" for name, counts in sorted(per_class.items()))
    print(f"transformers' common tests per family:\n{table}")
    failures = "\n".join(line for line in output.splitlines() if line.startswith(("FAILED", "ERROR")))
    assert not failures and result.returncode == 0, (
        f"transformers' common tests failed:\n{table}\n{failures}\n--- end of output ---\n{output[-4000:]}"
    )
    import hf_layerfusion

    for config_class, _, _ in hf_layerfusion.FAMILIES.values():
        name = config_class.__name__.removesuffix("Config") + "ModelTest"
        assert dict(per_class.get(name, {})) == EXPECTED_PER_FAMILY, (
            f"{name}: {dict(per_class.get(name, {}))} instead of {EXPECTED_PER_FAMILY}; a test that stopped running "
            f"(a new skip) or a family whose class went missing. Per family:\n{table}"
        )


def results_per_test_class(junit_xml: Path) -> dict[str, collections.Counter]:
    """`{test class: Counter(passed=.., failed=.., skipped=..)}` from a pytest JUnit XML report."""
    per_class = collections.defaultdict(collections.Counter)
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        per_class[case.get("classname").rsplit(".", 1)[-1]][outcome] += 1
    return per_class
