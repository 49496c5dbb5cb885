#!/usr/bin/env python
"""Real-data benchmark: plain Transformer vs GTrans on Multi30k en->de under the same CPU time budget.

Setting (both models): joint 8k unigram (SentencePiece-style) vocabulary trained on train.en + train.de; the
`multi30k` preset (d_model 256, 6 + 6 post-norm layers, FFN 1024, 4 heads, dropout 0.1); AdamW, lr 1e-3,
inverse-sqrt schedule with 1000 warm-up steps, label smoothing 0.1, 64 sentences per batch grouped by length; the
same wall-clock training budget per model (default 35 min); then beam-4 sacreBLEU on `val` and `test_2016_flickr`.
GTrans uses T_e = 3 (2 encoder groups) and T_d = 2 (3 decoder groups), and is also evaluated as in its Table VI:
each decoder group alone, and the mixture of groups k..N.

Printed: BLEU (with the sacreBLEU signature), training steps, source tokens per second of training (whole run;
tokens of the padded, length-grouped batches), the Table VI grid. Everything lands in `--output_dir` (`results.json`, one training dir per model).

Resumable: training checkpoints every 500 steps and the time already spent travels with them, so re-running the
same command after an interruption continues where it stopped (finished models and evaluations are not redone).

    python benchmarks/bench_multi30k.py                                  # hours on a laptop CPU
    python benchmarks/bench_multi30k.py --minutes_per_model 1 --warmup_steps 50 \\
        --max_eval_samples 40 --max_predict_samples 40 --output_dir /tmp/bench_smoke   # end-to-end smoke run
    # the plain model stopped at GTrans' step count (same trajectory, same tokenizer): a steps-matched row
    python benchmarks/bench_multi30k.py --models plain_transformer --max_steps_per_model 2903 --minutes_per_model 60 \
        --tokenizer_dir runs/bench_multi30k/tokenizer --output_dir runs/bench_multi30k_2903_steps
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT / "examples"))
from run_translation import main as run_translation  # noqa: E402  (also puts the repo on sys.path)
from hf_layerfusion.translation import translate  # noqa: E402

from hf_layerfusion.data import load_parallel_text  # noqa: E402
from hf_layerfusion.evaluation import corpus_bleu  # noqa: E402
from hf_layerfusion.tokenization import train_joint_tokenizer  # noqa: E402

DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "multi30k"
SOURCE_LANG, TARGET_LANG = "en", "de"
MODELS = {
    "plain_transformer": None,
    "gtrans": "encoder_group_size=3,decoder_group_size=2",
}


def train_and_evaluate(model_type: str, args, tokenizer_dir: Path) -> dict:
    output_dir = args.output_dir / model_type
    finished = output_dir / "bleu_results.json"
    if finished.is_file():
        return json.loads(finished.read_text())
    command = [
        f"--dataset_name={args.data_dir}",
        f"--source_lang={SOURCE_LANG}",
        f"--target_lang={TARGET_LANG}",
        f"--model_type={model_type}",
        "--preset=multi30k",
        f"--tokenizer_name={tokenizer_dir}",
        f"--output_dir={output_dir}",
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--resume_from_checkpoint=last",
        f"--max_train_minutes={args.minutes_per_model}",
        f"--max_steps={args.max_steps_per_model or 1_000_000}",  # by default the time budget ends training
        "--per_device_train_batch_size=64",
        "--per_device_eval_batch_size=64",
        "--optim=adamw_torch",
        "--learning_rate=1e-3",
        "--lr_scheduler_type=inverse_sqrt",
        f"--warmup_steps={args.warmup_steps}",
        "--label_smoothing_factor=0.1",
        "--train_sampling_strategy=group_by_length",
        "--num_beams=4",
        "--save_steps=500",
        "--save_total_limit=2",
        "--logging_steps=100",
        "--include_num_input_tokens_seen=true",  # padded source tokens ("non_padding" is not settable from the CLI)
        "--disable_tqdm=True",
        f"--dataloader_pin_memory={torch.cuda.is_available()}",
        "--seed=1",
    ]
    if MODELS[model_type]:
        command.append(f"--config_overrides={MODELS[model_type]}")
    if args.max_eval_samples:
        command.append(f"--max_eval_samples={args.max_eval_samples}")
    if args.max_predict_samples:
        command.append(f"--max_predict_samples={args.max_predict_samples}")
    results = run_translation(command)
    # whole-run training statistics (a resumed run's own metrics only cover its last session)
    state = json.loads((output_dir / "trainer_state.json").read_text())
    seconds = state["stateful_callbacks"]["TimeBudgetCallback"]["attributes"]["elapsed_seconds"]
    results["train"] = {
        "global_step": state["global_step"],
        "train_minutes": seconds / 60,
        "source_tokens_per_second": state["num_input_tokens_seen"] / seconds,
    }
    finished.write_text(json.dumps(results, indent=2) + "\n")
    return results


def decoder_group_table(args, test_pairs: list[dict]) -> list[dict]:
    """GTrans Table VI on the test set: BLEU of each decoder group alone and of the mixture of groups k..N."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    table_file = args.output_dir / "gtrans_decoder_groups.json"
    table = json.loads(table_file.read_text()) if table_file.is_file() else {}
    model_dir = args.output_dir / "gtrans"
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    num_groups = model.config.num_decoder_groups
    sources = [pair[SOURCE_LANG] for pair in test_pairs]
    references = [pair[TARGET_LANG] for pair in test_pairs]
    # "k" is group k alone, "k..N" the mixture of groups k..N; the last group alone is also "N..N", decoded once
    runs = {f"{k}": [k] for k in range(1, num_groups + 1)}
    runs.update({f"{k}..{num_groups}": list(range(k, num_groups + 1)) for k in range(1, num_groups)})
    for name, groups in runs.items():
        if name not in table:
            hypotheses = translate(model, tokenizer, sources, batch_size=64, decoder_groups=groups, progress=True)
            table[name] = corpus_bleu(hypotheses, references)[0]
            table_file.write_text(json.dumps(table, indent=2) + "\n")  # resumable, one entry at a time
    table[f"{num_groups}..{num_groups}"] = table[f"{num_groups}"]
    psi = model.model.decoder.readout.fusion_weights()["decoder_group_psi"].tolist()  # Table VI's "Weight" row
    return [
        {"k": k, "alone": table[f"{k}"], "mixed": table[f"{k}..{num_groups}"], "psi": psi[k - 1]}
        for k in range(1, num_groups + 1)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", type=Path, default=DEFAULT_DATA, help="Multi30k directory (default: %(default)s)")
    parser.add_argument("--output_dir", type=Path, default=Path("runs/bench_multi30k"))
    parser.add_argument("--minutes_per_model", type=float, default=35.0, help="Training wall-clock budget per model.")
    parser.add_argument(
        "--max_steps_per_model", type=int, default=None,
        help="Also stop at this many optimisation steps (a steps-matched comparison; the schedule does not depend on it).",
    )
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS), help="Models to run.")
    parser.add_argument(
        "--tokenizer_dir", type=Path, default=None,
        help="Reuse this tokenizer (default: <output_dir>/tokenizer, trained on the first run).",
    )
    parser.add_argument("--warmup_steps", type=int, default=1000)
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--max_eval_samples", type=int, default=None, help="Validation sentences (default: all).")
    parser.add_argument("--max_predict_samples", type=int, default=None, help="Test sentences (default: all).")
    args = parser.parse_args()

    corpus = load_parallel_text(args.data_dir, SOURCE_LANG, TARGET_LANG)
    tokenizer_dir = args.tokenizer_dir or args.output_dir / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        texts = [pair[lang] for pair in corpus["train"]["translation"] for lang in (SOURCE_LANG, TARGET_LANG)]
        train_joint_tokenizer(texts, args.vocab_size, model="unigram", save_dir=tokenizer_dir)

    results = {model_type: train_and_evaluate(model_type, args, tokenizer_dir) for model_type in args.models}
    table_vi = None
    if "gtrans" in results:
        test = corpus["test"]
        test_pairs = test.select(range(min(args.max_predict_samples or len(test), len(test))))["translation"]
        table_vi = decoder_group_table(args, test_pairs)
    (args.output_dir / "results.json").write_text(
        json.dumps({**results, "gtrans_decoder_groups": table_vi}, indent=2) + "\n"
    )

    budget = f"{args.minutes_per_model:g} min"
    if args.max_steps_per_model:
        budget += f" or {args.max_steps_per_model} steps (whichever comes first)"
    print(f"\nMulti30k {SOURCE_LANG}->{TARGET_LANG}, {budget} of training per model, beam 4")
    print(f"{'model':<18} {'steps':>7} {'minutes':>8} {'src tok/s':>10} {'val BLEU':>9} {'test BLEU':>10}")
    for model_type, result in results.items():
        train = result["train"]
        print(
            f"{model_type:<18} {train['global_step']:>7} {train['train_minutes']:>8.1f} "
            f"{train['source_tokens_per_second']:>10.0f} {result['validation']['bleu']:>9.2f} {result['test']['bleu']:>10.2f}"
        )
    print(f"sacreBLEU signature: {next(iter(results.values()))['test']['signature']}")
    if table_vi:
        print("\nGTrans decoder groups (paper Table VI), test BLEU:")
        print(f"{'k':>3} {'group k alone':>14} {'groups k..N mixed':>18} {'psi_k (Eq. 6)':>14}")
        for row in table_vi:
            print(f"{row['k']:>3} {row['alone']:>14.2f} {row['mixed']:>18.2f} {row['psi']:>14.3f}")
    print(f"\nReproduce: python benchmarks/bench_multi30k.py {shlex.join(sys.argv[1:])}".rstrip())


if __name__ == "__main__":
    main()
