"""`python -m hf_layerfusion.checkpoint_averaging`: the command line of `hf_layerfusion.training.checkpoint_averaging`.

A package of its own with nothing but its `__main__.py`: importing hf_layerfusion imports the functions' module
(they are public API), and runpy would execute an already imported module a second time as `__main__` and warn about it
(`RuntimeWarning: ... found in sys.modules`).
"""
