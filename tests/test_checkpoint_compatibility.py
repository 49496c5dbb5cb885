"""Checkpoints saved before the package was reorganised (commit bfc5945, tests/fixtures/checkpoints_bfc5945, written by
its make_checkpoints.py) still load: with the package, every family's checkpoint computes the logits and greedy output
the old code computed from it; without the package, through the Hub code saved with it (`modeling_layerfusion.py` of
that commit, kept once for all families as `modeling_layerfusion.py.txt`), too, on the transformers releases that code was
written for (before 5.24, whose rename of the cache's output field it predates: under 5.24 such a checkpoint loads with
the package, and saving its config again writes Hub code that runs there, the way a publisher refreshes a checkpoint
whose Hub code a newer transformers release refuses)."""

import json
import shutil
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import run_python, without_package_preamble
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForSeq2SeqLM

import hf_layerfusion
from hf_layerfusion.compat import CACHE_NAME
from hf_layerfusion.version import TRANSFORMERS_REQUIREMENT

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "checkpoints_bfc5945"
REMOTE_CODE_FILE = "modeling_layerfusion.py"
SAVED_FAMILIES = sorted(path.name for path in FIXTURES.iterdir() if path.is_dir())
# the logits of the same computation on the same weights; other torch / transformers versions may round differently
ATOL = 1e-5


def expected_outputs(model_type: str) -> dict[str, torch.Tensor]:
    return load_file(FIXTURES / model_type / "expected.safetensors")


def test_every_family_of_that_commit_was_saved():
    assert SAVED_FAMILIES == sorted(
        ["plain_transformer", "gtrans", "layerwise_coordination", "deep_representations", "re_transformer", "rtal"]
    )
    assert set(SAVED_FAMILIES) <= set(hf_layerfusion.FAMILIES)


@pytest.mark.parametrize("model_type", SAVED_FAMILIES)
def test_old_checkpoint_loads_with_the_package_and_computes_what_it_computed(model_type):
    model = AutoModelForSeq2SeqLM.from_pretrained(FIXTURES / model_type).eval()
    assert type(model) is hf_layerfusion.FAMILIES[model_type][2]
    expected = expected_outputs(model_type)
    source = {"input_ids": expected["input_ids"], "attention_mask": expected["attention_mask"]}
    with torch.no_grad():
        logits = model(**source, decoder_input_ids=expected["decoder_input_ids"]).logits
        greedy = model.generate(**source, max_new_tokens=5, do_sample=False)
    assert expected["logits"].abs().max() > 1.0  # the comparison is not between near-zero tensors
    torch.testing.assert_close(logits, expected["logits"], atol=ATOL, rtol=0)
    assert greedy.tolist() == expected["greedy"].tolist()


# loads every copied checkpoint through its Hub code (no hf_layerfusion importable) and saves logits and greedy output
REMOTE = textwrap.dedent(
    """
    import json
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForSeq2SeqLM
    torch.set_num_threads(1)
    plan = json.load(open({plan!r}))
    results = {{}}
    for model_type, directory in plan["checkpoints"].items():
        model = AutoModelForSeq2SeqLM.from_pretrained(directory, trust_remote_code=True).eval()
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        expected = load_file(directory + "/expected.safetensors")
        source = {{"input_ids": expected["input_ids"], "attention_mask": expected["attention_mask"]}}
        with torch.no_grad():
            results[model_type] = {{
                "logits": model(**source, decoder_input_ids=expected["decoder_input_ids"]).logits,
                "greedy": model.generate(**source, max_new_tokens=5, do_sample=False),
            }}
    torch.save(results, plan["output"])
    """
)


def copy_with_its_hub_code(model_type: str, tmp_path: Path) -> Path:
    """A copy of the family's bfc5945 checkpoint with the Hub code it was saved with."""
    directory = tmp_path / model_type
    shutil.copytree(FIXTURES / model_type, directory)
    shutil.copy(FIXTURES / f"{REMOTE_CODE_FILE}.txt", directory / REMOTE_CODE_FILE)
    return directory


def assert_remote_code_computes_what_was_saved(checkpoints: dict[str, str], tmp_path: Path) -> None:
    """Every checkpoint, loaded through its Hub code in a process without the package, computes the logits and greedy
    output the old code computed from it."""
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"checkpoints": checkpoints, "output": str(tmp_path / "remote.pt")}))
    script = without_package_preamble() + REMOTE.format(plan=str(plan))
    run_python(["-S", "-c", script], {"HF_HOME": str(tmp_path / "hf_home")}, tmp_path)
    remote = torch.load(tmp_path / "remote.pt")
    assert sorted(remote) == SAVED_FAMILIES
    for model_type, outputs in remote.items():
        expected = expected_outputs(model_type)
        torch.testing.assert_close(outputs["logits"], expected["logits"], atol=ATOL, rtol=0, msg=model_type)
        assert outputs["greedy"].tolist() == expected["greedy"].tolist(), model_type


@pytest.mark.skipif(
    CACHE_NAME == "cache", reason="the Hub code of bfc5945 predates transformers 5.24's rename past_key_values -> cache"
)
def test_old_checkpoints_load_through_the_hub_code_they_carry(tmp_path):
    checkpoints = {}
    for model_type in SAVED_FAMILIES:
        checkpoints[model_type] = str(copy_with_its_hub_code(model_type, tmp_path))
    assert_remote_code_computes_what_was_saved(checkpoints, tmp_path)


def test_saving_the_config_again_gives_an_old_checkpoint_hub_code_that_runs_on_the_installed_release(tmp_path):
    """The README's refresh of a published checkpoint: with the package installed, `AutoConfig.from_pretrained(d)
    .save_pretrained(d)` rewrites the Hub code and `config.json` (nothing else), after which the checkpoint loads by
    remote code alone under the installed transformers and computes what it computed when it was saved."""
    checkpoints = {}
    for model_type in SAVED_FAMILIES:
        directory = copy_with_its_hub_code(model_type, tmp_path)
        before = {path.name: path.read_bytes() for path in directory.iterdir()}
        AutoConfig.from_pretrained(directory).save_pretrained(directory)
        after = {path.name: path.read_bytes() for path in directory.iterdir()}
        assert sorted(after) == sorted(before)
        assert sorted(name for name in after if after[name] != before[name]) == ["config.json", REMOTE_CODE_FILE]
        assert f"Requires {TRANSFORMERS_REQUIREMENT} " in after[REMOTE_CODE_FILE].decode()
        checkpoints[model_type] = str(directory)
    assert_remote_code_computes_what_was_saved(checkpoints, tmp_path)
