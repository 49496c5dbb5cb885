"""Deploying the plain family with CTranslate2: `export_ctranslate2(model, tokenizer, output_dir)`.

A plain Transformer of this package is a `MarianMTModel` (`to_marian`), so CTranslate2, the usual CPU engine for
Marian-size models, runs it (speeds measured beside `generate()` and the fast loop in
`study/fast_cpu_translation_log.md`).
The fusion families have no CTranslate2 equivalent: their fast path is `fast_generate`.

The conversion follows transformers' Marian, not CTranslate2's rules for opus-mt checkpoints: transformers starts
decoding from the embedding of `decoder_start_token_id` and has no extra padding row, where CTranslate2's Marian
converter assumes a zero start embedding and drops the last vocabulary row, which would change the translations.
CTranslate2's BART rules describe transformers' Marian exactly; with them CTranslate2 float32 gives the tokens of
`generate()` on the tests' tiny models (tests/test_marian_export.py), but not on every sentence of real text: its sums
run in another order and break near-ties otherwise (on the study's trained plain Transformers, 0-1 greedy and 22-43
beam-4 translations of the 1,000 Multi30k test sentences differ from `MarianMTModel.generate()`'s: the committed
workload results).

    python -m hf_layerfusion.ctranslate2_export --model_dir runs/plain --output_dir runs/plain-ct2 [--quantization int8]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch

from ..file_checks import (
    check_local_or_hub,
    check_not_an_adapter,
    check_output_dir,
    check_tokenizer_files,
    check_write_error,
)
from ..modeling.conversion import to_marian


def _marian_as_in_transformers_loader():
    """CTranslate2's Marian loader with BART's rules for the start token, the vocabulary and the layer norms."""
    from ctranslate2.converters import transformers as ct2_transformers

    class MarianAsInTransformers(ct2_transformers.MarianMTLoader):
        def get_model_spec(self, model):
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return ct2_transformers.BartLoader.get_model_spec(self, model)

        def set_decoder(self, spec, decoder):
            ct2_transformers.BartLoader.set_decoder(self, spec, decoder)

        def set_config(self, config, model, tokenizer):
            ct2_transformers.BartLoader.set_config(self, config, model, tokenizer)

        def get_vocabulary(self, model, tokenizer):
            return ct2_transformers.BartLoader.get_vocabulary(self, model, tokenizer)

    return MarianAsInTransformers()


def export_ctranslate2(model, tokenizer, output_dir: str | os.PathLike, quantization: str | None = None) -> Path:
    """Write a CTranslate2 model of the plain Transformer `model` (with its `tokenizer`'s vocabulary) to
    `output_dir`, which must not exist or be empty (nothing is overwritten; a symbolic link is written through, into
    the directory it points at), and return its path. The model is written into a temporary directory beside it
    (`_ct2_export.<name>.*`) and moved into `output_dir` only when complete: a failure (a full disk) leaves
    `output_dir` as it was.

    `quantization` is CTranslate2's weight type (None keeps float32; e.g. "int8", "int8_float32", "float16"). Load
    the result with `ctranslate2.Translator(path)`; it translates token strings
    (`tokenizer.convert_ids_to_tokens(ids)`, back with `tokenizer.convert_tokens_to_ids`). Fusion families raise
    `ValueError` (see `to_marian`); without the `ctranslate2` package, `ImportError` says how to install it."""
    try:
        import ctranslate2
    except ImportError as error:
        raise ImportError(
            "export_ctranslate2 needs CTranslate2: `pip install ctranslate2` (or `pip install hf_layerfusion[ctranslate2]`)."
        ) from error
    if quantization is not None and not isinstance(quantization, str):
        raise TypeError(f"quantization must be None or a CTranslate2 type name such as 'int8', got {quantization!r}.")
    output_dir = check_output_dir(output_dir, overwrite_option=None)  # the export has no option to write into it
    marian = to_marian(model).float().eval()

    class InMemoryConverter(ctranslate2.converters.Converter):
        def _load(self):
            with torch.no_grad():
                return _marian_as_in_transformers_loader()(marian, tokenizer)

    # the converter saves in place (it replaces the directory it is given, then writes the files there), so a save
    # that fails halfway would leave a partial model: it saves into a temporary directory beside the target, whose
    # files are moved in once complete. The target is the directory a symbolic link points at: the link stays.
    target = Path(os.path.realpath(output_dir))
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f"_ct2_export.{target.name}.") as staging:
        try:
            InMemoryConverter().convert(staging, quantization=quantization, force=True)
        except Exception as error:
            check_write_error(error, output_dir, "the CTranslate2 model", removed=True)
            raise
        target.mkdir(exist_ok=True)
        for file in Path(staging).iterdir():
            os.replace(file, target / file.name)
    return output_dir


def build_parser() -> argparse.ArgumentParser:
    """The command's parser: it parses the command line and prints `--help` (the console script's too, which
    `hf_layerfusion_cli` caches)."""
    parser = argparse.ArgumentParser(
        prog="python -m hf_layerfusion.ctranslate2_export",
        description="Write a CTranslate2 model of a plain Transformer (a directory or Hub id with its tokenizer).",
    )
    parser.add_argument("--model_dir", required=True, help="the plain Transformer: a local directory or a Hub id")
    parser.add_argument("--output_dir", required=True, help="a new (or empty) directory for the CTranslate2 model")
    parser.add_argument("--quantization", default=None, help="CTranslate2 weight type, e.g. int8 (default: float32)")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model_dir = check_local_or_hub(args.model_dir, "--model_dir")
    check_not_an_adapter(model_dir, "--model_dir")
    check_output_dir(args.output_dir, [model_dir] if os.path.isdir(model_dir) else [], what="--output_dir",
                     overwrite_option=None)
    check_tokenizer_files(model_dir, "--model_dir")  # before the model: a model saved without one fails at once
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    path = export_ctranslate2(model, tokenizer, args.output_dir, args.quantization)
    print(
        f"Wrote the CTranslate2 model of {model_dir} ({args.quantization or 'float32'} weights) to {path}: "
        f"ctranslate2.Translator({str(path)!r}) translates token strings (tokenizer.convert_ids_to_tokens)."
    )
