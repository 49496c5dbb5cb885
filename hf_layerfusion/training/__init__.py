"""Training and evaluation: data and tokenizers, the trainer and its callbacks, BLEU, translation, multilingual
training and checkpoint averaging. The top of the package: it imports from `modeling/`, `models/` and `inference/`,
which never import from it."""
