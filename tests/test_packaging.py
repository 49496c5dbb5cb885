"""The transformers range the package supports is stated once, `hf_layerfusion.version.TRANSFORMERS_REQUIREMENT`, and
setup.cfg's `install_requires`, the model cards and the Hub code saved with every model state that same range; the
package and the Hub code refuse to import under a release outside it, naming both. A built wheel carries the
package's non-Python files."""

import configparser
import re
import subprocess
import sys
import zipfile

from helpers import REPO_ROOT, tiny_model
from packaging.requirements import Requirement

import hf_layerfusion
from hf_layerfusion.version import TRANSFORMERS_REQUIREMENT


def installed_transformers_requirement() -> Requirement:
    setup = configparser.ConfigParser()
    setup.read(REPO_ROOT / "setup.cfg", encoding="utf-8")
    requirements = [Requirement(line) for line in setup["options"]["install_requires"].split("\n") if line.strip()]
    (transformers,) = [requirement for requirement in requirements if requirement.name == "transformers"]
    return transformers


def test_setup_cfg_requires_the_stated_range():
    assert installed_transformers_requirement() == Requirement(TRANSFORMERS_REQUIREMENT)
    import transformers

    assert transformers.__version__ in Requirement(TRANSFORMERS_REQUIREMENT).specifier  # the suite runs inside it


def test_model_card_and_hub_code_state_the_range(tmp_path):
    model = tiny_model("plain_transformer")
    model.save_pretrained(tmp_path)
    card = hf_layerfusion.write_model_card(tmp_path, model, "de", "en", "tiny").read_text(encoding="utf-8")
    assert f"Requires `{TRANSFORMERS_REQUIREMENT}`" in card
    hub_code = (tmp_path / "modeling_layerfusion.py").read_text(encoding="utf-8")
    header = re.match(r'"""(.*?)"""', hub_code, flags=re.DOTALL).group(1)
    assert f"Requires {TRANSFORMERS_REQUIREMENT} " in header


# what `import hf_layerfusion` or the Hub code sees when the installed transformers is 5.25.0 (outside the range)
_FAKE_TRANSFORMERS_5_25 = (
    "import importlib.metadata as metadata\n"
    "real_version = metadata.version\n"
    "metadata.version = lambda name: '5.25.0' if name == 'transformers' else real_version(name)\n"
)


def _run(code: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=300)


def test_import_refuses_a_transformers_release_outside_the_range(tmp_path):
    result = _run(_FAKE_TRANSFORMERS_5_25 + "import hf_layerfusion\n", tmp_path)
    assert result.returncode != 0
    assert "found transformers==5.25.0" in result.stderr and f"pip install '{TRANSFORMERS_REQUIREMENT}'" in result.stderr
    assert _run("import hf_layerfusion\n", tmp_path).returncode == 0  # the installed release passes


def test_hub_code_refuses_a_transformers_release_outside_the_range(tmp_path):
    tiny_model("plain_transformer").save_pretrained(tmp_path / "model")
    hub_code = (tmp_path / "model" / "modeling_layerfusion.py").read_text(encoding="utf-8")
    # the check runs before any definition of the file
    assert hub_code.index("_require_version(") < min(hub_code.index("\nclass "), hub_code.index("\ndef "))
    hub_file = tmp_path / "model" / "modeling_layerfusion.py"
    result = _run(_FAKE_TRANSFORMERS_5_25 + f"exec(compile(open({str(hub_file)!r}).read(), 'hub', 'exec'), {{}})\n", tmp_path)
    assert result.returncode != 0 and "found transformers==5.25.0" in result.stderr


def test_the_wheel_carries_the_files_the_package_reads(tmp_path):
    """An install from a wheel (not editable) has the CPU kernels' sources, the model card templates and the
    metric scripts: without the kernel sources int8 would fall back to the slow path."""
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(REPO_ROOT)],
        check=True,
    )
    (wheel,) = tmp_path.glob("hf_layerfusion-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    from hf_layerfusion.inference.cpu_kernels import KERNEL_DIRECTORY, KERNEL_SOURCES

    package = REPO_ROOT / "hf_layerfusion"
    kernels = package / "inference" / KERNEL_DIRECTORY
    assert {source.name for source in kernels.glob("*.cpp")} == set(KERNEL_SOURCES)  # every source is compiled
    for pattern in ("hub/model_card_templates/*.md", "training/metrics/*/*.py", "inference/kernels/*.*"):
        expected = {f"hf_layerfusion/{path.relative_to(package).as_posix()}" for path in package.glob(pattern)}
        assert expected and expected <= set(names), pattern


def test_import_names_a_private_transformers_method_that_changed(tmp_path):
    """A release in which a private name the package needs (`hf_layerfusion.compat`) is gone or takes other parameters
    fails at import, naming the method, the installed release and the supported range."""
    for patch, found in (
        ("del GenerationMixin._gather_beams", "does not define"),
        ("GenerationMixin._flatten_beam_dim = staticmethod(lambda tensors: tensors)", "parameters ('tensors',)"),
    ):
        code = f"from transformers.generation import GenerationMixin\n{patch}\nimport hf_layerfusion\n"
        result = _run(code, tmp_path)
        assert result.returncode != 0
        message = result.stderr.strip().splitlines()[-1]
        assert message.startswith("ImportError: ") and found in message, message
        assert f"pip install '{TRANSFORMERS_REQUIREMENT}'" in message
