"""`hf_layerfusion.compat` on the installed transformers release: the cache's name is the release's (checked against
its version number, an independent reference), a model takes the cache by either name (the old one warning, as
transformers' Marian warns, on the releases that renamed it) and returns it in the release's field, and `generate()` of
that release drives every family's cache. `tools/check_transformers_range.py` runs this
file on both ends of the supported range, so each branch runs on its release."""

import warnings

import pytest
import torch
import transformers
from helpers import tiny_marian, tiny_model
from packaging.version import Version

from hf_layerfusion import FAMILIES
from hf_layerfusion.compat import CACHE_NAME, output_cache


def test_cache_name_is_the_installed_releases():
    renamed = Version(transformers.__version__).release >= (5, 24)
    assert CACHE_NAME == ("cache" if renamed else "past_key_values")


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_forward_takes_the_cache_by_either_name(model_type):
    model = tiny_model(model_type)
    source = dict(input_ids=torch.tensor([[5, 6, 7, 2]]), attention_mask=torch.ones(1, 4, dtype=torch.long))
    start = torch.full((1, 1), model.config.decoder_start_token_id)
    with torch.no_grad():
        first = model(**source, decoder_input_ids=start, use_cache=True)
        assert CACHE_NAME in first.keys() and output_cache(first).get_seq_length() == 1
        nxt = torch.tensor([[6]])
        steps = {}
        for name in ("cache", "past_key_values"):
            cache = model(**source, decoder_input_ids=start, use_cache=True)
            steps[name] = model(**source, decoder_input_ids=nxt, use_cache=True, **{name: output_cache(cache)}).logits
        full = model(**source, decoder_input_ids=torch.cat([start, nxt], dim=1)).logits[:, -1:]
    torch.testing.assert_close(steps["cache"], full, atol=1e-5, rtol=0)
    assert torch.equal(steps["cache"], steps["past_key_values"])
    with pytest.raises(ValueError, match="as `cache` or as `past_key_values`, not both"):
        model(**source, decoder_input_ids=nxt, cache=output_cache(first), past_key_values=output_cache(first))


def deprecation_warnings(call) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        call()
    return [str(warning.message) for warning in caught if issubclass(warning.category, FutureWarning)]


@pytest.mark.parametrize("model_type", sorted(FAMILIES))
def test_the_old_cache_name_warns_where_transformers_marian_warns(model_type):
    """The reference is transformers' `MarianMTModel` of the installed release: the old name warns exactly where
    Marian's forward warns (from 5.24 on), naming the new name; the new name and no cache warn on neither."""
    model = tiny_model(model_type).eval()
    marian = tiny_marian("sdpa")
    source = dict(input_ids=torch.tensor([[5, 6, 7, 2]]), attention_mask=torch.ones(1, 4, dtype=torch.long))
    start, nxt = torch.full((1, 1), 2), torch.tensor([[6]])
    warned = {}
    with torch.no_grad():
        for name, each in (("ours", model), ("marian", marian)):
            cache = output_cache(each(**source, decoder_input_ids=start, use_cache=True))
            old = deprecation_warnings(lambda: each(**source, decoder_input_ids=nxt, past_key_values=cache))
            cache = output_cache(each(**source, decoder_input_ids=start, use_cache=True))
            new = deprecation_warnings(lambda: each(**source, decoder_input_ids=nxt, **{CACHE_NAME: cache}))
            warned[name] = (bool(old), bool(new), old)
    assert warned["ours"][:2] == warned["marian"][:2] == (CACHE_NAME == "cache", False), warned
    if CACHE_NAME == "cache":
        assert any("`past_key_values` is deprecated" in message and "Use `cache` instead" in message
                   for message in warned["ours"][2]), warned["ours"][2]


def transformers_private_names(path) -> list[str]:
    """Where a module of the package reads a private name of transformers directly: `from transformers... import _x`,
    or `Name._x` (at any depth, `Name._x._y`) of a name it imported from transformers."""
    import ast

    tree = ast.parse(path.read_text(encoding="utf-8"))
    imported, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "transformers":
            for alias in node.names:
                imported.add(alias.asname or alias.name)
                if alias.name.startswith("_"):
                    found.append(f"{path.name}:{node.lineno}: imports {alias.name}")
        elif isinstance(node, ast.Import):
            imported |= {(alias.asname or alias.name).split(".")[0] for alias in node.names
                         if alias.name.split(".")[0] == "transformers"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in imported:
                found.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_private_transformers_names_are_read_in_compat_only(tmp_path):
    """A private name of transformers is read in `hf_layerfusion.compat`, where import checks it and names the
    release that lacks it (tests/test_packaging.py), and nowhere else: elsewhere a release that renamed it would
    fail in the middle of a user's call with an AttributeError."""
    from pathlib import Path

    import hf_layerfusion

    package = Path(hf_layerfusion.__file__).parent
    found = [line for path in sorted(package.rglob("*.py")) if path.name != "compat.py"
             for line in transformers_private_names(path)]
    assert found == []
    # the scan sees what it is meant to: the read this test was written for (a config's check of its keywords), a
    # private import, and not a private name of the package's own
    module = tmp_path / "module.py"
    module.write_text(
        "import transformers as tf\nfrom transformers.generation import _helper\n"
        "def check(cls):\n    from transformers import GenerationConfig\n"
        "    return GenerationConfig._get_default_generation_params(), tf.utils._x.y, cls._own\n"
    )
    assert transformers_private_names(module) == [
        "module.py:2: imports _helper", "module.py:5: GenerationConfig._get_default_generation_params",
        "module.py:5: tf.utils._x",
    ]
