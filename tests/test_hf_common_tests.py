"""transformers' own common model tests (ModelTesterMixin, GenerationTesterMixin, ConfigTester, PipelineTesterMixin)
for every family of `hf_layerfusion.FAMILIES`, through the harness tests/hf_common/test_external_layerfusion.py, held to
Marian's own run of the same tests.

The HF mixins live in ../shared/hf-common-tests (transformers ships no tests in its wheel); they import `tests.…` of
that tree, so they run in a scratch copy of it (as its README shows), in a subprocess. One pytest run holds every
family's test class and Marian's own `MarianModelTest` (the tree's tests/models/marian), so both meet the same
transformers release and the same skips (GPU, flash attention, slow, pipeline, Hub tests, ...). Nothing is deselected.

The check compares each family with Marian test by test, not with counts measured once (they move with every
release): nothing fails, Marian's reference run included; every common test Marian runs exists for the family; every
test Marian passes passes for the family, unless the harness overrides it for that family by design
(`DESIGN_CHOICE_OUTCOMES`, listed by name; the override says why in its docstring). Two xdist workers (the suite's
machine has 2 cores).
"""

import ast
import collections
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path

import pytest
import transformers
from helpers import TINY_CONFIGS_DIR, require_shared

HF_COMMON_TESTS = Path(__file__).resolve().parents[2] / "shared" / "hf-common-tests"
HARNESS = Path(__file__).resolve().parent / "hf_common" / "test_external_layerfusion.py"
MARIAN_TESTS = Path("tests") / "models" / "marian" / "test_modeling_marian.py"
MARIAN_CLASS = "MarianModelTest"
TIMEOUT_S = 1800
# A test Marian passes that a family's harness override answers otherwise, by design: {test name: the family's
# outcome}. Each name must be a method of one of the harness's *DesignChoices classes (checked below); none today,
# because every override runs an equivalent check of the family's own contract (never a bare skip).
DESIGN_CHOICE_OUTCOMES: dict[str, str] = {}


def test_transformers_common_tests_pass_for_every_family_as_for_marian(tmp_path):
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
        [*command, f"--junitxml={report}", "external/", f"{MARIAN_TESTS.as_posix()}::{MARIAN_CLASS}"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    output = result.stdout + result.stderr
    assert report.is_file(), f"no test report (exit code {result.returncode}):\n{output[-6000:]}"
    outcomes = outcomes_per_test(report)
    table = "\n".join(
        f"  {name}: {dict(collections.Counter(tests.values()))}" for name, tests in sorted(outcomes.items())
    )
    print(f"transformers' common tests per class:\n{table}")
    import hf_layerfusion

    families = [config.__name__.removesuffix("Config") + "ModelTest" for config, _, _ in hf_layerfusion.FAMILIES.values()]
    problems = compare_with_marian(
        outcomes,
        families,
        marian_own_tests=own_test_methods(tree / MARIAN_TESTS, MARIAN_CLASS),
        design_choice_outcomes=DESIGN_CHOICE_OUTCOMES,
    )
    failures = "\n".join(line for line in output.splitlines() if line.startswith(("FAILED", "ERROR")))
    assert not problems and result.returncode == 0, (
        "transformers' common tests: the families differ from Marian's run\n"
        + "\n".join(f"  {problem}" for problem in problems)
        + f"\nper class:\n{table}\n{failures}\n--- end of output ---\n{output[-4000:]}"
    )


def test_design_choice_outcomes_name_harness_overrides():
    """Every exempted test is overridden in the harness by a *DesignChoices class (which documents why)."""
    overrides = {
        name
        for class_name in classes_in(HARNESS)
        if class_name.endswith("DesignChoices")
        for name in own_test_methods(HARNESS, class_name)
    }
    assert set(DESIGN_CHOICE_OUTCOMES) <= overrides, set(DESIGN_CHOICE_OUTCOMES) - overrides


def compare_with_marian(
    outcomes: dict[str, dict[str, str]],
    families: list[str],
    marian_own_tests: set[str],
    design_choice_outcomes: dict[str, str],
    marian: str = MARIAN_CLASS,
) -> list[str]:
    """What makes a family's run differ from Marian's, one line each (empty when none does).

    `outcomes`: {test class: {test name: passed | failed | error | skipped}} of one run. Marian's own tests (defined in
    its class, not by the mixins: `marian_own_tests`) are Marian's business; every other test of Marian's is a common
    test, which the family must have and, where Marian passes it, pass (or answer as `design_choice_outcomes` says)."""
    problems = []
    reference = outcomes.get(marian)
    if not reference:
        return [f"{marian} did not run: the reference is missing"]
    for name, outcome in sorted(reference.items()):
        if outcome in ("failed", "error"):
            problems.append(f"{marian}.{name} {outcome}: the reference itself is broken on this release")
    for family in families:
        tests = outcomes.get(family)
        if not tests:
            problems.append(f"{family} did not run (its class is missing)")
            continue
        for name, outcome in sorted(tests.items()):
            if outcome in ("failed", "error"):
                problems.append(f"{family}.{name} {outcome}")
        for name, marian_outcome in sorted(reference.items()):
            outcome = tests.get(name)
            if outcome is None:
                if name not in marian_own_tests:
                    problems.append(f"{family}.{name} is missing: a common test Marian runs ({marian_outcome})")
                continue
            if marian_outcome != "passed" or outcome in ("failed", "error"):
                continue
            expected = design_choice_outcomes.get(name, "passed")
            if outcome != expected:
                problems.append(f"{family}.{name} {outcome}, where Marian's passed (expected: {expected})")
    return problems


def outcomes_per_test(junit_xml: Path) -> dict[str, dict[str, str]]:
    """`{test class: {test name: passed | failed | error | skipped}}` from a pytest JUnit XML report."""
    outcomes = collections.defaultdict(dict)
    for case in ElementTree.parse(junit_xml).getroot().iter("testcase"):
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        outcome = {"failure": "failed"}.get(outcome, outcome)
        outcomes[case.get("classname").rsplit(".", 1)[-1]][case.get("name")] = outcome
    return dict(outcomes)


def classes_in(path: Path) -> list[str]:
    return [node.name for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(node, ast.ClassDef)]


def own_test_methods(path: Path, class_name: str) -> set[str]:
    """Names of the `test_*` methods written in the body of `class_name` in `path` (not inherited ones)."""
    (cls,) = [
        node
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ClassDef) and node.name == class_name
    ]
    return {
        node.name
        for node in cls.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
    }


