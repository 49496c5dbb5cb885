"""`python -m hf_layerfusion.ctranslate2_export`: see `hf_layerfusion.inference.ctranslate2_export`."""

from hf_layerfusion.inference.ctranslate2_export import main

main()
