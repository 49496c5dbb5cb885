"""Speed and memory of the hf_layerfusion backbone on real Multi30k sentences (CPU).

Compares, in one run, with the same dimensions (`from_preset("multi30k")`) and the same weights:

A. `MarianMTModel` vs the plain backbone (`from_marian(marian, model_type="plain_transformer")`): greedy and
   beam-4 generation (sentences/s; the outputs must be token-for-token identical, asserted) and training
   (non-pad target tokens/s of forward + backward + AdamW step).
B. GTrans (T_e = 3, T_d = 2 -> 3 decoder groups; T_e = 3, T_d = 1 -> 6 decoder groups) vs the plain backbone:
   the same metrics plus the peak memory of a training step.

Timed measurements alternate between the models (the order flips every repeat); the table gives medians and the
ratios are medians of per-repeat ratios, so they hold up under other load on shared cores. OpenMP threads wait
passively (`OMP_WAIT_POLICY=PASSIVE` unless set): spin-waiting threads on oversubscribed cores are ~30x slower.
Peak memory is measured in a fresh subprocess per model: see `memory_worker`.

    python benchmarks/bench_backbone.py            # full run (~4.5 min on 2 cores shared with other jobs)
    python benchmarks/bench_backbone.py --quick    # ~70 s smoke run
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Set before torch loads OpenMP. With libgomp's default spin-waiting, 2 threads on 2 cores shared with other
# processes run ~30x slower (measured: greedy batch 10.6 s vs 0.38 s passive); passive waiting keeps the numbers
# meaningful on a shared machine. Override from the environment, e.g. OMP_WAIT_POLICY=ACTIVE.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))  # run from a checkout without installing

import transformers  # noqa: E402
from transformers import MarianConfig, MarianMTModel  # noqa: E402

import hf_layerfusion  # noqa: E402
from hf_layerfusion import PlainTransformerConfig, from_marian  # noqa: E402
from hf_layerfusion.tokenization import train_joint_tokenizer  # noqa: E402

DEFAULT_DATA = REPO_ROOT.parent / "shared" / "data" / "multi30k"
MODEL_NAMES = ("marian", "plain", "gtrans_td2", "gtrans_td1")
MODEL_TITLES = {
    "marian": "MarianMTModel",
    "plain": "plain backbone",
    "gtrans_td2": "GTrans T_e=3,T_d=2 (3 groups)",
    "gtrans_td1": "GTrans T_e=3,T_d=1 (6 groups)",
}
GTRANS_OVERRIDES = {
    "gtrans_td2": dict(encoder_group_size=3, decoder_group_size=2),
    "gtrans_td1": dict(encoder_group_size=3, decoder_group_size=1),
}


# ------------------------------------------------------------------------------------------------ data
def read_lines(path: Path) -> list[str]:
    if not path.is_file():
        raise FileNotFoundError(f"Multi30k file {path} not found; pass --data DIR holding train.en/train.de/...")
    return path.read_text(encoding="utf-8").splitlines()


def train_tokenizer(data_dir: Path, vocab_size: int):
    """Joint en+de BPE tokenizer trained on the train split (the package's `train_joint_tokenizer`)."""
    texts = read_lines(data_dir / "train.en") + read_lines(data_dir / "train.de")
    return train_joint_tokenizer(texts, vocab_size, model="bpe")


def encode_batch(tokenizer, sources: list[str], targets: list[str] | None = None) -> dict[str, torch.Tensor]:
    batch = dict(tokenizer(sources, text_target=targets, padding=True, return_tensors="pt"))
    if targets is not None:
        batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tokenizer.pad_token_id, -100)
    return batch


def build_batches(args, tokenizer, num_train_batches: int):
    """Generation batches from the test split (en source) and training batches from a fixed shuffle of train."""
    test_en = read_lines(args.data / "test_2016_flickr.en")
    generation = [
        encode_batch(tokenizer, test_en[i * args.gen_batch_size : (i + 1) * args.gen_batch_size])
        for i in range(args.gen_batches)
    ]
    train_en, train_de = read_lines(args.data / "train.en"), read_lines(args.data / "train.de")
    order = torch.randperm(len(train_en), generator=torch.Generator().manual_seed(args.seed)).tolist()
    training = []
    for i in range(num_train_batches):
        rows = order[i * args.train_batch_size : (i + 1) * args.train_batch_size]
        training.append(encode_batch(tokenizer, [train_en[r] for r in rows], [train_de[r] for r in rows]))
    return generation, training


