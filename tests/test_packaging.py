"""The transformers range the package supports is stated once, `hf_layerfusion.version.TRANSFORMERS_REQUIREMENT`, and
setup.cfg's `install_requires`, the model cards and the Hub code saved with every model state that same range; the
package and the Hub code refuse to import under a release outside it, naming both. A built wheel carries the
package's non-Python files."""

import configparser
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from helpers import REPO_ROOT, SOURCES, fake_package_versions, tiny_model, tiny_tokenizer
from packaging.requirements import Requirement
from packaging.version import Version

import hf_layerfusion
from hf_layerfusion.inference.cpu_kernels import kernel_cache_root
from hf_layerfusion.version import TORCH_REQUIREMENT, TRANSFORMERS_REQUIREMENT


def setup_requirements(section: str, key: str) -> list[Requirement]:
    """The requirements setup.cfg lists under `key` of `section`."""
    setup = configparser.ConfigParser()
    setup.read(REPO_ROOT / "setup.cfg", encoding="utf-8")
    return [Requirement(line) for line in setup[section][key].split("\n") if line.strip()]


def installed_requirement(name: str) -> Requirement:
    (requirement,) = [
        requirement for requirement in setup_requirements("options", "install_requires") if requirement.name == name
    ]
    return requirement


def test_setup_cfg_requires_the_stated_range():
    assert installed_requirement("transformers") == Requirement(TRANSFORMERS_REQUIREMENT)
    assert installed_requirement("torch") == Requirement(TORCH_REQUIREMENT)
    import torch
    import transformers

    # the suite runs inside both
    assert transformers.__version__ in Requirement(TRANSFORMERS_REQUIREMENT).specifier
    assert Requirement(TORCH_REQUIREMENT).specifier.contains(torch.__version__, prereleases=True)


def _fake_version(package: str, version: str) -> str:
    """Code that makes `importlib.metadata` report `version` of `package` to everything imported after it."""
    return fake_package_versions({package: version})


def test_torch_floor_is_the_one_transformers_enforces(tmp_path):
    """transformers disables torch below the floor (so the package cannot work there) and accepts the floor itself."""
    (floor,) = [spec.version for spec in Requirement(TORCH_REQUIREMENT).specifier if spec.operator == ">="]
    below = f"{floor.split('.')[0]}.{int(floor.split('.')[1]) - 1}.9"
    check = "from transformers.utils import is_torch_available\nprint(is_torch_available())\n"
    answers = {version: _run(_fake_version("torch", version) + check, tmp_path) for version in (below, f"{floor}.0")}
    assert [answers[version].stdout.split() for version in answers] == [["False"], ["True"]], answers


def test_model_card_and_hub_code_state_the_range(tmp_path):
    model = tiny_model("plain_transformer")
    model.save_pretrained(tmp_path)
    card = hf_layerfusion.write_model_card(tmp_path, model, "de", "en", "tiny").read_text(encoding="utf-8")
    assert f"Requires `{TRANSFORMERS_REQUIREMENT}` and `{TORCH_REQUIREMENT}`" in card
    hub_code = (tmp_path / "modeling_layerfusion.py").read_text(encoding="utf-8")
    header = re.match(r'"""(.*?)"""', hub_code, flags=re.DOTALL).group(1)
    assert f"Requires {TRANSFORMERS_REQUIREMENT} and {TORCH_REQUIREMENT} " in header


def first_release_above(requirement_text: str) -> str:
    """The release a `<X.Y` ceiling first excludes, `X.Y.0`: the one a user who keeps current meets next."""
    (ceiling,) = [spec.version for spec in Requirement(requirement_text).specifier if spec.operator == "<"]
    return ceiling if ceiling.count(".") == 2 else f"{ceiling}.0"


# what `import hf_layerfusion` or the Hub code sees when the installed transformers is the first release above the range
ABOVE_THE_RANGE = first_release_above(TRANSFORMERS_REQUIREMENT)
_FAKE_TRANSFORMERS_ABOVE = _fake_version("transformers", ABOVE_THE_RANGE)


