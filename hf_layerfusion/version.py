"""The package's version (read by setup.cfg, and written into the Hub code and the model cards it generates) and the
transformers versions it supports: setup.cfg's `install_requires` states the same range (tests/test_packaging.py),
and so do the model cards and the Hub code saved with every model, which run on the user's transformers.

Importing this module (the package's first import) checks the installed transformers against that range: a release
outside it raises an ImportError naming both, instead of an unrelated error later (a transformers upgraded after
installing the package); the Hub code makes the same check."""

from transformers.utils.versions import require_version

__version__ = "0.1.0"

# the releases checked on either side of the range: docs/testing.md (*transformers versions*)
TRANSFORMERS_REQUIREMENT = "transformers>=5.20,<5.24"
# what `require_version` adds to its ImportError when the installed transformers is outside the range: releases on
# either side are known to fail later with errors that do not name the version (5.24 renamed `past_key_values`)
TRANSFORMERS_HINT = (
    f"hf_layerfusion {__version__} runs on {TRANSFORMERS_REQUIREMENT} (other releases fail later with unrelated "
    f"errors): pip install '{TRANSFORMERS_REQUIREMENT}'"
)

require_version(TRANSFORMERS_REQUIREMENT, TRANSFORMERS_HINT)
