"""The Multi30k study and the inference benchmarks of hf_layerfusion: the queue of runs (`python -m study`), the
results ledger and its reports, the probes and the profiles, each a module run as `python -m study.<module>` from the
repository root (study/README.md). Not part of the installed package: the wheel ships `hf_layerfusion` alone."""