def _run(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_the_ceiling_is_the_next_minor_release_after_the_newest_the_range_check_passed():
    """Issue 73: a ceiling widened in version.py and setup.cfg past the newest release the range check ran passed the
    suite. `tools/check_transformers_range.py` records the releases of its last passing run of both ends (committed);
    the first release the range refuses must be the next minor release after that newest one, and the floor its
    oldest: a wider range needs the check run first."""
    record = json.loads((REPO_ROOT / "tools" / "transformers_range_checked.json").read_text(encoding="utf-8"))
    newest = Version(record["newest"])
    (floor,) = [spec.version for spec in Requirement(TRANSFORMERS_REQUIREMENT).specifier if spec.operator == ">="]
    hint = f"{TRANSFORMERS_REQUIREMENT} is not the range `python tools/check_transformers_range.py` last passed on"
    assert Version(ABOVE_THE_RANGE) == Version(f"{newest.major}.{newest.minor + 1}.0"), hint
    assert Version(floor) == Version(record["oldest"]), hint


def test_import_refuses_a_transformers_release_outside_the_range(tmp_path):
    assert ABOVE_THE_RANGE not in Requirement(TRANSFORMERS_REQUIREMENT).specifier
    result = _run(_FAKE_TRANSFORMERS_ABOVE + "import hf_layerfusion\n", tmp_path)
    assert result.returncode != 0
    assert f"found transformers=={ABOVE_THE_RANGE}" in result.stderr and f"pip install '{TRANSFORMERS_REQUIREMENT}'" in result.stderr
    assert _run("import hf_layerfusion\n", tmp_path).returncode == 0  # the installed release passes


def test_import_refuses_a_torch_release_below_the_floor(tmp_path):
    result = _run(_fake_version("torch", "2.5.1") + "import hf_layerfusion\n", tmp_path)
    assert result.returncode != 0
    assert "found torch==2.5.1" in result.stderr and f"pip install '{TORCH_REQUIREMENT}'" in result.stderr


def test_hub_code_refuses_a_transformers_release_outside_the_range(tmp_path):
    tiny_model("plain_transformer").save_pretrained(tmp_path / "model")
    hub_code = (tmp_path / "model" / "modeling_layerfusion.py").read_text(encoding="utf-8")
    # the check runs before any definition of the file
    assert hub_code.index("_require_version(") < min(hub_code.index("\nclass "), hub_code.index("\ndef "))
    hub_file = tmp_path / "model" / "modeling_layerfusion.py"
    result = _run(_FAKE_TRANSFORMERS_ABOVE + f"exec(compile(open({str(hub_file)!r}).read(), 'hub', 'exec'), {{}})\n", tmp_path)
    assert result.returncode != 0 and f"found transformers=={ABOVE_THE_RANGE}" in result.stderr


# run by the wheel's environment, from a folder where the checkout is not importable: what a user of the wheel does
WHEEL_USER = """
import importlib.metadata, json, os, subprocess, sys
from pathlib import Path
import torch
import hf_layerfusion
from transformers import AutoModelForSeq2SeqLM

environment = Path(sys.prefix)
assert Path(hf_layerfusion.__file__).is_relative_to(environment), hf_layerfusion.__file__  # the installed copy
sys.path.insert(0, {tests!r})  # tests/helpers.py: the tiny configs; it imports the installed package
from helpers import tiny_model
from hf_layerfusion.inference.cpu_kernels import compiled_kernels

kernels = compiled_kernels()
assert kernels is not None, "the installed copy's CPU kernels did not compile"
assert Path(kernels.__file__).is_relative_to(os.environ["TORCH_EXTENSIONS_DIR"]), kernels.__file__
inputs = dict(input_ids=torch.tensor([[5, 6, 7, 2], [8, 9, 2, 1]]), attention_mask=torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]))
for model_type in hf_layerfusion.FAMILIES:
    model = tiny_model(model_type)
    for search in (dict(num_beams=1), dict(num_beams=3)):
        expected = model.generate(**inputs, max_new_tokens=6, do_sample=False, **search)
        fast = hf_layerfusion.fast_generate(model, **inputs, max_new_tokens=6, do_sample=False, fallback=False, **search)
        assert fast.tolist() == expected.tolist(), (model_type, search)
    model.save_pretrained({out!r} + "/" + model_type)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained({out!r} + "/" + model_type).eval()
    assert type(reloaded) is type(model), type(reloaded)
    assert reloaded.generate(**inputs, max_new_tokens=6).tolist() == model.generate(**inputs, max_new_tokens=6).tolist()
scripts = sorted(
    entry.name for entry in importlib.metadata.distribution("hf_layerfusion").entry_points if entry.group == "console_scripts"
)
# the first --help renders the text (the scripts side by side: each imports torch and transformers), the second
# prints it from the cache
rendering = {{script: subprocess.Popen([str(environment / "bin" / script), "--help"], stdout=subprocess.PIPE)
             for script in scripts}}
for script, process in rendering.items():
    first = process.communicate()[0]
    cached = subprocess.run([str(environment / "bin" / script), "--help"], check=True, capture_output=True).stdout
    assert process.returncode == 0 and first.startswith(b"usage: ") and cached == first, script
    assert Path(os.environ["XDG_CACHE_HOME"], "hf_layerfusion", "help", script + ".json").is_file(), script
print(json.dumps({{"families": sorted(hf_layerfusion.FAMILIES), "console_scripts": scripts}}))
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel, built from a copy without the checkout's build outputs: setuptools puts what an earlier build left in
    build/lib into the wheel, which would hide a module the package lists no more."""
    directory = tmp_path_factory.mktemp("wheel")
    sources = directory / "sources"
    shutil.copytree(REPO_ROOT, sources, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "runs", "__pycache__"))
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(directory), str(sources)],
        check=True,
    )
    (built,) = directory.glob("hf_layerfusion-*.whl")
    return built