# ------------------------------------------------------------------------------------------------ models
def build_marian(vocab_size: int, seed: int) -> MarianMTModel:
    """A random-init `MarianMTModel` with the Multi30k preset's dimensions and the package's special tokens."""
    preset = PlainTransformerConfig.from_preset("multi30k", vocab_size=vocab_size)
    config = MarianConfig(
        vocab_size=vocab_size,
        decoder_vocab_size=vocab_size,
        share_encoder_decoder_embeddings=True,
        d_model=preset.d_model,
        encoder_layers=preset.encoder_layers,
        decoder_layers=preset.decoder_layers,
        encoder_attention_heads=preset.encoder_attention_heads,
        decoder_attention_heads=preset.decoder_attention_heads,
        encoder_ffn_dim=preset.encoder_ffn_dim,
        decoder_ffn_dim=preset.decoder_ffn_dim,
        max_position_embeddings=preset.max_position_embeddings,
        activation_function=preset.activation_function,
        scale_embedding=preset.scale_embedding,
        dropout=preset.dropout,
        attention_dropout=preset.attention_dropout,
        activation_dropout=preset.activation_dropout,
        init_std=preset.init_std,
        pad_token_id=preset.pad_token_id,
        bos_token_id=preset.bos_token_id,
        eos_token_id=preset.eos_token_id,
        decoder_start_token_id=preset.decoder_start_token_id,
        forced_eos_token_id=None,
    )
    torch.manual_seed(seed)
    return MarianMTModel(config)


def build_models(marian: MarianMTModel, names) -> dict[str, torch.nn.Module]:
    """Every model carries the Marian weights (GTrans adds its fusion weights at their paper initialisation)."""
    models = {}
    for name in names:
        if name == "marian":
            models[name] = marian
        elif name == "plain":
            models[name] = from_marian(marian, model_type="plain_transformer")
        else:
            models[name] = from_marian(marian, model_type="gtrans", **GTRANS_OVERRIDES[name])
    return models


# ------------------------------------------------------------------------------------------------ measurements
@torch.inference_mode()
def generate(model, batch, num_beams: int, max_new_tokens: int) -> torch.Tensor:
    # min_new_tokens = max_new_tokens: every model does the same number of decoder steps whatever its weights
    return model.generate(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        num_beams=num_beams,
        do_sample=False,
        max_new_tokens=max_new_tokens,
        min_new_tokens=max_new_tokens,
        early_stopping=False,
    )


def assert_same_outputs(models, batches, num_beams: int, max_new_tokens: int) -> str:
    """A: Marian and the plain backbone share their weights, so they must generate the same tokens."""
    for batch in batches:
        backbone = generate(models["plain"], batch, num_beams, max_new_tokens)
        marian = generate(models["marian"], batch, num_beams, max_new_tokens)
        if not torch.equal(backbone, marian):
            different = (backbone != marian).any(dim=-1).sum() if backbone.shape == marian.shape else "all"
            raise AssertionError(f"num_beams={num_beams}: plain backbone and Marian outputs differ ({different} rows)")
    sentences = sum(len(b["input_ids"]) for b in batches)
    return f"yes ({sentences}/{sentences} sentences)"


def train_step(model, optimizer, batch) -> None:
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def time_generation(model, batches, num_beams, max_new_tokens) -> float:
    """Sentences per second over all generation batches."""
    start = time.perf_counter()
    for batch in batches:
        generate(model, batch, num_beams, max_new_tokens)
    return sum(len(b["input_ids"]) for b in batches) / (time.perf_counter() - start)


def time_training(model, optimizer, batches) -> float:
    """Non-pad target tokens per second of forward + backward + AdamW step."""
    start = time.perf_counter()
    for batch in batches:
        train_step(model, optimizer, batch)
    return sum(int(b["labels"].ne(-100).sum()) for b in batches) / (time.perf_counter() - start)


