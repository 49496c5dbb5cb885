"""Many-to-many benchmark, the study's priority 5: Multi30k's four languages as the stand-in for GTrans' OPUS-100
setting (Table V), plain Transformer vs GTrans, BLEU per direction and the win ratio.

One run = one arm and one seed, trained and evaluated by `examples/run_multilingual.py`:

- data: the English-centric stand-in (`--english_centric`): en<->de, en<->fr, en<->cs, six directions, 29,000,
  14,500 and 7,250 training pairs (Multi30k's en-de, then half, then a quarter) so that temperature sampling
  (T = 5) has sizes to even out; a target-language tag `<2xx>` before every source;
- model: the study's size (d_model 256, 6 + 6 post-norm layers, FFN 1024, 4 heads). Its encoder starts from a
  *random* XLM-R-shaped model (run_multilingual's `--tiny_random_xlmr` model, `save_random_xlmr`:
  `XLMRobertaModel` with random weights and an 8k unigram XLM-R-style tokenizer trained on the stand-in's training
  text), i.e. it is trained from scratch with XLM-R's conventions (special ids, learned positions offset by the
  padding id, embedding LayerNorm, GELU). Its tokenizer is committed with the ledger
  (`study/results/multi30k_m2m/tokenizer`: it came from a unigram trainer that was not deterministic) and its weights are drawn
  under the run's seed, so both arms of a seed, on any machine, start from the same model (built once per output
  dir in `<output_dir>/xlmr/seed_<s>`, passed as `--xlmr`; the ledger records its hashes). `plain_transformer_m2m`
  has fusion off, `gtrans_m2m` is GTrans with T_e = 3, T_d = 2 (bench_multi30k's `GTRANS`);
- training: bench_multi30k's `TRAINING_OPTIONS` (AdamW lr 1e-3, inverse-sqrt schedule, label smoothing 0.1, 64
  sentences per batch grouped by length), 1,000 warm-up steps, 2,000 steps (steps-matched);
- evaluation: beam 4, every test sentence (test_2016_flickr) of each direction, sacreBLEU.

A finished run is written once into the ledger, `study/results/multi30k_m2m/<arm>/seed_<s>.json`
(`multi30k_ledger.write_entry`: atomic, never overwritten), with the provenance of the en->de entries plus BLEU and
the test translations per direction and the training sizes. `--report` prints the README's many-to-many table from
the ledger alone (`report_lines`): mean BLEU per direction, GTrans minus plain, sacreBLEU's paired bootstrap p per
direction and seed, and the win ratio (Table V's WR). `study/queue.py` runs the six runs (seeds 1-3) after its
priority 4.

A run saves a checkpoint every 500 steps (the newest kept), and an interrupted run continues from it
(`--resume_from_checkpoint last`; `study/queue.py` resumes it with the code of the commit that started it): on
one CPU core a run takes longer than what a working session may have left. Smoke test (a few steps, 5 test sentences
per direction; its BLEU means nothing):

    python -m study.bench_multilingual --arm gtrans_m2m --seed 1 --max_steps 3 --warmup_steps 1 \\
        --standin_train_size 64 --max_eval_samples 5 --max_new_tokens 8 --tiny_vocab_size 300 \\
        --output_dir /tmp/m2m_smoke/runs --ledger_dir /tmp/m2m_smoke/ledger --tokenizer_dir /tmp/m2m_smoke/tokenizer
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import time
from pathlib import Path

import torch
from transformers import XLMRobertaTokenizer, set_seed

from hf_layerfusion.cli.run_multilingual import (
    DataArguments,
    ModelArguments,
    multi30k_standin,
    save_random_xlmr,
    train_xlmr_tokenizer,
    training_texts,
)
from hf_layerfusion.cli.run_multilingual import main as run_multilingual
from hf_layerfusion.training.data import load_parallel_text
from hf_layerfusion.training.multilingual import (
    both_directions,
    split_direction,
    win_ratio,
)
from study import multi30k_ledger as ledger
from study.common import (
    DEFAULT_DATA,
    GTRANS,
    REPO_ROOT,
    TRAINING_OPTIONS,
    format_value,
    paired_bootstrap,
    positive_int,
)
from study.training_time import seconds_trained_before, trained_seconds

DEFAULT_LEDGER = ledger.M2M_LEDGER
BASE_ARM = "plain_transformer_m2m"
# arm: (family, config overrides on top of MODEL_SHAPE)
ARMS = {BASE_ARM: ("plain_transformer", {}), "gtrans_m2m": ("gtrans", GTRANS)}
# the encoder's shape comes from the random XLM-R; the decoder's from these overrides (the study's 6 + 6 size)
TINY_XLMR_CONFIG = "hidden_size=256,num_hidden_layers=6,num_attention_heads=4,intermediate_size=1024"
MODEL_SHAPE = dict(decoder_layers=6, decoder_ffn_dim=1024, decoder_attention_heads=4)
STANDIN_TRAIN_SIZE = 29_000  # Multi30k's whole en-de training set for en-de; en-fr and en-cs get half and a quarter
TEMPERATURE = 5.0
STANDIN_PAIRS = ("en-de", "en-fr", "en-cs")  # run_multilingual --english_centric's pairs, in its order


def run_dir(args, arm: str, seed: int) -> Path:
    return args.output_dir / arm / f"seed_{seed}"


def run_multilingual_command(args) -> list[str]:
    """`examples/run_multilingual.py`'s arguments for the run of `args.arm` and `args.seed`."""
    model_type, arm_config = ARMS[args.arm]
    directory = run_dir(args, args.arm, args.seed)
    overrides = {**MODEL_SHAPE, **arm_config}
    command = [
        "--dataset=multi30k",
        f"--multi30k_dir={args.data_dir}",
        "--english_centric=True",
        f"--standin_train_size={args.standin_train_size}",
        f"--temperature={TEMPERATURE}",
        f"--xlmr={starting_model_dir(args)}",
        "--preset=none",  # the shape is the random XLM-R's and MODEL_SHAPE's
        f"--model_type={model_type}",
        "--config_overrides=" + ",".join(f"{key}={format_value(value)}" for key, value in overrides.items()),
        f"--output_dir={directory / 'model'}",
        "--overwrite_output_dir=True",  # a run dir without checkpoints is started over
        "--resume_from_checkpoint=last",  # an interrupted run continues from its newest checkpoint
        "--do_train",
        f"--max_steps={args.max_steps}",
        f"--warmup_steps={args.warmup_steps}",
        *(f"--{key}={value}" for key, value in TRAINING_OPTIONS.items()),
        f"--num_beams={args.num_beams}",
        "--save_steps=500",
        "--save_total_limit=1",
        "--logging_steps=50",  # the loss curve of the ledger
        "--report_to=none",
        "--disable_tqdm=True",
        f"--dataloader_pin_memory={torch.cuda.is_available()}",
        f"--seed={args.seed}",
    ]
    for option in ("max_eval_samples", "max_new_tokens"):
        if getattr(args, option):
            command.append(f"--{option}={getattr(args, option)}")
    return command


