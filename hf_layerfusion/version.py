"""The package's version (read by setup.cfg, and written into the Hub code and the model cards it generates) and the
transformers versions it supports: setup.cfg's `install_requires` states the same range (tests/test_packaging.py),
and so do the model cards and the Hub code saved with every model, which run on the user's transformers."""

__version__ = "0.1.0"

# the releases checked on either side of the range: docs/testing.md (*transformers versions*)
TRANSFORMERS_REQUIREMENT = "transformers>=5.20,<5.24"
