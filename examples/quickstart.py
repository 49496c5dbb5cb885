#!/usr/bin/env python
"""Quickstart: train a small GTrans and a plain Transformer on the built-in number corpus, compare their BLEU, and
translate with the saved GTrans. A few minutes on 2 CPU cores, no download.

    python examples/quickstart.py              # 1600 training steps per model, seed 0
    python examples/quickstart.py --steps 300  # faster, lower BLEU
    python examples/quickstart.py --seed 1     # another initialisation and data order

The corpus (`hf_layerfusion.training.data.builtin_number_corpus`) verbalises numbers in German and English
("dreihunderteinundzwanzig" -> "three hundred and twenty-one"); German writes most numbers as one compound word,
so we translate German -> English, where BLEU's n-grams have words to match. Both models get the same size,
vocabulary, hyper-parameters, data order and number of training steps, through `examples/run_translation.py`
(seeded: a rerun on the same machine prints the same numbers; GTrans' steps take a little longer, for its extra
output groups). 1600 steps, because a model learns to read its source late on this task: at 800, whether it had
yet depended on the seed (README, "Set-up: the two commands"). BLEU is sacreBLEU of beam-4 search on the held-out
test split. The saved GTrans is then loaded like any checkpoint and translates new numbers with `generate()`, mixing
all its decoder groups or using only the top one; finally a fresh Python process in which hf_layerfusion cannot be
imported loads the same directory with `trust_remote_code=True` (the self-contained code the package saved with the
weights) and translates through the `"translation"` pipeline, and the script prints whether its translations match
the package's. Everything is written under `--output_dir`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import datasets
import torch
import transformers
from num2words import num2words
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, pipeline

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_translation import main as run_translation  # noqa: E402  (also puts the repo on sys.path)

from hf_layerfusion.hub.model_card import write_model_card  # noqa: E402
from hf_layerfusion.hub.remote_code import check_model_directory  # noqa: E402
from hf_layerfusion.training.data import builtin_number_corpus  # noqa: E402
from hf_layerfusion.translation.translate import translate  # noqa: E402

SOURCE_LANG, TARGET_LANG = "de", "en"
CORPUS = dict(builtin_num_train=20000, builtin_num_valid=200, builtin_num_test=300)
# d_model 128, 3 + 3 layers; GTrans: every encoder layer fused (T_e = 1), 3 decoder groups of one layer (T_d = 1)
BACKBONE = (
    "d_model=128,encoder_layers=3,decoder_layers=3,encoder_ffn_dim=512,decoder_ffn_dim=512,"
    "encoder_attention_heads=4,decoder_attention_heads=4,max_position_embeddings=128,dropout=0.1"
)
MODELS = {
    "gtrans": BACKBONE + ",encoder_group_size=1,decoder_group_size=1",
    "plain_transformer": BACKBONE,
}


def train_args(model_type: str, output_dir: Path, steps: int, tokenizer_dir: Path | None, seed: int = 0) -> list[str]:
    args = [
        "--builtin_corpus",
        *(f"--{key}={value}" for key, value in CORPUS.items()),
        f"--source_lang={SOURCE_LANG}",
        f"--target_lang={TARGET_LANG}",
        f"--model_type={model_type}",
        f"--config_overrides={MODELS[model_type]}",
        "--tokenizer_vocab_size=1000",
        "--max_source_length=64",
        "--max_target_length=64",
        f"--output_dir={output_dir}",
        "--do_train",
        "--do_predict",
        "--num_beams=4",
        f"--max_steps={steps}",
        "--per_device_train_batch_size=64",
        "--per_device_eval_batch_size=100",
        "--learning_rate=2e-3",
        "--lr_scheduler_type=inverse_sqrt",
        "--warmup_steps=300",
        "--label_smoothing_factor=0.1",
        "--train_sampling_strategy=group_by_length",
        "--save_strategy=no",
        f"--logging_steps={max(steps // 4, 1)}",
        "--log_level=warning",
        "--disable_tqdm=True",
        f"--dataloader_pin_memory={torch.cuda.is_available()}",
        f"--seed={seed}",
    ]
    if tokenizer_dir is not None:
        args.append(f"--tokenizer_name={tokenizer_dir}")
    return args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output_dir", default="runs/quickstart", type=Path)
    parser.add_argument("--steps", default=1600, type=int, help="Training steps of each model (batches of 64).")
    parser.add_argument("--seed", default=0, type=int, help="Seed of both models' initialisation and data order.")
    args = parser.parse_args()
    datasets.disable_progress_bars()
    transformers.utils.logging.disable_progress_bar()

    results = {}
    tokenizer_dir = None
    for model_type in MODELS:
        print(f"\n=== Training {model_type} for {args.steps} steps ===", flush=True)
        output_dir = args.output_dir / model_type
        results[model_type] = run_translation(train_args(model_type, output_dir, args.steps, tokenizer_dir, args.seed))
        tokenizer_dir = tokenizer_dir or output_dir  # the second model uses the first one's (trained) tokenizer

    print(
        f"\n=== Test BLEU ({SOURCE_LANG}->{TARGET_LANG}, {CORPUS['builtin_num_test']} held-out sentences, beam 4) ==="
    )
    print(f"{'model':<18} {'parameters':>10} {'steps':>6} {'train s':>8} {'BLEU':>6}")
    for model_type, result in results.items():
        parameters = sum(
            p.numel() for p in AutoModelForSeq2SeqLM.from_pretrained(args.output_dir / model_type).parameters()
        )
        train = result["train"]
        print(
            f"{model_type:<18} {parameters:>10,} {train['global_step']:>6} {train['train_runtime']:>8.0f} "
            f"{result['test']['bleu']:>6.2f}"
        )
    print(f"sacreBLEU signature: {results['gtrans']['test']['signature']}")

    test_pairs = builtin_number_corpus(
        SOURCE_LANG, TARGET_LANG, CORPUS["builtin_num_train"], CORPUS["builtin_num_valid"], CORPUS["builtin_num_test"]
    )["test"]["translation"]
    hypotheses = {
        model_type: (args.output_dir / model_type / "generated_predictions_test.txt")
        .read_text(encoding="utf-8")
        .split("\n")
        for model_type in MODELS
    }
    print("\n=== Sample test translations ===")
    for i in range(4):
        print(f"source:            {test_pairs[i][SOURCE_LANG]}")
        print(f"reference:         {test_pairs[i][TARGET_LANG]}")
        for model_type in MODELS:
            print(f"{model_type + ':':<18} {hypotheses[model_type][i]}")
        print()

    # the saved GTrans, as a user would load it, with the model card a Hub upload would carry
    gtrans_dir = args.output_dir / "gtrans"
    model = AutoModelForSeq2SeqLM.from_pretrained(gtrans_dir)
    card = write_model_card(
        gtrans_dir,
        model,
        SOURCE_LANG,
        TARGET_LANG,
        "hf_layerfusion built-in number corpus (num2words)",
        bleu_scores={"test": results["gtrans"]["test"]["bleu"]},
        bleu_signature=results["gtrans"]["test"]["signature"],
        training_command="python examples/quickstart.py",
        overwrite=True,  # this run's own card, rewritten on every run
    )
    print(f"\nModel card: {card}")
    tokenizer = AutoTokenizer.from_pretrained(gtrans_dir)
    numbers = [(42, "cardinal"), (1987, "year"), (250_000, "cardinal"), (3, "ordinal"), (7_654_321, "cardinal")]
    sources = [num2words(n, lang=SOURCE_LANG, to=kind) for n, kind in numbers]
    all_groups = translate(model, tokenizer, sources)
    top_group = translate(model, tokenizer, sources, decoder_groups=[model.config.num_decoder_groups])
    print(f"=== The saved GTrans ({gtrans_dir}) on new inputs ===")
    for (number, kind), source, mixed, top in zip(numbers, sources, all_groups, top_group):
        print(f"{number} ({kind}): {source}")
        print(f"    all {model.config.num_decoder_groups} decoder groups mixed: {mixed}")
        print(f"    top decoder group only:      {top}")

    # the directory is a complete Hub repository: a fresh process *without* hf_layerfusion loads it with the Hub
    # code the package wrote next to the weights, through the "translation" pipeline
    check_model_directory(gtrans_dir)
    translator = pipeline("layerfusion-translation", model=model, tokenizer=tokenizer)
    package_translations = [r["translation_text"] for r in translator(sources, batch_size=len(sources), num_beams=4)]
    hub_translations = translate_without_package(gtrans_dir, sources)
    print("\n=== The same directory in a fresh process without hf_layerfusion (trust_remote_code=True) ===")
    for source, translation in zip(sources, hub_translations):
        print(f"{source} -> {translation}")
    same = hub_translations == package_translations
    print(f"Translations {'match' if same else 'DO NOT match'} the package's ({len(sources)} sentences, beam 4).")
    if not same:
        raise SystemExit(1)


# Run with `python -S` and only the site-packages folders on sys.path (a virtual environment's own, then the system's
# when it sees them; their .pth files, which hold the editable install's import hook, are not processed), so
# `import hf_layerfusion` fails there, as for a Hub user without the package.
WITHOUT_PACKAGE = """
import json, sys
sys.path.extend({site_packages!r})
try:
    import hf_layerfusion
except ModuleNotFoundError:
    pass
else:
    raise SystemExit("hf_layerfusion is importable: this check needs a process without it")
from transformers import pipeline
translator = pipeline("translation", model={model_dir!r}, trust_remote_code=True)
print(json.dumps([r["translation_text"] for r in translator({sources!r}, batch_size={batch_size}, num_beams=4)]))
"""


def translate_without_package(model_dir: Path, sources: list[str]) -> list[str]:
    script = WITHOUT_PACKAGE.format(
        site_packages=[path for path in sys.path if Path(path).name == "site-packages"] or [sysconfig.get_paths()["purelib"]],
        model_dir=str(model_dir.resolve()), sources=sources,
        batch_size=len(sources),
    )
    # PYTHONPATH would still reach a checkout of the package (a developer's `PYTHONPATH=$PWD`)
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-S", "-c", script], capture_output=True, text=True, cwd=model_dir.resolve().parent, env=env
    )
    if result.returncode != 0:
        raise RuntimeError(f"Loading {model_dir} without hf_layerfusion failed:\n{result.stderr[-4000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
