"""`python -m hf_layerfusion.ctranslate2_export`: the command line of `hf_layerfusion.inference.ctranslate2_export`.

A package of its own with nothing but its `__main__.py`, like `hf_layerfusion.checkpoint_averaging`: runpy would
otherwise execute the already imported module a second time as `__main__`.
"""