def starting_model_dir(args) -> Path:
    return args.output_dir / "xlmr" / f"seed_{args.seed}"


def study_tokenizer(args) -> XLMRobertaTokenizer:
    """The XLM-R-style tokenizer of every run: read from `--tokenizer_dir` (committed with the ledger), or trained
    on the stand-in's training text and saved there when it is missing (then commit it: the unigram trainer is not
    deterministic, so a retrained tokenizer would make new runs incomparable with the ledger's)."""
    config_file = args.tokenizer_dir / "tokenizer_config.json"
    if config_file.is_file():
        return XLMRobertaTokenizer.from_pretrained(args.tokenizer_dir)
    data_args = DataArguments(dataset="multi30k", multi30k_dir=str(args.data_dir), english_centric=True,
                              standin_train_size=args.standin_train_size)
    pairs, _ = multi30k_standin(data_args)
    tokenizer = train_xlmr_tokenizer(training_texts(pairs), args.tiny_vocab_size)
    tokenizer.save_pretrained(args.tokenizer_dir)
    print(f"Trained the runs' tokenizer into {args.tokenizer_dir}: commit it with the ledger.")
    return tokenizer


def build_starting_model(args) -> Path:
    """The random XLM-R-shaped model both arms of `args.seed` start from: the study's tokenizer and weights drawn
    under the seed, so that any machine builds the same model (the ledger records its hashes). Built once per
    output dir, into a temporary directory renamed into place (an interrupted build is redone)."""
    directory = starting_model_dir(args)
    if directory.is_dir():
        return directory
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    tokenizer = study_tokenizer(args)
    set_seed(args.seed)
    save_random_xlmr(str(partial), tokenizer, ModelArguments(tiny_xlmr_config=TINY_XLMR_CONFIG))
    partial.rename(directory)
    return directory


