"""Training and evaluation: data and tokenizers, the trainer and its callbacks, BLEU as trainer metrics, multilingual
training and checkpoint averaging. The top of the package beside `hub/`: it imports from `modeling/`, `models/`,
`inference/` and `translation/`, which never import from it.

It needs the `train` extra (`pip install "hf_layerfusion[train]"`), which translating does not: importing any module
of it without one of the extra's packages is an error that names the extra, not the first missing import deep in a
module."""

from importlib.util import find_spec

# the packages of setup.cfg's `train` extra that modules of training/ import
TRAINING_REQUIREMENTS = ("accelerate", "datasets", "evaluate", "num2words", "sentencepiece")

_missing = [name for name in TRAINING_REQUIREMENTS if find_spec(name) is None]
if _missing:
    raise ModuleNotFoundError(
        f"Training with hf_layerfusion needs {', '.join(_missing)}, which are not installed: "
        'pip install "hf_layerfusion[train]" (translating with a trained model needs none of them).',
        name=_missing[0],
    )