def distribution_of(entry: Path) -> str:
    """The distribution a top-level entry of a site folder belongs to, by its name (`datasets`,
    `datasets-4.0.0.dist-info`, `sentencepiece.libs` -> `datasets`, `datasets`, `sentencepiece`)."""
    return re.split(r"[-.]", entry.name)[0].lower().replace("_", "-")


def install_wheel(wheel: Path, environment: Path, leave_out: tuple[str, ...] = ()) -> Path:
    """A fresh virtual environment at `environment` with `wheel` installed and no other copy of the package; its python.

    Its dependencies come from this environment, read through a path file, not as site folders, so that the editable
    install's import hook stays out. Without the distributions `leave_out` (their modules and their metadata): the
    path file then names folders that link every entry of this environment's site folders but theirs."""
    subprocess.run([sys.executable, "-m", "venv", str(environment)], check=True)
    python = environment / "bin" / "python"
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    dependencies = [Path(path) for path in sys.path if Path(path).name == "site-packages"]
    if leave_out:
        visible = []
        for number, site in enumerate(dependencies):
            folder = environment / f"dependencies_{number}"
            folder.mkdir()
            for entry in site.iterdir():
                if distribution_of(entry) not in leave_out:
                    (folder / entry.name).symlink_to(entry)
            visible.append(folder)
        dependencies = visible
    (Path(purelib) / "dependencies_of_this_test.pth").write_text("\n".join(map(str, dependencies)) + "\n", encoding="utf-8")
    # --ignore-installed: the hf_layerfusion this environment sees through the path file (an editable install of the
    # same version) must not count as already installed
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--ignore-installed", str(wheel)], check=True)
    return python


