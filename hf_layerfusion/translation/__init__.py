"""Translation with a trained model: `translate()` (batched, through the fast decoding loop), the target-language
tags of multilingual models, the checked loading of a saved tokenizer, and sacreBLEU corpus BLEU.

A floor between `inference/` and `training/`: it imports from `modeling/` and `inference/` only, so that `hub/` and
the `translate` command work with the package's base requirements; `training/` (which needs the `train` extra)
imports from it, never the other way round."""
