"""Speed and memory of the hf_layerfusion backbone on real Multi30k sentences (CPU).

Compares, in one run, with the same dimensions (`from_preset("multi30k")`; families may change the wiring):

A. `MarianMTModel` vs the plain backbone (`from_marian(marian, model_type="plain_transformer")`, same weights):
   greedy and beam-4 generation (sentences/s; the outputs must be token-for-token identical, asserted) and
   training (non-pad target tokens/s of forward + backward + AdamW step).
B. every fusion setting in `MODELS` (GTrans with 3 and 6 decoder groups and the settings of every other family the
   package has) vs the plain backbone: parameters, the same speed metrics and the peak memory of a training step,
   checked against each setting's target (the paper's relative cost or the project's goal).

Timed measurements alternate between the models (the order flips every repeat); the table gives medians and the
ratios are medians of per-repeat ratios, so they hold up under other load on shared cores. OpenMP threads wait
passively (`OMP_WAIT_POLICY=PASSIVE` unless set): spin-waiting threads on oversubscribed cores are ~30x slower.
Peak memory is measured in a fresh subprocess per model: see `memory_worker`.

    python -m study.bench_backbone            # full run (~8 min with --repeats 3 on 2 cores, all 16 models)
    python -m study.bench_backbone --quick    # smoke run: 146 s (75 s of CPU) on 2 busy cores, see --quick
    python -m study.bench_backbone --models gtrans_td2 gtrans_td1   # a subset (marian and plain always run)
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

# Set before torch loads OpenMP. With libgomp's default spin-waiting, 2 threads on 2 cores shared with other
# processes run ~30x slower (measured: greedy batch 10.6 s vs 0.38 s passive); passive waiting keeps the numbers
# meaningful on a shared machine. Override from the environment, e.g. OMP_WAIT_POLICY=ACTIVE.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import torch  # noqa: E402
import transformers  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402
from transformers import AutoModelForSeq2SeqLM, MarianConfig, MarianMTModel  # noqa: E402

import hf_layerfusion  # noqa: E402
from hf_layerfusion import PlainTransformerConfig, from_marian  # noqa: E402
from hf_layerfusion.training.tokenization import train_joint_tokenizer  # noqa: E402
from study.common import (  # noqa: E402
    DEFAULT_DATA,
    REPO_ROOT,
    module_command,
    read_lines,
    reproduction_command,
    study_environment,
)
from study.multi30k_ledger import cpu_model  # noqa: E402

# a target's verdict (met / NOT met) needs at least this many samples of its ratio: from one or two noisy samples (a
# --quick run) the verdict flips from run to run
MIN_SAMPLES_FOR_VERDICT = 3


@dataclass(frozen=True)
class ModelSpec:
    title: str
    model_type: str | None  # None: transformers' MarianMTModel
    overrides: dict = field(default_factory=dict)
    preset: str = "multi30k"
    # the paper's relative cost (or the goal) checked against the median ratio to the plain backbone
    targets: tuple = ()


# Every model is built at the Multi30k size (d_model 256, 4 heads, FFN 1024, 6+6 layers unless the family changes
# the wiring). Marian and the plain backbone share their weights (from_marian) and must generate the same tokens;
# the other models are random-init from the same seed (speed and memory do not depend on the weight values,
# and generation always runs exactly --max-new-tokens steps).
MODELS = {
    "marian": ModelSpec("MarianMTModel", None),
    "plain": ModelSpec(
        "plain backbone",
        "plain_transformer",
        targets=(("greedy", ">=", 1.0), ("beam", ">=", 1.0), ("train", ">=", 1.0)),
    ),
    "gtrans_td2": ModelSpec(
        "GTrans T_e=3,T_d=2 (3 groups)",
        "gtrans",
        dict(encoder_group_size=3, decoder_group_size=2),
        targets=(("greedy", ">=", 0.99), ("beam", ">=", 0.99)),
    ),
    "gtrans_td1": ModelSpec(
        "GTrans T_e=3,T_d=1 (6 groups)",
        "gtrans",
        dict(encoder_group_size=3, decoder_group_size=1),
        targets=(("greedy", ">=", 0.99), ("beam", ">=", 0.99), ("memory", "<=", 1.25)),
    ),
}
# Dou et al. 2018 (Table 1, decode speed relative to the Transformer): aggregation costs 1-6 %, multi-layer
# attention 21 %; both stacks aggregate, as in the paper's main rows.
_DECODE_COST_AGGREGATION = (("greedy", ">=", 0.94), ("beam", ">=", 0.94))
MODELS.update(
    {
        f"dr_{strategy}": ModelSpec(
            f"Deep repr. {strategy} (enc+dec)",
            "deep_representations",
            dict(encoder_aggregation=strategy, decoder_aggregation=strategy),
            targets=_DECODE_COST_AGGREGATION,
        )
        for strategy in ("dense", "linear", "iterative", "hierarchical")
    }
)
MODELS["dr_mla_k2"] = ModelSpec(
    "Deep repr. multi-layer attention k=2",
    "deep_representations",
    dict(encoder_aggregation="multi_layer_attention", decoder_aggregation="multi_layer_attention",
         multi_layer_attention_k=2),
    targets=(("greedy", ">=", 0.79), ("beam", ">=", 0.79)),
)
MODELS.update(
    {
        # RTAL: tree over the top 4 of 6 layers in both stacks (the paper's setting)
        "rtal_concat": ModelSpec(
            "RTAL concat+FFN (enc+dec)", "rtal", dict(aggregation_function="concat_ffn"), targets=_DECODE_COST_AGGREGATION
        ),
        "rtal_ewp": ModelSpec(
            "RTAL product+FFN (enc+dec)", "rtal", dict(aggregation_function="ewp_ffn"), targets=_DECODE_COST_AGGREGATION
        ),
        # layer-wise coordination: 14 shared layers have the plain 6+6 model's parameter count (paper Sec. 4.2,
        # Table 3); 6 shared layers are the same depth as the plain model
        "lc_14": ModelSpec(
            "Layer-wise coord. 14 shared layers",
            "layerwise_coordination",
            dict(encoder_layers=14, decoder_layers=14),
            targets=(("params", "<=", 1.05),),
        ),
        "lc_6": ModelSpec("Layer-wise coord. 6 shared layers", "layerwise_coordination", dict()),
        # Re-Transformer (Liu & Chen 2021): s-sf-s-sf-s-sf encoder; the paper reports 0.68x / 0.82x inference time
        # for 2- / 4-layer decoders; the project's goal for the 2-layer decoder is >= 1.4x the plain model's speed
        "re_transformer_2": ModelSpec(
            "Re-Transformer-2 (s-sf-s-sf-s-sf, 2 dec)",
            "re_transformer",
            dict(encoder_layout="s-sf-s-sf-s-sf", decoder_layers=2),
            targets=(("greedy", ">=", 1.4),),
        ),
        "re_transformer_4": ModelSpec(
            "Re-Transformer-4 (s-sf-s-sf-s-sf, 4 dec)",
            "re_transformer",
            dict(encoder_layout="s-sf-s-sf-s-sf", decoder_layers=4),
            targets=(("greedy", ">=", 1.0 / 0.82),),
        ),
    }
)


# a registered family without a setting above is measured in its default configuration (no target), so that a new
# family is benchmarked from the moment it registers
MODELS.update(
    {
        family: ModelSpec(f"{family} (default config)", family)
        for family in hf_layerfusion.FAMILIES
        if family not in {spec.model_type for spec in MODELS.values()}
    }
)


def available_models() -> list[str]:
    return [name for name, spec in MODELS.items() if spec.model_type is None or spec.model_type in hf_layerfusion.FAMILIES]


# ------------------------------------------------------------------------------------------------ data
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


def build_model(name: str, marian: MarianMTModel, seed: int) -> torch.nn.Module:
    spec = MODELS[name]
    if spec.model_type is None:
        return marian
    if name == "plain":
        return from_marian(marian, model_type="plain_transformer")
    config_class = hf_layerfusion.FAMILIES[spec.model_type][0]
    config = config_class.from_preset(spec.preset, vocab_size=marian.config.vocab_size, **spec.overrides)
    torch.manual_seed(seed)
    return AutoModelForSeq2SeqLM.from_config(config)


def build_models(marian: MarianMTModel, names, seed: int) -> dict[str, torch.nn.Module]:
    return {name: build_model(name, marian, seed) for name in names}


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


def count_generation_flops(model, batches, max_new_tokens: int) -> int:
    """Floating-point operations of the greedy generation of all batches, counted by torch's `FlopCounterMode`
    (matmuls and attention; element-wise ops are not counted). The same work as one timed greedy measurement."""
    with FlopCounterMode(display=False) as counter:
        for batch in batches:
            generate(model, batch, 1, max_new_tokens)
    return counter.get_total_flops()


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
    """Runs in a fresh subprocess: peak RSS increase of training steps of each `--worker-model`, one model after the
    other, printed as JSON `{"peak_increase_kib": {model: [KiB per step]}}`.

    After model, optimizer and batches are set up, one warm-up step allocates the AdamW state. Then, for each
    measured step, the kernel's peak-RSS counter is reset (`echo 5 > /proc/self/clear_refs`, Linux >= 4.0) and the
    step's cost is VmHWM (peak RSS during the step) minus VmRSS before it: activations, logits, gradients and
    temporaries, nothing allocated before. The parent sets MALLOC_MMAP_THRESHOLD_ so every tensor above 64 KiB is
    mmap-ed and returned to the kernel when freed, making RSS follow live memory instead of malloc's free lists
    (so a model measured after others is measured as in a process of its own: within 1 MiB, measured on all models).
    """
    torch.set_num_threads(args.threads)
    work = Path(args.memory_worker)
    marian = MarianMTModel.from_pretrained(work / "marian")
    batches = torch.load(work / "train_batches.pt")
    peaks = {}
    for name in args.worker_model:
        model = build_model(name, marian, args.seed)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        train_step(model, optimizer, batches[0])
        peaks[name] = []
        for batch in batches[1:]:
            gc.collect()
            Path("/proc/self/clear_refs").write_text("5")
            before = rss_kib("VmRSS")
            train_step(model, optimizer, batch)
            peaks[name].append(rss_kib("VmHWM") - before)
        del model, optimizer
    print(json.dumps({"peak_increase_kib": peaks}))


def available_cpus() -> int:
    """CPUs this process may run on (its affinity mask, which containers and `taskset` narrow)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def memory_workers_at_once(threads: int) -> int:
    """How many memory subprocesses run side by side: as many as the CPUs hold at `threads` threads each. More only
    queue for the cores (all at once: `--quick` took 341-374 s at load average 20) and hold ~1 GiB each."""
    return max(1, available_cpus() // threads)


def measure_peak_memory(args, names, marian, training_batches) -> dict[str, list[float]]:
    """Peak-RSS increase (MiB) of each measured training step, in fresh subprocesses of
    `--memory-models-per-process` models each (1, the default: every model alone).

    The subprocesses run after the timings, `memory_workers_at_once` at a time: a process's own peak RSS does not
    depend on the others.
    """
    with tempfile.TemporaryDirectory() as work:
        marian.save_pretrained(Path(work) / "marian")
        torch.save(training_batches, Path(work) / "train_batches.pt")
        env = study_environment({**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"})

        def run_worker(group: list[str]) -> dict[str, list[float]]:
            command = [*module_command(__spec__.name), "--threads", str(args.threads), "--seed", str(args.seed)]
            command += ["--memory-worker", work, "--worker-model", *group]
            result = subprocess.run(command, env=env, capture_output=True, text=True)
            if result.returncode:
                raise RuntimeError(f"memory worker for {group} failed:\n{result.stderr[-3000:]}")
            report = json.loads(result.stdout.strip().splitlines()[-1])
            return {name: [kib / 1024 for kib in steps] for name, steps in report["peak_increase_kib"].items()}

        size = args.memory_models_per_process
        groups = [names[start : start + size] for start in range(0, len(names), size)]
        with ThreadPoolExecutor(max_workers=memory_workers_at_once(args.threads)) as pool:
            return {name: peaks for group in pool.map(run_worker, groups) for name, peaks in group.items()}


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
def loadavg() -> str:
    return "(" + ", ".join(f"{value:.2f}" for value in os.getloadavg()) + ")"


# what the benchmarks themselves write into the repository: results not yet committed there do not make the code
# that measures "uncommitted" (a run right after another would otherwise name no commit)
RESULTS_PATHSPEC = ":(exclude)study/results"


def git_revision() -> str:
    """The short commit of the checkout, with "+uncommitted changes" where a file differs from it or an untracked
    file lies outside `study/results` (results of earlier runs waiting to be committed do not count)."""
    def git(*arguments):
        result = subprocess.run(["git", *arguments], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
        return result.stdout.strip()

    revision = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--", ".", RESULTS_PATHSPEC)
    return revision + ("+uncommitted changes" if changed else "")


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
    print(
        f"- load average (1, 5, 15 min) at start: {setup['loadavg_start']}, at end: {loadavg()} (the end includes "
        "this run's own processes)"
    )
    # only the load before this run started is other processes'
    if setup["loadavg_start_1min"] + args.threads > available_cpus():
        print(
            f"- WARNING: other processes kept {setup['loadavg_start_1min']:.1f} CPUs busy when this run started "
            f"({args.threads} threads, {available_cpus()} CPUs): they compete for the cores, absolute numbers are "
            "depressed and noisy; the side-by-side ratios are the more trustworthy figures"
        )
    print(
        f"- model: Multi30k preset (d_model {setup['d_model']}, {setup['layers']} layers, {setup['heads']} heads, "
        f"FFN {setup['ffn']}), vocab {setup['vocab']} (joint BPE, `train_joint_tokenizer` on train.en+train.de, "
        f"{setup['tokenizer_s']:.1f}s), random init (seed {args.seed}; Marian and the plain backbone share weights), "
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
    if args.repeats < MIN_SAMPLES_FOR_VERDICT:
        print(
            f"- UNRELIABLE: {args.repeats} repeat(s) per model (a smoke run such as --quick): the ratios below rest "
            f"on {args.repeats} noisy sample(s), and no target is judged (a verdict needs --repeats "
            f"{MIN_SAMPLES_FOR_VERDICT} or more; memory: --memory-steps {MIN_SAMPLES_FOR_VERDICT} or more)"
        )
    print(
        f"- peak memory: {memory_processes(args.memory_models_per_process)}; after a warm-up step (allocates the "
        "AdamW state), for each "
        f"of {args.memory_steps} training step(s): peak RSS during the step (VmHWM, reset by writing 5 to "
        "/proc/self/clear_refs) minus RSS just before it, with MALLOC_MMAP_THRESHOLD_=65536 so freed tensors leave "
        "RSS. Counts activations, logits, gradients and temporaries, not weights or optimizer state; median over "
        "the steps, ratios paired by batch"
    )
    print(
        f"- Marian vs plain backbone outputs token-for-token identical: greedy {outputs_equal['greedy']}, "
        f"beam-{args.num_beams} {outputs_equal['beam']} (asserted)\n"
    )

    metrics = [
        ("greedy", "greedy sent/s", "{:.1f}"),
        ("beam", f"beam-{args.num_beams} sent/s", "{:.1f}"),
        ("train", "train tok/s", "{:.0f}"),
        ("memory", "train peak MiB", "{:.1f}"),
    ]
    header = ["model", "parameters", "greedy GFLOP"] + [title for _, title, _ in metrics] + ["vs", "params ratio"]
    header += ["greedy ratio expected from FLOPs"] + [f"{title} ratio" for _, title, _ in metrics]
    print(
        "Rows are models; each ratio is this model / its reference (`vs`), median of per-repeat ratios [min-max]. "
        "`greedy GFLOP`: matmul and attention operations of one greedy measurement, counted by torch's "
        "FlopCounterMode; `greedy ratio expected from FLOPs` = reference GFLOP / model GFLOP, the greedy speed ratio "
        "if decoding were bound by those operations alone.\n"
    )
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    ratios = {}
    for name in names:
        reference = reference_of(name)
        cells = [MODELS[name].title, f"{setup['params'][name]:,}", f"{setup['greedy_flops'][name] / 1e9:.2f}"]
        cells += [fmt.format(statistics.median(results[key][name])) for key, _, fmt in metrics]
        if reference is None or reference not in names:
            cells += ["–"] * (3 + len(metrics))
        else:
            ratios["params", name] = setup["params"][name] / setup["params"][reference]
            cells += [MODELS[reference].title, f"{ratios['params', name]:.3f}x"]
            cells.append(f"{setup['greedy_flops'][reference] / setup['greedy_flops'][name]:.3f}x")
            for key, _, _ in metrics:
                values = paired_ratios(results[key], name, reference)
                ratios[key, name] = statistics.median(values)
                cells.append(f"{ratios[key, name]:.3f}x [{min(values):.2f}-{max(values):.2f}]")
        print("| " + " | ".join(cells) + " |")

    print("\nTargets (median ratio to the reference):")
    samples = {"greedy": args.repeats, "beam": args.repeats, "train": args.repeats, "memory": args.memory_steps}
    for name in names:
        for key, op, bound in MODELS[name].targets:
            if (key, name) not in ratios:
                continue
            # parameter counts are exact: one sample suffices
            verdict = target_verdict(ratios[key, name], op, bound, samples.get(key, MIN_SAMPLES_FOR_VERDICT))
            print(
                f"- {MODELS[name].title} / {MODELS[reference_of(name)].title}, {key} {op} {bound}: "
                f"{ratios[key, name]:.3f}x, {verdict}"
            )


def target_verdict(ratio: float, op: str, bound: float, samples: int) -> str:
    """`met` / `NOT met`, or `not judged` when the ratio rests on fewer than `MIN_SAMPLES_FOR_VERDICT` samples."""
    if samples < MIN_SAMPLES_FOR_VERDICT:
        return f"not judged ({samples} sample(s): unreliable)"
    return "met" if (ratio >= bound if op == ">=" else ratio <= bound) else "NOT met"


def memory_processes(models_per_process: int) -> str:
    if models_per_process == 1:
        return "each model in a fresh subprocess"
    return f"fresh subprocesses of up to {models_per_process} models each, one model after the other"


def reference_of(name: str) -> str | None:
    """Ratios compare the plain backbone with Marian and every fusion model with the plain backbone."""
    return {"marian": None, "plain": "marian"}.get(name, "plain")


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
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: one repeat, 8 new tokens, batches of 8 / 16 sentences, one memory step, the memory of all "
        "models in as few processes as run at once; no target is judged. Measured: 146 s wall, 75 s of CPU time, "
        "on 2 CPU cores that other processes kept busy (load average 4.8)",
    )
    parser.add_argument("--memory-worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker-model", nargs="+", choices=list(MODELS), help=argparse.SUPPRESS)
    parser.add_argument(
        "--memory-models-per-process",
        type=int,
        default=1,
        help="models whose peak memory one fresh subprocess measures, one after the other (default: %(default)s, "
        "every model alone; --quick: all models spread over the processes that run at once, which saves a ~5 s process "
        "start per model)",
    )
    parser.add_argument(
        "--models",
        nargs="+",
        choices=list(MODELS),
        help="models to compare (default: every model whose family the package has); marian and plain are always run",
    )
    args = parser.parse_args(argv)
    if args.quick:
        # one sample of everything, on small batches: checks that every model runs, measures nothing reliably
        args.repeats, args.max_new_tokens, args.train_steps, args.memory_steps = 1, 8, 1, 1
        args.gen_batch_size, args.train_batch_size = 8, 16
        # all models in as few processes as run at once: a process start costs about as much as a model's steps
        args.memory_models_per_process = -(-len(MODELS) // memory_workers_at_once(args.threads))
    return args


def main(argv=None):
    args = parse_args(argv)
    if args.memory_worker:
        memory_worker(args)
        return
    command = reproduction_command(__spec__.name, sys.argv[1:])
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
    names = list(dict.fromkeys(["marian", "plain", *(args.models or available_models())]))
    eval_models = build_models(marian, names, args.seed)
    for model in eval_models.values():
        model.eval()
    outputs_equal = {
        key: assert_same_outputs(eval_models, generation_batches, beams, args.max_new_tokens)
        for key, beams in (("greedy", 1), ("beam", args.num_beams))
    }
    results = time_models(args, eval_models, generation_batches, training_batches)
    results["memory"] = measure_peak_memory(args, names, marian, memory_batches)

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
        params={name: sum(p.numel() for p in model.parameters()) for name, model in eval_models.items()},
        greedy_flops={
            name: count_generation_flops(model, generation_batches, args.max_new_tokens)
            for name, model in eval_models.items()
        },
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