def interleaved_samples(names, repeats: int, measure) -> dict[str, list[float]]:
    """`measure(name)` for every model, alternating models and flipping the order every repeat."""
    samples = {name: [] for name in names}
    for repeat in range(repeats):
        for name in names if repeat % 2 == 0 else reversed(names):
            samples[name].append(measure(name))
    return samples


def rss_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_worker(args) -> None:
    """Runs in a fresh subprocess: peak RSS increase of training steps of one model, printed as JSON.

    After model, optimizer and batches are set up, one warm-up step allocates the AdamW state. Then, for each
    measured step, the kernel's peak-RSS counter is reset (`echo 5 > /proc/self/clear_refs`, Linux >= 4.0) and the
    step's cost is VmHWM (peak RSS during the step) minus VmRSS before it: activations, logits, gradients and
    temporaries, nothing allocated before. The parent sets MALLOC_MMAP_THRESHOLD_ so every tensor above 64 KiB is
    mmap-ed and returned to the kernel when freed, making RSS follow live memory instead of malloc's free lists.
    """
    torch.set_num_threads(args.threads)
    work = Path(args.memory_worker)
    marian = MarianMTModel.from_pretrained(work / "marian")
    model = build_models(marian, [args.worker_model])[args.worker_model]
    model.train()
    batches = torch.load(work / "train_batches.pt")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train_step(model, optimizer, batches[0])
    increases = []
    for batch in batches[1:]:
        gc.collect()
        Path("/proc/self/clear_refs").write_text("5")
        before = rss_kib("VmRSS")
        train_step(model, optimizer, batch)
        increases.append(rss_kib("VmHWM") - before)
    print(json.dumps({"peak_increase_kib": increases}))


