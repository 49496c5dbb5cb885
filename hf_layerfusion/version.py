"""The package's version (read by setup.cfg, and written into the Hub code and the model cards it generates)."""

__version__ = "0.1.0"