def train_and_evaluate(args) -> dict:
    """Train and evaluate one run (the expensive call), or read back its finished results: run_multilingual's
    `direction_scores.json` plus its evaluation time, cached in `<run dir>/bench_results.json` (study/queue.py's
    marker of a finished run)."""
    directory = run_dir(args, args.arm, args.seed)
    finished = directory / "bench_results.json"
    if finished.is_file():
        return json.loads(finished.read_text())
    build_starting_model(args)
    seconds_before = seconds_trained_before(directory / "model")
    started = time.monotonic()
    results = run_multilingual(run_multilingual_command(args))
    session_minutes = (time.monotonic() - started) / 60
    # this session's time but its training (a resumed run trained before it): the translations of every direction
    results["evaluation_minutes"] = session_minutes - (trained_seconds(directory / "model") - seconds_before) / 60
    finished.write_text(json.dumps(results, indent=1) + "\n")
    return results


def test_references(data_dir: Path) -> dict[str, list[str]]:
    """Every test reference (test_2016_flickr) of each direction."""
    references = {}
    for pair in STANDIN_PAIRS:
        test = load_parallel_text(data_dir, *split_direction(pair))["test"]["translation"]
        for direction in both_directions([pair]):
            target_lang = split_direction(direction)[1]
            references[direction] = [row[target_lang] for row in test]
    return references


def ledger_entry(args, results: dict) -> dict:
    """The ledger's record of one finished run (the en->de entries' provenance, with BLEU and the test
    translations per direction)."""
    model_type, arm_config = ARMS[args.arm]
    model_dir = run_dir(args, args.arm, args.seed) / "model"
    state = json.loads((model_dir / "trainer_state.json").read_text())
    references = test_references(args.data_dir)
    directions = {}
    for direction, hypotheses in results["hypotheses"].items():
        used = references[direction][: len(hypotheses)]
        directions[direction] = {"bleu": results["scores"][direction], "sentences": len(hypotheses),
                                 "references_sha256": ledger.sha256_lines(used), "hypotheses": hypotheses}
    return {
        "arm": args.arm,
        "family": model_type,
        "baseline": None if args.arm == BASE_ARM else BASE_ARM,
        "arm_config": {**MODEL_SHAPE, **arm_config},
        "config": json.loads((model_dir / "config.json").read_text()),
        "training": {**TRAINING_OPTIONS, "warmup_steps": args.warmup_steps, "max_steps": args.max_steps,
                     "num_beams": args.num_beams, "max_new_tokens": args.max_new_tokens,
                     "temperature": TEMPERATURE, "english_centric": True,
                     "standin_train_size": args.standin_train_size, "tiny_xlmr_config": TINY_XLMR_CONFIG,
                     "tiny_vocab_size": args.tiny_vocab_size},
        "seed": args.seed,
        "steps": state["global_step"],
        "train_minutes": trained_seconds(model_dir) / 60,  # across sessions
        # None for a run dir that finished before its evaluation time was recorded
        "evaluation_minutes": results.get("evaluation_minutes"),
        **ledger.code_revision(REPO_ROOT),
        "device": ledger.device_description(),
        "finished_at": ledger.now(),
        "tokenizer_sha256": ledger.file_sha256(model_dir / "tokenizer.json"),
        "starting_model": {"dir": str(starting_model_dir(args)),
                           "tokenizer_sha256": ledger.file_sha256(starting_model_dir(args) / "tokenizer.json"),
                           "weights_sha256": ledger.file_sha256(starting_model_dir(args) / "model.safetensors")},
        "train_sizes": results["train_sizes"],
        "signature": results["signature"],
        "directions": directions,
        "loss_curve": ledger.loss_curve(state),
    }


