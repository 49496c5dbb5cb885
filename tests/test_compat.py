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