# --- the comparison, on made-up runs: each planted difference is caught -------------------------------------------
MARIAN_RUN = {"test_a": "passed", "test_b": "skipped", "test_own": "passed", "test_c": "passed"}


@pytest.mark.parametrize(
    "family_run, expected",
    [
        ({"test_a": "passed", "test_b": "skipped", "test_c": "passed"}, []),
        ({"test_a": "passed", "test_b": "passed", "test_c": "passed", "test_extra": "passed"}, []),
        ({"test_a": "skipped", "test_b": "skipped", "test_c": "passed"}, ["F.test_a skipped, where Marian's passed"]),
        ({"test_a": "passed", "test_b": "failed", "test_c": "passed"}, ["F.test_b failed"]),
        ({"test_a": "passed", "test_b": "skipped", "test_c": "passed", "test_x": "error"}, ["F.test_x error"]),
        ({"test_a": "passed", "test_b": "skipped"}, ["F.test_c is missing"]),
        ({}, ["F did not run"]),
    ],
    ids=["same", "family passes more", "family-only skip", "family-only failure", "error", "missing test", "no class"],
)
def test_compare_with_marian_catches_each_difference(family_run, expected):
    outcomes = {MARIAN_CLASS: MARIAN_RUN, "F": family_run}
    problems = compare_with_marian(outcomes, ["F"], marian_own_tests={"test_own"}, design_choice_outcomes={})
    assert len(problems) == len(expected), problems
    for problem, start in zip(problems, expected):
        assert problem.startswith(start), (problem, start)


def test_compare_with_marian_exempts_only_the_named_design_choice():
    family_run = {"test_a": "skipped", "test_b": "skipped", "test_c": "skipped"}
    problems = compare_with_marian(
        {MARIAN_CLASS: MARIAN_RUN, "F": family_run}, ["F"], {"test_own"}, design_choice_outcomes={"test_a": "skipped"}
    )
    assert problems == ["F.test_c skipped, where Marian's passed (expected: passed)"]


def test_compare_with_marian_refuses_a_broken_or_missing_reference():
    assert compare_with_marian({"F": {"test_a": "passed"}}, ["F"], set(), {}) == [
        f"{MARIAN_CLASS} did not run: the reference is missing"
    ]
    broken = {MARIAN_CLASS: {"test_a": "failed"}, "F": {"test_a": "passed"}}
    assert compare_with_marian(broken, ["F"], set(), {})[0].startswith(f"{MARIAN_CLASS}.test_a failed")


def test_outcomes_per_test_reads_a_junit_report(tmp_path):
    report = tmp_path / "report.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="external.x.GTransModelTest" name="test_a"/>'
        '<testcase classname="external.x.GTransModelTest" name="test_b"><skipped message="gpu"/></testcase>'
        '<testcase classname="tests.models.marian.m.MarianModelTest" name="test_a"><failure message="x"/></testcase>'
        '<testcase classname="tests.models.marian.m.MarianModelTest" name="test_c"><error message="y"/></testcase>'
        "</testsuite></testsuites>",
        encoding="utf-8",
    )
    assert outcomes_per_test(report) == {
        "GTransModelTest": {"test_a": "passed", "test_b": "skipped"},
        "MarianModelTest": {"test_a": "failed", "test_c": "error"},
    }