def measure_peak_memory(args, names, marian, training_batches) -> dict[str, list[float]]:
    """Peak-RSS increase (MiB) of each measured training step, each model in its own fresh subprocess.

    The subprocesses run side by side (after the timings): a process's own peak RSS does not depend on others.
    """
    peaks = {}
    with tempfile.TemporaryDirectory() as work:
        marian.save_pretrained(Path(work) / "marian")
        torch.save(training_batches, Path(work) / "train_batches.pt")
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
        workers = {}
        for name in names:
            command = [sys.executable, __file__, "--threads", str(args.threads), "--memory-worker", work]
            workers[name] = subprocess.Popen(
                [*command, "--worker-model", name], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        for name, worker in workers.items():
            stdout, stderr = worker.communicate()
            if worker.returncode:
                raise RuntimeError(f"memory worker for {name} failed:\n{stderr[-3000:]}")
            report = json.loads(stdout.strip().splitlines()[-1])
            peaks[name] = [kib / 1024 for kib in report["peak_increase_kib"]]
    return peaks


def time_models(args, eval_models, generation_batches, training_batches) -> dict[str, dict[str, list[float]]]:
    """Greedy, beam and training throughput samples of every model, interleaved."""
    # training changes the weights: train copies, so the generation models keep identical weights
    train_models = {name: copy.deepcopy(model).train() for name, model in eval_models.items()}
    optimizers = {name: torch.optim.AdamW(model.parameters(), lr=1e-4) for name, model in train_models.items()}
    for name in eval_models:  # warm-up: first calls, AdamW state allocation
        generate(eval_models[name], generation_batches[0], 1, 2)
        train_step(train_models[name], optimizers[name], training_batches[0])
    names = list(eval_models)
    return {
        "greedy": interleaved_samples(
            names, args.repeats, lambda n: time_generation(eval_models[n], generation_batches, 1, args.max_new_tokens)
        ),
        "beam": interleaved_samples(
            names,
            args.repeats,
            lambda n: time_generation(eval_models[n], generation_batches, args.num_beams, args.max_new_tokens),
        ),
        "train": interleaved_samples(
            names, args.repeats, lambda n: time_training(train_models[n], optimizers[n], training_batches)
        ),
    }


# ------------------------------------------------------------------------------------------------ report
def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def loadavg() -> str:
    return "(" + ", ".join(f"{value:.2f}" for value in os.getloadavg()) + ")"


def git_revision() -> str:
    def git(*arguments):
        result = subprocess.run(["git", *arguments], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        return result.stdout.strip()

    revision = git("rev-parse", "--short", "HEAD") or "unknown"
    return revision + ("+uncommitted changes" if git("status", "--porcelain") else "")


def paired_ratios(samples: dict[str, list[float]], numerator: str, denominator: str) -> list[float]:
    """Ratios of samples taken side by side (same repeat, or same batch for memory)."""
    return [a / b for a, b in zip(samples[numerator], samples[denominator])]


def print_report(args, command, setup, results, outputs_equal):
    names = list(results["greedy"])
    print("## hf_layerfusion backbone benchmark (CPU)\n")
    print(f"- command (from the repository root): `{command}`")
    print(
        f"- torch {torch.__version__}, transformers {transformers.__version__}, hf_layerfusion "
        f"{hf_layerfusion.__version__} (git {setup['git']}), Python {platform.python_version()}"
    )
    print(f"- CPU: {cpu_model()} ({os.cpu_count()} logical CPUs visible), torch threads: {torch.get_num_threads()}, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
    print(f"- load average (1, 5, 15 min) at start: {setup['loadavg_start']}, at end: {loadavg()}")
    if max(setup["loadavg_start_1min"], os.getloadavg()[0]) > os.cpu_count():
        print(
            "- WARNING: load average above the CPU count: other processes compete for the cores, absolute numbers "
            "are depressed and noisy; the side-by-side ratios are the more trustworthy figures"
        )
    print(
        f"- model: Multi30k preset (d_model {setup['d_model']}, {setup['layers']} layers, {setup['heads']} heads, "
        f"FFN {setup['ffn']}), vocab {setup['vocab']} (joint BPE, `train_joint_tokenizer` on train.en+train.de, "
        f"{setup['tokenizer_s']:.1f}s), {setup['params']:,} Marian parameters, random init (seed {args.seed}), "
        f"attention: {setup['attn']}"
    )
    print(
        f"- generation: {args.gen_batches} batch(es) of {args.gen_batch_size} test_2016_flickr.en sentences, "
        f"exactly {args.max_new_tokens} new tokens (min_new_tokens = max_new_tokens), eval mode, inference_mode"
    )
    print(
        f"- training: {args.train_steps} batch(es) of {args.train_batch_size} shuffled train sentences (en->de, "
        f"{setup['train_tokens']} non-pad target tokens; {setup['train_pad']:.0%} of label positions are padding) "
        "per measurement, forward+backward+AdamW, dropout 0.1, after a warm-up step"
    )
    print(
        f"- timings: {args.repeats} repeats, models alternated (order flipped every repeat); table = medians, "
        "ratios = median of the per-repeat ratios [min-max]"
    )
    print(
        "- peak memory: each model in a fresh subprocess; after a warm-up step (allocates the AdamW state), for each "
        f"of {args.memory_steps} training step(s): peak RSS during the step (VmHWM, reset by writing 5 to "
        "/proc/self/clear_refs) minus RSS just before it, with MALLOC_MMAP_THRESHOLD_=65536 so freed tensors leave "
        "RSS. Counts activations, logits, gradients and temporaries, not weights or optimizer state; median over "
        "the steps, ratios paired by batch"
    )
    print(
        f"- Marian vs plain backbone outputs token-for-token identical: greedy {outputs_equal['greedy']}, "
        f"beam-{args.num_beams} {outputs_equal['beam']} (asserted)\n"
    )

    ratio_columns = [
        (a, b) for a, b in (("plain", "marian"), ("gtrans_td2", "plain"), ("gtrans_td1", "plain"))
        if a in names and b in names
    ]
    header = ["metric"] + [MODEL_TITLES[n] for n in names] + [f"{a} / {b}" for a, b in ratio_columns]
    rows = [
        ("greedy sentences/s", "greedy", "{:.1f}"),
        (f"beam-{args.num_beams} sentences/s", "beam", "{:.1f}"),
        ("training target tokens/s", "train", "{:.0f}"),
        ("training step peak memory (MiB)", "memory", "{:.1f}"),
    ]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    ratios = {}
    for title, key, fmt in rows:
        cells = [title] + [fmt.format(statistics.median(results[key][n])) for n in names]
        for a, b in ratio_columns:
            values = paired_ratios(results[key], a, b)
            ratios[key, a, b] = statistics.median(values)
            cells.append(f"{ratios[key, a, b]:.3f}x [{min(values):.2f}-{max(values):.2f}]")
        print("| " + " | ".join(cells) + " |")

    print("\nTargets (median ratios):")
    checks = [
        (f"plain backbone / Marian, {key} >= 1.0", ratios[key, "plain", "marian"] >= 1.0)
        for key in ("greedy", "beam", "train")
    ]
    checks += [
        (f"{name} / plain, {key} >= 0.99", ratios[key, name, "plain"] >= 0.99)
        for name in ("gtrans_td2", "gtrans_td1")
        for key in ("greedy", "beam")
    ]
    checks.append(
        ("gtrans_td1 (6 groups) / plain, training peak memory <= 1.25", ratios["memory", "gtrans_td1", "plain"] <= 1.25)
    )
    for label, met in checks:
        print(f"- {label}: {'met' if met else 'NOT met'}")


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Multi30k directory (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--gen-batch-size", type=int, default=32)
    parser.add_argument("--gen-batches", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--num-beams", type=int, default=4)
    parser.add_argument("--train-batch-size", type=int, default=64)
    parser.add_argument("--train-steps", type=int, default=2, help="training batches per timing measurement")
    parser.add_argument("--memory-steps", type=int, default=3, help="measured training steps per memory worker")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="~1 minute smoke run (fewer repeats and tokens)")
    parser.add_argument("--memory-worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-model", choices=MODEL_NAMES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.max_new_tokens, args.train_steps, args.memory_steps = 1, 8, 1, 1
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.memory_worker:
        memory_worker(args)
        return
    command = "python " + " ".join(shlex.quote(a) for a in [os.path.relpath(__file__, REPO_ROOT), *sys.argv[1:]])
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    loadavg_start, loadavg_start_1min = loadavg(), os.getloadavg()[0]

    start = time.perf_counter()
    tokenizer = train_tokenizer(args.data, args.vocab_size)
    tokenizer_s = time.perf_counter() - start
    generation_batches, all_training_batches = build_batches(
        args, tokenizer, max(args.train_steps, args.memory_steps + 1)
    )
    training_batches = all_training_batches[: args.train_steps]
    memory_batches = all_training_batches[: args.memory_steps + 1]  # + the warm-up step

    marian = build_marian(len(tokenizer), args.seed)
    if tokenizer.pad_token_id != marian.config.pad_token_id:
        raise ValueError(f"tokenizer pad id {tokenizer.pad_token_id} != model pad id {marian.config.pad_token_id}")
    eval_models = build_models(marian, MODEL_NAMES)
    for model in eval_models.values():
        model.eval()
    outputs_equal = {
        key: assert_same_outputs(eval_models, generation_batches, beams, args.max_new_tokens)
        for key, beams in (("greedy", 1), ("beam", args.num_beams))
    }
    results = time_models(args, eval_models, generation_batches, training_batches)
    results["memory"] = measure_peak_memory(args, MODEL_NAMES, marian, memory_batches)

    preset = marian.config
    setup = dict(
        loadavg_start=loadavg_start,
        loadavg_start_1min=loadavg_start_1min,
        git=git_revision(),
        d_model=preset.d_model,
        layers=f"{preset.encoder_layers}+{preset.decoder_layers}",
        heads=preset.encoder_attention_heads,
        ffn=preset.encoder_ffn_dim,
        vocab=len(tokenizer),
        tokenizer_s=tokenizer_s,
        params=sum(p.numel() for p in marian.parameters()),
        attn=f"Marian {marian.config._attn_implementation}, backbone "
        f"{eval_models['plain'].config._attn_implementation}",
        train_tokens=sum(int(b["labels"].ne(-100).sum()) for b in training_batches),
        train_pad=sum(int(b["labels"].eq(-100).sum()) for b in training_batches)
        / sum(b["labels"].numel() for b in training_batches),
    )
    print_report(args, command, setup, results, outputs_equal)
    print(f"\n(total wall time {time.perf_counter() - start:.0f}s)")


if __name__ == "__main__":
    main()
