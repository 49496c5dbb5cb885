"""Tests that need ../shared (Multi30k, transformers' common tests) skip where it is missing, but fail in CI."""

import re
from pathlib import Path

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


def test_no_test_skips_for_missing_shared_data_on_its_own():
    """A test that needs ../shared goes through `require_shared`: a skip of its own (a `skipif` on the data's folder,
    a `pytest.skip` after checking it) would pass silently in CI on a checkout without the data."""
    tests = Path(__file__).resolve().parent
    own_skips = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted(tests.rglob("*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if re.search(r"\bskip(if)?\(", line) and re.search(r"shared|multi30k|hf.common", line, re.IGNORECASE)
    ]
    assert not own_skips, f"use helpers.require_shared instead: {own_skips}"