def run_outside_the_checkout(python: Path, code: str, directory: Path, first_kernel_build: bool = False) -> dict:
    """`code` run by `python` from an empty folder, without the checkout on its path, with a cache folder of its own
    (the console scripts' help texts: neither read from nor left in this user's); the JSON its last line prints.

    The kernels: with `first_kernel_build`, built from the installed copy's sources into an extensions root of its
    own, as on a user's machine that has no build yet (a minute); else this process's build, found by the installed
    copy as by any installation of the same sources (the key is the sources' hash, so a missing or changed source
    file would not find it)."""
    outside = directory / "outside"
    outside.mkdir()
    environment_variables = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}  # no checkout
    environment_variables["XDG_CACHE_HOME"] = str(directory / "cache")
    # set either way: torch's default extensions root lies under XDG_CACHE_HOME
    environment_variables["TORCH_EXTENSIONS_DIR"] = str(
        directory / "torch_extensions" if first_kernel_build else kernel_cache_root()
    )
    result = subprocess.run(
        [str(python), "-c", code], capture_output=True, text=True, cwd=outside, env=environment_variables, timeout=1500
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_the_built_wheel_works_outside_the_checkout(wheel, tmp_path):
    """The wheel, installed into a fresh environment, works from a folder outside the checkout: every family builds,
    the fast path gives generate()'s tokens (greedy and beam), models save and reload through the Auto classes, and
    every console script answers --help. It carries the kernels' sources, the card templates and the metric scripts,
    and not the study."""
    names = zipfile.ZipFile(wheel).namelist()
    package = REPO_ROOT / "hf_layerfusion"
    for pattern in ("**/*.py", "hub/model_card_templates/*.md", "training/metrics/*/*.py", "inference/kernels/*.*"):
        expected = {f"hf_layerfusion/{path.relative_to(package).as_posix()}" for path in package.glob(pattern)}
        assert expected and expected <= set(names), (pattern, sorted(expected - set(names)))
    # the console scripts' launchers (a module beside the package)
    assert "hf_layerfusion_cli.py" in names
    # the study (study/: its modules and committed results) is the repository's, not the package's
    assert not [name for name in names if name.startswith("study/")]

    python = install_wheel(wheel, tmp_path / "env")
    code = WHEEL_USER.format(tests=str(REPO_ROOT / "tests"), out=str(tmp_path / "saved"))
    report = run_outside_the_checkout(python, code, tmp_path, first_kernel_build=True)
    assert report["families"] == sorted(hf_layerfusion.FAMILIES)
    assert report["console_scripts"], "the wheel declares no console script"


def extra_requirements(extra: str) -> set[str]:
    return {requirement.name for requirement in setup_requirements("options.extras_require", extra)}


def test_the_training_requirements_are_the_train_extra_and_the_test_extra_holds_it():
    """The packages training/ checks for are those of the `train` extra (not of a plain install), and `.[test]` installs
    all of them: the suite trains."""
    from hf_layerfusion.training import TRAINING_REQUIREMENTS

    assert set(TRAINING_REQUIREMENTS) <= extra_requirements("train")
    installed = {requirement.name for requirement in setup_requirements("options", "install_requires")}
    assert not set(TRAINING_REQUIREMENTS) & installed
    assert extra_requirements("train") <= extra_requirements("test")


# run by an environment of the wheel without the `train` extra: what a user who only translates does
TRANSLATION_USER = """
import importlib.util, json, subprocess, sys
from pathlib import Path

missing = {training!r}
assert [name for name in missing if importlib.util.find_spec(name) is not None] == []
import hf_layerfusion
from transformers import AutoModelForSeq2SeqLM, pipeline
from hf_layerfusion.translation.tokenizer import load_tokenizer

sources = {sources!r}
model = AutoModelForSeq2SeqLM.from_pretrained({model!r}).eval()
translated = hf_layerfusion.translate(model, load_tokenizer({model!r}), sources, max_new_tokens=6)
translator = pipeline("layerfusion-translation", model={model!r})
piped = [record["translation_text"] for record in translator(sources, max_new_tokens=6)]
command = subprocess.run(
    [str(Path(sys.prefix) / "bin" / "hf-layerfusion-translate"), {model!r}, "--max_new_tokens", "6"],
    input="\\n".join(sources) + "\\n", capture_output=True, text=True, check=True,
).stdout.splitlines()
imported = sorted(name for name in missing if name in sys.modules)
try:
    hf_layerfusion.LayerFusionSeq2SeqTrainer
    training_error = None
except ModuleNotFoundError as error:
    training_error = str(error)
training_command = subprocess.run(
    [str(Path(sys.prefix) / "bin" / "hf-layerfusion-train"), "--help"], capture_output=True, text=True
)
print(json.dumps(dict(
    translated=translated, piped=piped, command=command, imported=imported, training_error=training_error,
    training_command=[training_command.returncode, training_command.stderr.strip().splitlines()[-1:]],
)))
"""


def test_translating_needs_no_training_extra(wheel, tmp_path):
    """The wheel installed without extras, where none of the `train` extra's packages can be imported: a saved model
    loads through the Auto classes and translates through `translate()`, the pipeline and the translate command, as
    it does here, without importing any of them; the trainer and the training command are then an error naming the
    extra."""
    from hf_layerfusion.training import TRAINING_REQUIREMENTS

    model, tokenizer = tiny_model("gtrans"), tiny_tokenizer()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    expected = hf_layerfusion.translate(model, tokenizer, SOURCES, max_new_tokens=6)

    python = install_wheel(wheel, tmp_path / "env", leave_out=TRAINING_REQUIREMENTS)
    code = TRANSLATION_USER.format(training=TRAINING_REQUIREMENTS, sources=SOURCES, model=str(tmp_path / "model"))
    report = run_outside_the_checkout(python, code, tmp_path)
    assert report["translated"] == report["piped"] == report["command"] == expected
    assert report["imported"] == []
    assert 'pip install "hf_layerfusion[train]"' in report["training_error"], report["training_error"]
    returncode, last_error_line = report["training_command"]
    assert returncode != 0 and 'pip install "hf_layerfusion[train]"' in last_error_line[0], last_error_line


def test_import_names_a_private_transformers_method_that_changed(tmp_path):
    """A release in which a private name the package needs (`hf_layerfusion.compat`) is gone or takes other parameters
    fails at import, naming the method, the installed release and the supported range."""
    for patch, found in (
        ("del GenerationMixin._get_top_k_continuations", "does not define"),
        ("GenerationMixin._flatten_beam_dim = staticmethod(lambda tensors: tensors)", "parameters ('tensors',)"),
    ):
        code = f"from transformers.generation import GenerationMixin\n{patch}\nimport hf_layerfusion\n"
        result = _run(code, tmp_path)
        assert result.returncode != 0
        message = result.stderr.strip().splitlines()[-1]
        assert message.startswith("ImportError: ") and found in message, message
        assert f"pip install '{TRANSFORMERS_REQUIREMENT}'" in message


def test_wheel_and_sdist_pass_twine_check(tmp_path):
    """The README is the long description of both distributions (setup.cfg: `long_description = file: README.md`);
    PyPI refuses an upload whose description does not render, and `twine check --strict` says so before an upload
    does. Both are built by the build backend itself (`setuptools.build_meta`, what `python -m build` calls), from a
    copy without the checkout's build outputs."""
    sources = tmp_path / "sources"
    shutil.copytree(REPO_ROOT, sources, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "runs", "__pycache__"))
    dist = tmp_path / "dist"
    dist.mkdir()
    for hook in ("build_sdist", "build_wheel"):  # one process each, as a build frontend calls them
        build = f"import sys; from setuptools import build_meta; build_meta.{hook}(sys.argv[1])"
        subprocess.run([sys.executable, "-c", build, str(dist)], cwd=sources, check=True, capture_output=True, text=True)
    distributions = sorted(dist.glob("hf_layerfusion-*"))
    assert sorted(path.suffix for path in distributions) == [".gz", ".whl"], distributions
    # the sdist carries the console scripts' launchers too, a module beside the package (the wheel: the test above)
    (sdist,) = dist.glob("*.tar.gz")
    with tarfile.open(sdist) as archive:
        assert any(name.endswith("/hf_layerfusion_cli.py") for name in archive.getnames())
    result = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, distributions)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("PASSED") == 2, result.stdout
