"""`python -m hf_layerfusion.checkpoint_averaging`: the command-line entry point.

A module of its own because `import hf_layerfusion` imports the package `hf_layerfusion.checkpoint_averaging` (its
functions are public API): had the command been the package module itself, runpy would execute an already imported
module a second time as `__main__` and warn about it (`RuntimeWarning: ... found in sys.modules`).
"""

from hf_layerfusion.checkpoint_averaging import main

main()
