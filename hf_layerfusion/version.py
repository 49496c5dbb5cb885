"""The package's version (read by setup.cfg, and written into the Hub code and the model cards it generates) and the
transformers and torch versions it supports: setup.cfg's `install_requires` states the same requirements
(tests/test_packaging.py), and the model cards and the Hub code saved with every model, which run on the user's
transformers, state the transformers range.

The package's first statements (`hf_layerfusion/__init__.py`) check the installed transformers and torch against them:
a release outside raises an ImportError naming both and the `pip install` that fixes it, instead of an unrelated
error later (a transformers upgraded after installing the package) or transformers' own about one of its classes (a
torch below its floor); the Hub code makes the transformers check.
Definitions only: the Hub code inlines them."""

__version__ = "0.1.0"
# the module of the Hub code every saved model carries (hf_layerfusion.hub.remote_code), which transformers loads as
# `transformers_modules.<repository>.<hash>.modeling_layerfusion`: the package's classes under another name
REMOTE_MODULE = "modeling_layerfusion"

# the releases checked on either side of the range: docs/testing.md (*transformers versions*)
TRANSFORMERS_REQUIREMENT = "transformers>=5.20,<5.26"
# what `require_version` adds to its ImportError when the installed transformers is outside the range: a release
# after it may rename what the package uses (as 5.24 renamed `past_key_values`, `hf_layerfusion.compat`) and fail later
# with errors that do not name the version
TRANSFORMERS_HINT = (
    f"hf_layerfusion {__version__} runs on {TRANSFORMERS_REQUIREMENT} (other releases fail later with unrelated "
    f"errors): pip install '{TRANSFORMERS_REQUIREMENT}'"
)

# every transformers release of the range disables an older torch (`transformers.utils.import_utils.is_torch_available`
# is False below 2.6, and importing its model classes raises), so the floor is transformers' own, stated here so that
# pip upgrades such a torch when it installs the package; no ceiling: the releases checked (2.6.0 and the newest) are
# in docs/testing.md (*torch versions*)
TORCH_REQUIREMENT = "torch>=2.6"
TORCH_HINT = (
    f"hf_layerfusion {__version__} runs on {TORCH_REQUIREMENT}, as transformers does (it disables an older torch): "
    f"pip install '{TORCH_REQUIREMENT}'"
)
