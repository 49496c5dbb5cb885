"""The transformers range the package supports is stated once, `hf_layerfusion.version.TRANSFORMERS_REQUIREMENT`, and
setup.cfg's `install_requires`, the model cards and the Hub code saved with every model state that same range."""

import configparser
import re

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
