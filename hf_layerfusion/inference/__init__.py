"""Fast inference: `fast_generate` (the tokens of `generate()` with less work per step) and the int8 inference copy
of a model (`prepare_for_inference`). Above `modeling/` and `models/`, below `training/` and `hub/`, which translate
with it."""

from .fast_generation import UnsupportedFastGeneration, fast_decoding_loop, fast_generate
from .quantization import QUANTIZATIONS, prepare_for_inference

__all__ = ["QUANTIZATIONS", "UnsupportedFastGeneration", "fast_decoding_loop", "fast_generate", "prepare_for_inference"]
