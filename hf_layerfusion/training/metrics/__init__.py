"""Local `evaluate` metric modules, loadable without the Hugging Face Hub (see `hf_layerfusion.training.evaluation`)."""
