#!/usr/bin/env python
"""Translate a file (one sentence per line) or stdin with a saved hf_layerfusion model.

    # the German -> English number model that examples/quickstart.py saves
    echo "dreihundertzwölf" | python examples/translate.py runs/quickstart/gtrans
    printf "zweiundvierzig\\nneunzehnhundertsiebenundachtzig\\n" > numbers.de
    python examples/translate.py runs/quickstart/gtrans --input numbers.de --output numbers.en \\
        --num_beams 4 --batch_size 64
    # GTrans: mix only decoder groups 2..3 (paper Table VI); the layers above group 3 are not computed
    python examples/translate.py runs/quickstart/gtrans --input numbers.de --decoder_groups 2 3
    # int8 on CPU (faster, not token-exact), or generate() itself instead of the fast decoding loop
    python examples/translate.py runs/quickstart/gtrans --input numbers.de --quantization int8
    python examples/translate.py runs/quickstart/gtrans --input numbers.de --generate
    # a multilingual model (examples/run_multilingual.py) needs the target language
    python examples/translate.py runs/multilingual --input sentences.en --tgt_lang de

The model dir is what `examples/run_translation.py` saves (model, tokenizer, generation config). Sentences are
sorted by length into batches (less padding), translated with `hf_layerfusion.translate` (the fast decoding loop of
`hf_layerfusion.inference`: the tokens of `generate()`, faster; transformers 5 removed the `translation`
pipeline; the package registers its own) and written back in input order. The input is UTF-8; a line ends at `\\n`,
`\\r\\n` or a lone `\\r`, read from a file and from stdin alike. One line out per line in, as Marian and CTranslate2
give it: a blank line (empty, or spaces only) is not translated (the model would invent a sentence for it) and gives
an empty line, and an input of blank lines only gives as many empty lines, without loading the model.

`--output` is checked before the model loads (not the input, stdin included when it is redirected from that file;
not a file of the model dir; in a writable directory; an existing file only with `--overwrite`) and is written whole
or not at all (a temporary file renamed into place: a full disk leaves the previous file as it was). A special file
is written in place instead, without `--overwrite`: `--output /dev/stdout` writes where the shell redirected stdout
(`>> log.txt` appends to it, a pipe gets the text), and a FIFO or a terminal gets the text. An empty `--input` or
`--output` path is refused (it is not stdin / stdout).

Installed, the command is the console script `hf-layerfusion-translate` (or `python -m hf_layerfusion.cli.translate`); in a checkout,
`python examples/translate.py` runs the same module (`examples/translate.py` links to it).
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM

# `python examples/translate.py` from a checkout without installing: the examples/ file links here
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import hf_layerfusion  # noqa: E402,F401  (registers the families with the Auto classes)
from hf_layerfusion.file_checks import (  # noqa: E402
    check_input_file,
    check_local_or_hub,
    check_not_an_adapter,
    check_output_file,
    decode_utf8,
    read_utf8,
    write_file_atomically,
    writes_in_place,
)
from hf_layerfusion.modeling.input_checks import check_decoder_groups, check_positive_int  # noqa: E402
from hf_layerfusion.translation.language_tags import check_language_tag, check_sources_tagged  # noqa: E402
from hf_layerfusion.translation.tokenizer import load_tokenizer  # noqa: E402
from hf_layerfusion.translation.translate import translate  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    """The command's parser: it parses the command line and prints `--help` (the console script's too, which
    `hf_layerfusion_cli` caches)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", help="Directory saved by run_translation.py (model + tokenizer).")
    parser.add_argument("--input", help="Source sentences, one per line (default: stdin); UTF-8, a line ends at \\n, "
                        "\\r\\n or \\r (for a file and stdin alike); a blank line gives an empty line, untranslated.")
    parser.add_argument("--output", help="Where to write the translations (default: stdout); a new file, unless "
                        "--overwrite; a special file (/dev/stdout, a FIFO, a terminal) is written in place.")
    parser.add_argument("--overwrite", action="store_true", help="Replace --output if it is an existing file.")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--inter_threads", type=int, default=1, help="Batches translated side by side, each with an "
                        "equal share of torch's threads (translate()'s inter_threads).")
    parser.add_argument("--num_beams", type=int, default=None, help="Default: the model's generation config.")
    parser.add_argument("--max_new_tokens", type=int, default=None, help="Default: the model's generation config.")
    parser.add_argument(
        "--decoder_groups", type=int, nargs="+", default=None, help="GTrans: 1-based decoder groups to mix."
    )
    parser.add_argument(
        "--tgt_lang",
        default=None,
        help="Multilingual models: the target language, whose <2xx> tag is prepended to every sentence (required "
        "unless every line begins with a tag).",
    )
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--quantization", choices=["int8"], default=None, help="int8 linear layers (CPU only; faster, not token-exact)."
    )
    parser.add_argument(
        "--generate", action="store_true", help="Decode with generate() itself instead of the fast decoding loop."
    )
    return parser