# --- the report ------------------------------------------------------------------------------------------------


def report_lines(ledger_dir: Path, references: dict[str, list[str]]) -> list[str]:
    """The README's many-to-many section (Markdown lines) from the ledger alone and the test references of each
    direction: per direction, each arm's mean test BLEU over seeds, GTrans minus plain (mean over the seeds both
    arms finished), the paired bootstrap p of each such seed, and the win ratio of GTrans' means over plain's."""
    runs = ledger.read_ledger(ledger_dir, ledger.MANY_TO_MANY_REQUIRED_KEYS) if Path(ledger_dir).is_dir() else {}
    if not runs:
        return ["No many-to-many run (priority 5) has finished yet."]
    title = ("Many-to-many, priority 5 (`study/bench_multilingual.py`: en<->de, en<->fr, en<->cs of Multi30k "
             "as the stand-in for OPUS-100, target tags, temperature sampling T = 5), plain vs GTrans, test BLEU "
             "per direction:")
    arms = [arm for arm in ARMS if arm in runs]
    directions = list(next(iter(next(iter(runs.values())).values()))["directions"])
    for by_seed in runs.values():
        for entry in by_seed.values():
            for direction in directions:
                scored = entry["directions"][direction]
                if ledger.sha256_lines(references[direction][: scored["sentences"]]) != scored["references_sha256"]:
                    raise ValueError(f"Run {entry['arm']} seed {entry['seed']} scored {direction} on other test "
                                     "references.")
    common = sorted(set(runs.get(BASE_ARM, {})) & set(runs.get("gtrans_m2m", {})))
    for seed in common:
        # the random XLM-R is built per seed on the machine that runs the seed's first arm; a rebuild elsewhere (another
        # tokenizer, another torch's random draws) would make the two arms of the seed incomparable
        plain, gtrans = (runs[arm][seed]["starting_model"] for arm in (BASE_ARM, "gtrans_m2m"))
        if any(plain[key] != gtrans[key] for key in ("tokenizer_sha256", "weights_sha256")):
            raise ValueError(
                f"{BASE_ARM} and gtrans_m2m seed {seed} started from different random XLM-R models ({plain['dir']} vs "
                f"{gtrans['dir']}: tokenizer or weights differ). Remove the later ledger entry (git rm) and run it "
                "again from the other's starting model."
            )

    def mean_bleu(arm: str, direction: str, seeds) -> float:
        return statistics.fmean(runs[arm][s]["directions"][direction]["bleu"] for s in seeds)

    sizes = next(iter(next(iter(runs.values())).values()))["train_sizes"]
    header = ["direction", "train pairs", *(f"`{arm}`, {len(runs[arm])} seed(s)" for arm in arms)]
    if common:
        header += ["Δ (GTrans − plain)", "p per seed"]
    lines = [title, "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    deltas = {}
    for direction in directions:
        cells = [direction, f"{sizes[direction]:,}", *(f"{mean_bleu(arm, direction, runs[arm]):.2f}" for arm in arms)]
        if common:
            deltas[direction] = mean_bleu("gtrans_m2m", direction, common) - mean_bleu(BASE_ARM, direction, common)
            p_values = []
            for seed in common:
                plain, gtrans = (runs[arm][seed]["directions"][direction] for arm in (BASE_ARM, "gtrans_m2m"))
                used = references[direction][: plain["sentences"]]
                p_values.append(paired_bootstrap(plain["hypotheses"], gtrans["hypotheses"], used)["p_value"])
            cells += [f"{deltas[direction]:+.2f}", " / ".join(f"{p:.3f}" for p in p_values)]
        lines.append("| " + " | ".join(cells) + " |")
    average = ["average", "", *(f"{statistics.fmean(mean_bleu(arm, d, runs[arm]) for d in directions):.2f}"
                                for arm in arms)]
    if common:
        average += [f"{statistics.fmean(deltas.values()):+.2f}", ""]
    lines.append("| " + " | ".join(average) + " |")
    signatures = sorted({entry["signature"] for by_seed in runs.values() for entry in by_seed.values()})
    lines += ["", f"BLEU: sacreBLEU `{'`, `'.join(signatures)}`, beam 4, mean over seeds. Δ and p over the seeds "
                  "both arms finished; p: paired bootstrap (1,000 resamples, two-sided) of GTrans' test translations "
                  "against plain's of the same seed."]
    if common:
        gtrans = {d: mean_bleu("gtrans_m2m", d, common) for d in directions}
        plain = {d: mean_bleu(BASE_ARM, d, common) for d in directions}
        wins = sum(gtrans[d] > plain[d] for d in directions)
        lines += ["", f"Win ratio (paper Table V's WR: directions where GTrans' mean BLEU is higher than plain's, "
                      f"over {len(common)} seed(s)): {wins} of {len(directions)} = {win_ratio(gtrans, plain):.1f}%."]
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", choices=list(ARMS), help="The arm of the run.")
    parser.add_argument("--seed", type=positive_int, help="The seed of the run (initialisation and batch order).")
    parser.add_argument("--data_dir", type=Path, default=DEFAULT_DATA, help="Multi30k directory (default: %(default)s)")
    parser.add_argument("--output_dir", type=Path, default=Path("runs/bench_multilingual"),
                        help="Run directories, <output_dir>/<arm>/seed_<s> (default: %(default)s)")
    parser.add_argument("--ledger_dir", type=Path, default=DEFAULT_LEDGER, help="default: %(default)s")
    parser.add_argument("--max_steps", type=positive_int, default=2000)
    parser.add_argument("--warmup_steps", type=positive_int, default=1000)
    parser.add_argument("--num_beams", type=positive_int, default=4)
    parser.add_argument("--standin_train_size", type=positive_int, default=STANDIN_TRAIN_SIZE,
                        help="Training pairs of en-de; en-fr and en-cs have half and a quarter (default: %(default)s)")
    parser.add_argument("--tokenizer_dir", type=Path, default=DEFAULT_LEDGER / "tokenizer",
                        help="The runs' tokenizer, trained into it when missing (default: %(default)s)")
    parser.add_argument("--tiny_vocab_size", type=positive_int, default=8000,
                        help="Vocabulary of the tokenizer trained when --tokenizer_dir has none (default: %(default)s)")
    parser.add_argument("--max_eval_samples", type=positive_int, default=None,
                        help="Test sentences per direction (default: all); for smoke runs.")
    parser.add_argument("--max_new_tokens", type=positive_int, default=None,
                        help="Longest translation (default: run_multilingual's, 128 tokens); for smoke runs.")
    parser.add_argument("--report", action="store_true", help="Print the many-to-many table from the ledger, exit.")
    args = parser.parse_args(argv)
    if not args.report and (args.arm is None or args.seed is None):
        parser.error("a run needs --arm and --seed (or --report)")
    tokenizer_dir = args.tokenizer_dir
    if not (tokenizer_dir / "tokenizer_config.json").is_file() and tokenizer_dir.exists() and (
            not tokenizer_dir.is_dir() or any(tokenizer_dir.iterdir())):
        parser.error(f"--tokenizer_dir {tokenizer_dir} holds no tokenizer (no tokenizer_config.json) and is not an "
                     "empty directory: a new tokenizer would be written over what is there")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.report:
        print("\n".join(report_lines(args.ledger_dir, test_references(args.data_dir))))
        return
    path = ledger.ledger_path(args.ledger_dir, args.arm, args.seed)
    if path.exists() and ledger.entry_problem(path, ledger.MANY_TO_MANY_REQUIRED_KEYS) is None:
        print(f"Ledger: {path} exists already; nothing to run.")
        return
    results = train_and_evaluate(args)
    ledger.write_entry(path, ledger_entry(args, results), ledger.MANY_TO_MANY_REQUIRED_KEYS)
    print(f"Ledger: wrote {path}")


if __name__ == "__main__":
    main()
