"""`hf_layerfusion.compat` on the installed transformers release: the cache's name is the release's (checked against
its version number, an independent reference), a model takes the cache by either name and returns it in the release's
field, and `generate()` of that release drives every family's cache. `tools/check_transformers_range.py` runs this
file on both ends of the supported range, so each branch runs on its release."""

import pytest
import torch
import transformers
from helpers import tiny_model
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
