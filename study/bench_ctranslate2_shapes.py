"""Where the fast loop stands against CTranslate2 by batch shape (issue 39): one translation call of a trained plain
Transformer at 1 and 32 Multi30k test sentences, greedy and beam-4, with exactly 1 and `--steps` new tokens
(`min_new_tokens` = `max_new_tokens`, CTranslate2's `min_decoding_length` = `max_decoding_length`), float32 and
int8, the two engines alternating call by call.

The one-token call is each engine's fixed cost per call (preparation, encoder, first decoder step); the difference
between the two calls over the steps between them is its cost per further decoder step at that batch shape. The
real workload (`bench_inference.py --bleu`) mixes both: length-sorted batches of 32 whose last steps compute few rows.

    python -m study.bench_ctranslate2_shapes runs/study/runs/steps_2000_warmup_1000/plain_transformer/seed_1
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from hf_layerfusion.inference import export_ctranslate2, fast_generate  # noqa: E402
from study.bench_backbone import loadavg  # noqa: E402
from study.bench_layers_in_one_call import load_trained_model, median_call_seconds  # noqa: E402
from study.common import DEFAULT_DATA  # noqa: E402


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path, help="a trained plain Transformer (a study run directory)")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Multi30k directory")
    parser.add_argument("--steps", type=int, default=31, help="new tokens of the longer call (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    if args.steps < 2 or args.repeats < 1:
        parser.error(f"--steps must be at least 2 and --repeats positive, got {args.steps} and {args.repeats}")
    try:
        import ctranslate2
    except ImportError:
        parser.error("this benchmark compares with CTranslate2: pip install ctranslate2 (the `benchmark` extra)")
    tokenizer, model, sentences = load_trained_model(
        parser, args, f"The fast loop against CTranslate2 {ctranslate2.__version__} by batch shape"
    )
    print(f"| precision | sentences | search | fast loop, 1 token (ms) | CTranslate2, 1 token (ms) | fast loop per further "
          f"step (ms) | CTranslate2 per further step (ms) | fast loop, {args.steps} tokens vs CTranslate2 |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        converted = export_ctranslate2(model, tokenizer, Path(directory) / "ctranslate2")
        for precision in ("float32", "int8"):
            translator = ctranslate2.Translator(str(converted), device="cpu", compute_type=precision,
                                                inter_threads=1, intra_threads=1)
            for count in (1, 32):
                batch = tokenizer(sentences[:count], return_tensors="pt", padding=True)
                pieces = [tokenizer.convert_ids_to_tokens(ids[mask.bool()])
                          for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]
                for beams in (1, 4):
                    seconds = {}
                    for steps in (1, args.steps):
                        seconds[steps] = median_call_seconds({
                            "fast": lambda steps=steps: fast_generate(
                                model, **batch, quantization=None if precision == "float32" else precision,
                                num_beams=beams, max_new_tokens=steps, min_new_tokens=steps),
                            "ctranslate2": lambda steps=steps: translator.translate_batch(
                                pieces, beam_size=beams, max_decoding_length=steps, min_decoding_length=steps),
                        }, args.repeats)
                    per_step = {engine: (seconds[args.steps][engine] - seconds[1][engine]) / (args.steps - 1)
                                for engine in ("fast", "ctranslate2")}
                    row = dict(precision=precision, sentences=count, beams=beams, one_token=seconds[1],
                               per_step=per_step, long_ratio=seconds[args.steps]["ctranslate2"] / seconds[args.steps]["fast"])
                    rows.append(row)
                    print(f"| {precision} | {count} | {'greedy' if beams == 1 else f'beam-{beams}'} | "
                          f"{seconds[1]['fast'] * 1e3:.2f} | {seconds[1]['ctranslate2'] * 1e3:.2f} | "
                          f"{per_step['fast'] * 1e3:.3f} | {per_step['ctranslate2'] * 1e3:.3f} | "
                          f"{row['long_ratio']:.2f}x |")
    print(f"\nThe last column is CTranslate2's seconds over the fast loop's for the {args.steps}-token call (above 1: "
          f"the fast loop is faster). (load average at end {loadavg()})")
    return rows


if __name__ == "__main__":
    main()
