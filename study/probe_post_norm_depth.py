"""Does a deep post-norm plain Transformer train on Multi30k, and how deep can a study run be on one core?

The quality-ledger issue's priority 2 pairs the plain model with GTrans at the depth where GTrans Table VIII says
post-norm "failed to train" without fusion (24 + 18 layers), or, if that pair does not fit ~90 minutes on one core,
at the shallowest post-norm depth at which the plain model fails here. This probe answers both questions for a list
of shapes: it trains the plain post-norm model of the study (the `multi30k` preset, `bench_multi30k.py`'s training
options, one thread) for `--steps` steps with the priority-2 schedule (warm-up 400: the learning rate peaks at
1e-3 inside the budget), logs the training loss every 25 steps, and writes one committed result file per shape
(`study/results/post_norm_depth/<family>_<E>x<D>_seed_<s>.json`, written once, never overwritten).

A shape *fails to train* when its loss is not finite or when the mean of its last four logged losses stays more
than `FAILURE_MARGIN` (1 nat) above the 6 + 6 model's under the same schedule: a stall of that size after the
learning-rate peak is what "failed to train" looks like at this scale, a slower start is not. The probe also
measures seconds per step, so `--report` prints the training minutes a 1,000-step study run of each shape needs.
The rule only chose the depth of priority 2's 1,000-step pair: its plain 24 + 18 model, "trains" by the rule,
translated at 2 BLEU after 1,000 steps, so whether the plain model trains at a depth is read from the 2,000-step
study runs (issue 38; `bench_multi30k.depth_runs` in the README's report), not from this rule.

    OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE nice -n 19 python -m study.probe_post_norm_depth --shapes 6x6 24x18 18x12 12x12   # resumable
    python -m study.probe_post_norm_depth --report
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import time
from pathlib import Path

from study import multi30k_ledger as ledger  # no torch at import
from study.common import (
    DEFAULT_DATA,
    REPO_ROOT,
    SOURCE_LANG,
    STUDY_RESULTS,
    TARGET_LANG,
    TRAINING_OPTIONS,
)

RESULTS_DIR = STUDY_RESULTS / "post_norm_depth"
TOKENIZER_DIR = ledger.DEFAULT_LEDGER / "tokenizer"
REFERENCE_SHAPE = (6, 6)
FAILURE_MARGIN = 1.0  # nats above the 6 + 6 model's loss at the end of the probe
LOGGING_STEPS = 25
FINAL_LOGS = 4  # the last 100 steps


def parse_shape(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"([1-9][0-9]*)x([1-9][0-9]*)", text)
    if match is None:
        raise argparse.ArgumentTypeError(f"a shape is <encoder layers>x<decoder layers>, e.g. 24x18; got {text!r}")
    return int(match[1]), int(match[2])


def result_file(results_dir: Path, family: str, shape: tuple[int, int], seed: int) -> Path:
    return results_dir / f"{family}_{shape[0]}x{shape[1]}_seed_{seed}.json"


def probe(shape: tuple[int, int], args) -> dict:
    """Train one shape (resuming its checkpoints) and return its result entry."""
    # imported here, not at the top: study/queue.py reads the verdicts of this module without torch
    from hf_layerfusion.cli.run_translation import main as run_translation

    encoder_layers, decoder_layers = shape
    output_dir = args.output_dir / f"{args.family}_{encoder_layers}x{decoder_layers}_seed_{args.seed}"
    command = [
        f"--dataset_name={args.data_dir}", f"--source_lang={SOURCE_LANG}", f"--target_lang={TARGET_LANG}",
        f"--model_type={args.family}", "--preset=multi30k", f"--tokenizer_name={args.tokenizer_dir}",
        f"--config_overrides=encoder_layers={encoder_layers},decoder_layers={decoder_layers}",
        f"--output_dir={output_dir}", "--do_train", "--resume_from_checkpoint=last",
        "--overwrite_output_dir=True",  # without a checkpoint the probe starts over in its own dir
        f"--max_steps={args.steps}", f"--warmup_steps={args.warmup_steps}",
        *(f"--{key}={value}" for key, value in TRAINING_OPTIONS.items()),
        f"--logging_steps={LOGGING_STEPS}", "--save_steps=200", "--save_total_limit=1", "--disable_tqdm=True",
        "--dataloader_pin_memory=False", f"--seed={args.seed}",
    ]
    run_translation(command)
    state = json.loads((output_dir / "trainer_state.json").read_text())
    seconds = state["stateful_callbacks"]["TimeBudgetCallback"]["attributes"]["elapsed_seconds"]
    # the gradient norm of the whole model and of the lowest layer of each stack: vanishing gradients in the lower
    # layers are how deep post-norm fails
    kept = ("step", "loss", "grad_norm", "layer_grad_norm/encoder_1", "layer_grad_norm/decoder_1")
    curve = [{key: log[key] for key in kept if key in log} for log in state["log_history"] if "loss" in log]
    return {
        "family": args.family,
        "encoder_layers": encoder_layers,
        "decoder_layers": decoder_layers,
        "normalize_before": False,
        "seed": args.seed,
        "steps": state["global_step"],
        "warmup_steps": args.warmup_steps,
        "training": TRAINING_OPTIONS,
        "seconds_per_step": seconds / state["global_step"],
        "loss_curve": curve,
        **ledger.code_revision(),
        "device": ledger.device_description(),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


# what the queue and the report read of a result file: a file without one of them is unreadable
REQUIRED_KEYS = ("encoder_layers", "decoder_layers", "steps", "warmup_steps", "seconds_per_step", "loss_curve",
                 "commit")


def result_problem(path: Path) -> str | None:
    """Why the existing result file `path` cannot be used, or None when it can."""
    try:
        ledger.read_result_file(path, REQUIRED_KEYS)
    except ledger.UnreadableResult as error:
        return error.problem
    return None


def read_results(results_dir: Path, family: str = "plain_transformer", seed: int = 1) -> dict[tuple[int, int], dict]:
    """`{(encoder layers, decoder layers): result}` of the finished probes of one family and seed;
    `multi30k_ledger.UnreadableResult` naming a file that cannot be read as a result."""
    results = {}
    for path in sorted(Path(results_dir).glob(f"{family}_*x*_seed_{seed}.json")):
        entry = ledger.read_result_file(path, REQUIRED_KEYS)
        results[entry["encoder_layers"], entry["decoder_layers"]] = entry
    return results


def final_loss(entry: dict) -> float:
    losses = [point["loss"] for point in entry["loss_curve"][-FINAL_LOGS:]]
    return sum(losses) / len(losses)


def fails(entry: dict, reference: dict) -> bool:
    """Whether the shape failed to train (see the module docstring): a non-finite loss, or a final loss more than
    `FAILURE_MARGIN` above the reference (6 + 6) model's."""
    if not all(math.isfinite(point["loss"]) for point in entry["loss_curve"]):
        return True
    return final_loss(entry) - final_loss(reference) > FAILURE_MARGIN


