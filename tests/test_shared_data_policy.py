"""Tests that need ../shared (Multi30k, transformers' common tests) skip where it is missing, but fail in CI."""

import pytest
from helpers import require_shared


def test_missing_shared_data_skips_locally_and_fails_in_ci(monkeypatch, tmp_path):
    missing = tmp_path / "shared" / "data" / "multi30k" / "train.en"
    for value in ("", "false"):
        monkeypatch.setenv("CI", value)
        with pytest.raises(pytest.skip.Exception, match="Multi30k data not found at .*train.en"):
            require_shared(missing, "Multi30k data")
    for value in ("true", "TRUE", "1"):
        monkeypatch.setenv("CI", value)
        with pytest.raises(pytest.fail.Exception, match="CI=true"):
            require_shared(missing, "Multi30k data")
    require_shared(tmp_path, "a folder that exists")  # present: the test runs, in CI too
