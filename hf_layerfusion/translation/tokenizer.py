"""The checked loading of a saved tokenizer (the one of a model directory, a checkpoint or the Hub)."""

import os

from transformers import AutoTokenizer

from ..file_checks import check_local_or_hub, check_tokenizer_files


def load_tokenizer(name_or_path: str | os.PathLike, what: str = "tokenizer", **kwargs):
    """`AutoTokenizer.from_pretrained(name_or_path, **kwargs)` after checking a local directory: it exists and holds
    a tokenizer whose JSON files parse (`check_tokenizer_files`), so that a model saved without its tokenizer, or a
    `tokenizer.json` cut short, is an error naming the directory or file (`what` names the argument)."""
    path = check_local_or_hub(name_or_path, what)
    check_tokenizer_files(path, what)
    return AutoTokenizer.from_pretrained(path, **kwargs)