def training_minutes(entry: dict, steps: int) -> float:
    """Training minutes of a `steps`-step run of the probed shape, at the probe's measured speed."""
    return entry["seconds_per_step"] * steps / 60


def report(results_dir: Path, family: str = "plain_transformer", seed: int = 1) -> list[str]:
    """The probes' table (Markdown lines)."""
    results = read_results(results_dir, family, seed)
    if not results:
        return ["No depth probe has finished yet."]
    reference = results.get(REFERENCE_SHAPE)
    lines = [
        "| post-norm shape | steps (warm-up) | loss, last 100 steps | trains? | s / step | 1,000 steps | commit |",
        "|---|---|---|---|---|---|---|",
    ]
    for shape, entry in sorted(results.items(), key=lambda item: sum(item[0])):
        if reference is None:
            verdict = "no 6 + 6 reference yet"
        elif shape == REFERENCE_SHAPE:
            verdict = "reference"
        else:
            gap = final_loss(entry) - final_loss(reference)
            verdict = f"{'fails' if fails(entry, reference) else 'trains'} ({gap:+.2f} nats)"
        lines.append(
            f"| {shape[0]} + {shape[1]} | {entry['steps']} ({entry['warmup_steps']}) | {final_loss(entry):.2f} | "
            f"{verdict} | {entry['seconds_per_step']:.2f} | {training_minutes(entry, 1000):.0f} min | "
            f"{(entry['commit'] or 'unknown')[:10]} |"
        )
    lines += [
        "",
        f"{family}, seed {seed}, one thread, `nice`d beside other jobs (s / step as measured; a study run adds its "
        f"evaluation). A shape fails to train when its loss is not finite or its last 100 steps end more than "
        f"{FAILURE_MARGIN:g} nat above the 6 + 6 model's. Reproduce: `python -m study.probe_post_norm_depth "
        "--shapes " + " ".join(f"{e}x{d}" for e, d in sorted(results, key=sum)) + "`.",
    ]
    return lines


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", type=parse_shape, default=[REFERENCE_SHAPE],
                        help="Shapes to probe, e.g. 6x6 24x18 (default: 6x6).")
    parser.add_argument("--family", default="plain_transformer", help="Model type (default: %(default)s).")
    parser.add_argument("--steps", type=int, default=600, help="Training steps (default: %(default)s).")
    parser.add_argument("--warmup_steps", type=int, default=400, help="default: %(default)s (the priority-2 schedule)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--data_dir", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--tokenizer_dir", type=Path, default=TOKENIZER_DIR)
    parser.add_argument("--output_dir", type=Path, default=REPO_ROOT / "runs" / "post_norm_depth")
    parser.add_argument("--results_dir", type=Path, default=RESULTS_DIR)
    parser.add_argument("--report", action="store_true", help="Print the results table and exit.")
    args = parser.parse_args(argv)
    for name in ("steps", "warmup_steps", "threads", "seed"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be positive, got {getattr(args, name)}")
    from hf_layerfusion.modeling.registry import (
        check_model_type,  # the package imports torch: not at the top
    )

    try:
        check_model_type(args.family, "--family")
    except ValueError as error:
        parser.error(str(error))
    if args.steps < LOGGING_STEPS * FINAL_LOGS:
        parser.error(f"--steps must be at least {LOGGING_STEPS * FINAL_LOGS} (the verdict reads the loss of the last "
                     f"{FINAL_LOGS} logs, one every {LOGGING_STEPS} steps), got {args.steps}")
    if args.warmup_steps >= args.steps:
        parser.error(f"--warmup_steps ({args.warmup_steps}) must be below --steps ({args.steps}): the probe is about "
                     "what happens after the learning-rate peak")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.report:
        print("\n".join(report(args.results_dir, args.family, args.seed)))
        return
    import torch

    torch.set_num_threads(args.threads)
    for shape in args.shapes:
        path = result_file(args.results_dir, args.family, shape, args.seed)
        if path.is_file():
            problem = result_problem(path)
            if problem is None:
                print(f"probe: {path} exists, skipped")
                continue
            print(f"probe: replacing the unreadable {path} ({problem})")
        entry = probe(shape, args)
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        temporary.write_text(json.dumps(entry, indent=1) + "\n")
        os.replace(temporary, path)  # written once, whole
        print(f"probe: {shape[0]}x{shape[1]} done, {entry['seconds_per_step']:.2f} s/step; wrote {path}")
    print("\n".join(report(args.results_dir, args.family, args.seed)))


if __name__ == "__main__":
    main()
