"""`python -m hf_layerfusion.checkpoint_averaging`: see `hf_layerfusion.training.checkpoint_averaging`."""

from hf_layerfusion.training.checkpoint_averaging import main

main()
