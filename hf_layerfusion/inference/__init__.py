"""Fast inference: `fast_generate` (the tokens of `generate()` with less work per step) and the inference copies of a
model that it runs on CPU (`prepare_for_inference`: float32 or int8 compiled kernels), for every family;
`export_ctranslate2` deploys the plain family with CTranslate2. Above `modeling/` and `models/`, below `training/` and
`hub/`, which translate with it."""

from .ctranslate2_export import export_ctranslate2
from .decoding import release_decoding_buffers
from .fast_generation import UnsupportedFastGeneration, fast_decoding_loop, fast_generate
from .inference_copies import QUANTIZATIONS, prepare_for_inference

__all__ = [
    "QUANTIZATIONS",
    "UnsupportedFastGeneration",
    "export_ctranslate2",
    "fast_decoding_loop",
    "fast_generate",
    "prepare_for_inference",
    "release_decoding_buffers",
]