def check_stdin_not_output(output) -> None:
    """Refuse stdin redirected from the `--output` file (`< src.txt --output src.txt`, also through a link): the
    translations would replace the text they come from, as `--input` naming the output is refused. Only a regular
    file counts: a terminal that is both stdin and `--output /dev/stdout` is no file to destroy."""
    try:
        stdin_status = os.fstat(sys.stdin.fileno())
        output_status = os.stat(Path(output).expanduser())
    except (AttributeError, OSError, ValueError):  # stdin without a descriptor, or no output file yet
        return
    if stat.S_ISREG(stdin_status.st_mode) and os.path.samestat(stdin_status, output_status):
        raise ValueError(
            f"--output {output!r} is the file stdin is read from: writing it would destroy the input. Write to a new "
            "file."
        )


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)

    # every argument is checked before the model is loaded, so that a typo costs nothing and loses no file
    model_dir = check_local_or_hub(args.model_dir, "model_dir")
    check_not_an_adapter(model_dir, "model_dir")
    for name in ("batch_size", "inter_threads", "num_beams", "max_new_tokens"):
        check_positive_int(getattr(args, name), f"--{name}", allow_none=True)
    for name, default in (("input", "read stdin"), ("output", "write to stdout")):
        if getattr(args, name) == "":  # taken for the option left out, it did that without a word
            parser.error(f"--{name} is an empty path: name a file, or leave --{name} out to {default}.")
    input_file = check_input_file(args.input, "--input") if args.input is not None else None
    if args.output is not None:
        # neither the input nor a file of the model, and writable: refused now, not after the whole input is translated
        check_output_file(args.output, [input_file, model_dir], what="--output")
        if input_file is None:
            check_stdin_not_output(args.output)
        # a special file is written into, not replaced: nothing to overwrite
        if Path(args.output).expanduser().exists() and not args.overwrite and not writes_in_place(args.output):
            raise FileExistsError(f"--output {args.output!r} exists; pass --overwrite to replace it, or write to a "
                                  "new file.")
    if args.quantization and args.device != "cpu":
        parser.error(f"--quantization {args.quantization} runs on the CPU; pass --device cpu.")
    config = AutoConfig.from_pretrained(model_dir)
    if args.decoder_groups is not None:
        check_decoder_groups(args.decoder_groups, getattr(config, "num_decoder_groups", 1), "--decoder_groups")
    # one rule for a file and stdin (`decode_utf8`): stdin's text layer would keep a lone \r inside a line
    source = read_utf8(input_file, "--input") if input_file else decode_utf8(sys.stdin.buffer.read(), "stdin")
    sentences = source.split("\n")
    if sentences and sentences[-1] == "":
        sentences.pop()
    if not sentences:  # before loading anything
        where = f"--input {str(input_file)!r}" if input_file else "stdin"
        raise ValueError(f"{where} holds no sentence (one sentence per line): nothing to translate.")

    # blank lines are not translated (a model invents a sentence for an empty source): they stay empty lines
    nonblank = [sentence for sentence in sentences if sentence.strip()]

    tokenizer = load_tokenizer(model_dir, "model_dir")  # before the model: a model saved without one fails at once
    if args.tgt_lang is not None:
        check_language_tag(tokenizer, args.tgt_lang)
    else:
        check_sources_tagged(tokenizer, nonblank, "--tgt_lang")
    translations = []
    if nonblank:  # an input of blank lines only needs no model
        model = AutoModelForSeq2SeqLM.from_pretrained(model_dir, config=config).to(args.device)
        translations = translate(
            model,
            tokenizer,
            nonblank,
            batch_size=args.batch_size,
            num_beams=args.num_beams,
            max_new_tokens=args.max_new_tokens,
            decoder_groups=args.decoder_groups,
            progress=True,
            fast=not args.generate,
            quantization=args.quantization,
            tgt_lang=args.tgt_lang,
            inter_threads=args.inter_threads,
        )
    translated = iter(translations)
    text = "".join(f"{next(translated) if sentence.strip() else ''}\n" for sentence in sentences)
    if args.output is not None:
        write_file_atomically(args.output, text, what="--output")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    main()
