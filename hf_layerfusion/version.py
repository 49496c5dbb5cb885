"""The package's version (read by setup.cfg, and written into the Hub code and the model cards it generates) and the
transformers versions it supports: setup.cfg's `install_requires` states the same range (tests/test_packaging.py),
and so do the model cards and the Hub code saved with every model, which run on the user's transformers.

The package's first statement (`hf_layerfusion/__init__.py`) checks the installed transformers against that range: a
release outside it raises an ImportError naming both, instead of an unrelated error later (a transformers upgraded
after installing the package); the Hub code makes the same check. Definitions only: the Hub code inlines them."""

__version__ = "0.1.0"

# the releases checked on either side of the range: docs/testing.md (*transformers versions*)
TRANSFORMERS_REQUIREMENT = "transformers>=5.20,<5.25"
# what `require_version` adds to its ImportError when the installed transformers is outside the range: a release
# after it may rename what the package uses (as 5.24 renamed `past_key_values`, `hf_layerfusion.compat`) and fail later
# with errors that do not name the version
TRANSFORMERS_HINT = (
    f"hf_layerfusion {__version__} runs on {TRANSFORMERS_REQUIREMENT} (other releases fail later with unrelated "
    f"errors): pip install '{TRANSFORMERS_REQUIREMENT}'"
)
