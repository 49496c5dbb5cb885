"""The Multi30k study queue: runs, one at a time (or `--parallel N` at a time), the next runs the results ledger lacks.

Start it first whenever you work on the project, and commit the new ledger files before you stop:

    python -m study &          # niced, one thread, OMP_WAIT_POLICY=PASSIVE; Ctrl-C / kill stops it and its runs
    python -m study --list     # the queue, in priority order, with what is done
    python -m study --arms re_transformer_2 re_transformer_4   # only these arms' pending runs
    python -m study --hours 2.8 &   # only the runs expected to finish in the 2.8 hours this machine stays
    python -m study --hours 2.8 --fill &   # those first, then the longer ones: runs/ outlives the stop here
    python -m study --parallel 8   # on a GPU: 8 runs share it
    python -m study.report   # the ledger's tables in study/README.md, the summary in README.md, docs/
    git add study/results study/README.md README.md docs && git commit -m "ledger: ..."

Each run is `bench_multi30k.py --run_only` of one arm and seed (priority 2's depth probes: `probe_post_norm_depth.py`;
priority 5's: `bench_multilingual.py`), steps-matched, in a subprocess that runs the code of the commit at HEAD when the
run starts, exported into `runs/study/code/<commit>` (so that editing the working tree cannot change a run midway, and
the ledger's commit is the code that ran; uncommitted changes are not part of a run). Finished runs stay in
`runs/study/runs/` whatever commit made them (fine-tuning arms start from them). Every en->de run uses the committed
tokenizer `study/results/multi30k/tokenizer`, the one every ledger run used (it came from `tokenizers`' unigram
trainer, which was not deterministic; a retrained one would differ and make new runs incomparable). When it finishes, `bench_multi30k.py` writes
`study/results/multi30k/<arm>/seed_<s>.json`. A run interrupted (killed, machine gone, a session's stop) resumes
from its last checkpoint (every 500 steps; every epoch trained to convergence, priority 9) with the code of the commit
that started it, whatever was committed since
(delete its run dir to start it over with HEAD); an unfinished run dir without a checkpoint starts over with HEAD.
Most runs fit ~90 minutes on one core; the fine-tuning arms' 2,000 further steps took 52-68 minutes on an Intel Xeon
core and over 2 hours on an AMD EPYC one beside other work (the ledger's `train_minutes`), more than a session may
leave them: that resume carries them across sessions only where `runs/` outlives the session. A new machine starts
without it, and there `--hours` (the time the session leaves) starts only the runs expected to finish in time (a
resumed run: its steps after the checkpoint; a run trained to convergence: as many epochs as the ledger's longest such
run) and leaves the others for a longer stay or a GPU; on a machine that keeps `runs/` from one session to the next,
`--hours H --fill` starts those others too, once nothing that fits waits for a slot, and they land in pieces. On a
machine with a GPU the same command runs the queue there (`--threads` then only sets the CPU threads), best with
`--parallel` (one of these runs keeps a big GPU mostly idle); the ledger records the device and how many runs
shared it. A copy of the repository without its .git (sent to a lent machine, say) runs its own tree as the code
once its commit is written into its `SNAPSHOT_COMMIT` file (`git rev-parse HEAD > SNAPSHOT_COMMIT` on a clean
checkout).

Priority order (from the quality-ledger issue; steps-matched, selection on val, report on test):
1. `plain_transformer` and `gtrans` (T_e = 3, T_d = 2), 2,000 steps, seeds 1-3.
2. Deep post-norm, GTrans Table VIII's claim (24 + 18 post-norm layers "failed to train" without fusion): first the
   depth probes of `probe_post_norm_depth.py` (the plain post-norm model at 6 + 6, 12 + 12, 18 + 12 and 24 + 18
   layers, 600 steps: does it train, and how long would 1,000 steps take?), then one pair, plain vs GTrans, one
   seed, 1,000 steps (warm-up 400): at 24 + 18 if its training fits `MAX_DEEP_TRAIN_MINUTES`, else at the shallowest
   probed depth at which the plain model fails (if that fits), else, when the plain model trains at every probed
   depth, at the deepest one that fits (`deep_post_norm_pair`).
3. Each other family in its paper's setting (seed 1 of each first, then seeds 2-3, layer-wise coordination's and
   Re-Transformer's first, the arms the issue's done-when names): layer-wise coordination with 14 shared layers
   (parameter-matched, paper Sec. 4.2), Re-Transformer-2 and -4 and
   deep representations' hierarchical aggregation from scratch against the plain 6 + 6 model of priority 1; RTAL
   as its paper ran it (EWP + FFN, children residual, pre-norm) against the pre-norm plain model; deep
   representations' recipe (the plain run fine-tuned with hierarchical aggregation and lambda = 1 for 2,000 more
   steps) against the plain run continued for as many steps.
4. fairseq / THUMT embedding initialisation N(0, d^-1/2) for the plain model and GTrans, GTrans' paper-silent
   choices of docs/gtrans_study.md (2 seeds each, with their own baselines), then the 12 + 6 shape.
5. Many-to-many, the stand-in for GTrans' OPUS-100 setting (Table V): en<->de, en<->fr, en<->cs of Multi30k, target
   tags, temperature sampling, plain vs GTrans, 2,000 steps, seeds 1-3 (`bench_multilingual.py` through
   `examples/run_multilingual.py`; its ledger is `study/results/multi30k_m2m/<arm>/seed_<s>.json`, beside the
   en->de one; BLEU per direction and the win ratio).
6. Issue 38, where fusion pays, queued by value ahead of what priorities 4-5 left: plain vs GTrans post-norm at
   24 + 18 layers for 2,000 steps (warm-up 400, the `_2000steps` arms: the 1,000-step pair could not tell a plain
   model that fails from a slower one), seeds 1-3; fusion added to a trained model for every family whose layout
   holds a plain checkpoint (`gtrans_finetuned`, `rtal_finetuned`, `layerwise_coordination_finetuned`, against
   `plain_transformer_continued`; layer-wise coordination's own layout, shared layers and mixed attention, cannot
   hold one), seed 1 of each; seeds 4-5 of deep representations' recipe and its baseline; priority 5's many-to-many
   pair; then the fine-tuning arms' seeds 2-3, the 12 + 12 pair (seeds 1-3), priority 4's 12 + 6 shape, and
   18 + 12 with one seed last. The depths are the issue's, not the depth probes' choice: the report reads whether
   the plain model trains from these runs, not from the probes' 600-step rule.
7. Reruns from one start: a fine-tuning arm's seed and its baseline's (`plain_transformer_continued`) must
   fine-tune the same run of their starting arm, but a machine without runs/ retrains that run, and two trainings of
   one seed differ (by up to a BLEU). Where no run of a seed's arm (its entry, its reruns) started where a run of its
   baseline did, the baseline's seed runs again from each start of the arm's runs, and the arm's seed from each
   start of the baseline's (`Rerun`), each only on a machine that holds that start, before the fine-tuning arms'
   seeds 2-3 (they repair comparisons the ledger holds); once one has run, the seed is paired and the others leave
   the queue. bench_multi30k.py writes a rerun beside its entry (`<arm>/seed_<s>_from_<start>.json`) and the report
   compares the seed through it.

8. Issue 38 item 3's verdicts on val for training from scratch: seeds 4-5 of each family's from-scratch arm
   (`FROM_SCRATCH_ARMS`: GTrans, layer-wise coordination, Re-Transformer-2 and -4, deep representations, and RTAL
   with its pre-norm baseline; `plain_transformer`'s seeds 4-5 are item 3's already), seed 4 of every arm before
   seed 5. Their seeds 1-3 were written before entries kept val translations, and their models are gone, so the
   report could test them on test only ("untested on val"); these seeds give each family's from-scratch verdict its
   val side.
9. Issue 76, do the verdicts hold trained to convergence, and against deep baselines that train? First the runs
   trained to convergence (`ConvergedRun`, bench_multi30k.py's converged budget: val BLEU at the end of every epoch,
   stopped once it has not improved for 3 evaluations or after 30 epochs, ~13,600 steps; the val-best checkpoint is
   the run's model, the average of its last 5 checkpoints is scored beside it; the study's learning rate 1e-3 and
   warm-up 1,000, so that only the budget differs from the 2,000-step runs): `plain_transformer_converged` and
   `gtrans_converged` (T_e = 3, T_d = 2) with seeds 1-3, then seed 1 of `layerwise_coordination_14_converged`,
   `rtal_paper_converged` after its baseline `plain_transformer_prenorm_converged`, `re_transformer_2_converged` and
   `deep_representations_paper_converged` (the converged plain run fine-tuned until early stopping, against that run
   trained on the same way, `plain_transformer_continued_converged`), then their seeds 2-3. Then the deep baselines
   that should train where post-norm with the study's warm-up fails: `plain_transformer_prenorm_12x12_2000steps`
   (pre-norm, the post-norm depth arms' 2,000 steps and warm-up 400) and `plain_transformer_12x12_warmup4000`
   (post-norm with the papers' 4,000-step warm-up, trained to convergence: 2,000 steps would end inside the warm-up;
   bench_multi30k.py says why) beside `gtrans_12x12_warmup4000`, seeds 1-3, with seed 1 of
   `plain_transformer_prenorm_24x18_2000steps` among them and its seeds 2-3 last. `--hours` expects a run trained to
   convergence to reach its cap: a short session does not start one it cannot finish. The fine-tuning arms trained
   to convergence have no priority 7 reruns: run them and their baseline where their starting run was trained
   (`--parallel` on one machine), or the report marks the seed as started apart.

A result file that exists but cannot be read as one (cut short, a bad merge, a key missing, a value no run produces:
`multi30k_ledger.value_problem`) is `BAD` in `--list`, named with what is wrong; its run counts as not done, and the
rerun replaces the file. A `--ledger_dir` or `--probe_dir` that does not exist is refused.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from study import multi30k_ledger as ledger  # no torch at import
from study import probe_post_norm_depth as depth_probes  # no torch at import
from study.common import DEFAULT_DATA, REPO_ROOT
from study.multi30k_ledger import m2m_ledger_dir

LEDGER_DIR = ledger.DEFAULT_LEDGER
PROBE_DIR = depth_probes.RESULTS_DIR
WORK_DIR = REPO_ROOT / "runs" / "study"
SNAPSHOT_COMMIT_FILE = ledger.SNAPSHOT_COMMIT_FILE
STANDARD_BUDGET = dict(max_steps=2000, warmup_steps=1000)  # the budget all 6 + 6 comparisons share
# priority 2: a shorter warm-up, so that the learning rate peaks inside the budget (and inside the probes' 600 steps)
DEEP_BUDGET = dict(max_steps=1000, warmup_steps=400)
DEEP_SHAPES = ((12, 12), (18, 12), (24, 18))  # probed post-norm depths; the paper's 24 + 18 last
# priority 6 (issue 38): the depth pairs for 2,000 steps, with priority 2's warm-up; their arms carry this suffix
# (bench_multi30k.LONG_DEPTH_SUFFIX) so that the 1,000-step pair keeps one budget per arm in the ledger
DEEP_LONG_BUDGET = dict(max_steps=2000, warmup_steps=DEEP_BUDGET["warmup_steps"])
LONG_DEPTH_SUFFIX = "_2000steps"
# priority 6's fusion added to a trained model, one arm per family whose layout holds a plain checkpoint
# (bench_multi30k.py: GTrans, RTAL post-norm, layer-wise coordination without sharing or mixed attention)
FINE_TUNING_ARMS = ("gtrans_finetuned", "rtal_finetuned", "layerwise_coordination_finetuned")
# training minutes a deep run may take at the probe's speed: with its evaluation (beam 4 over val and test, the
# GTrans decoder-group grid) it must fit ~90 minutes on one core
MAX_DEEP_TRAIN_MINUTES = 60
# the fine-tuning arms of the queue and the arm whose run of the same seed they start from (bench_multi30k.MODELS'
# `init_from`, not imported: it needs torch); bench_multi30k.py trains that run first when it is missing
STARTING_RUNS = {"plain_transformer_continued": "plain_transformer", "deep_representations_paper": "plain_transformer",
                 **{arm: "plain_transformer" for arm in FINE_TUNING_ARMS}}
# priority 9 (issue 76): the arms trained to convergence (bench_multi30k.CONVERGED_SUFFIX: the arm of the name without
# it, under the converged budget) and the deep baselines that should train
CONVERGED_SUFFIX = "_converged"
CONVERGED_BUDGET = dict(max_epochs=30, early_stopping_patience=3, warmup_steps=STANDARD_BUDGET["warmup_steps"])
CONVERGED_PAIR = ("plain_transformer_converged", "gtrans_converged")
# the other families trained to convergence, each after its baseline (deep representations' recipe: the converged
# plain run fine-tuned, against that run trained on the same way)
CONVERGED_FAMILIES = ("layerwise_coordination_14_converged", "plain_transformer_prenorm_converged",
                      "rtal_paper_converged", "re_transformer_2_converged", "plain_transformer_continued_converged",
                      "deep_representations_paper_converged")
STARTING_RUNS.update({arm: "plain_transformer_converged" for arm in ("plain_transformer_continued_converged",
                                                                     "deep_representations_paper_converged")})
PRE_NORM_DEEP_ARMS = ("plain_transformer_prenorm_12x12_2000steps", "plain_transformer_prenorm_24x18_2000steps")
WARMUP_4000_PAIR = ("plain_transformer_12x12_warmup4000", "gtrans_12x12_warmup4000")  # trained to convergence
WARMUP_4000_STEPS = 4000
# the steps of one epoch of Multi30k (29,000 training pairs in batches of 64, bench_multi30k.TRAINING_OPTIONS; the
# last batch is smaller): a converged run's cap of epochs in steps
STEPS_PER_EPOCH = math.ceil(29_000 / 64)
# priority 8 (issue 38 item 3): each family's from-scratch arm, and a baseline its seeds 4-5 need that item 3 does
# not queue (RTAL's pre-norm one), for verdicts on val beside test
FROM_SCRATCH_ARMS = ("gtrans", "layerwise_coordination_14", "re_transformer_2", "re_transformer_4",
                     "deep_representations_no_diversity", "plain_transformer_prenorm", "rtal_paper")
# what `--hours` expects of a run whose arm has no CPU run in the ledger yet: the bound for one run on one core
UNTIMED_RUN_MINUTES = 90


def module_command(snapshot: Path, module: str) -> list[str]:
    """The command that runs the study's module `module` with the code of `snapshot` (the run's process starts in
    the snapshot, with it first on PYTHONPATH): `python -m study.<module>`, or the script of that name under
    benchmarks/ in a snapshot of a commit from before the study was a package, so that a run started then resumes
    with its own code."""
    if (snapshot / "study" / "__init__.py").is_file():
        return [sys.executable, "-m", f"study.{module}"]
    return [sys.executable, str(snapshot / "benchmarks" / f"{module}.py")]


@dataclass(frozen=True)
class ArmRun:
    """What every training run of the queue has: an arm of a benchmark script, a seed and its budget."""

    arm: str
    seed: int
    max_steps: int = STANDARD_BUDGET["max_steps"]
    warmup_steps: int = STANDARD_BUDGET["warmup_steps"]

    @property
    def label(self) -> str:
        return f"`{self.arm}` seed {self.seed}"

    @property
    def budget(self) -> str:
        return f"{self.max_steps} steps (warm-up {self.warmup_steps})"


@dataclass(frozen=True)
class StudyRun(ArmRun):
    """One en->de run of the queue: an arm of bench_multi30k.py, a seed and the steps-matched budget."""

    def result_file(self, ledger_dir: Path = LEDGER_DIR, probe_dir: Path = PROBE_DIR) -> Path:
        return Path(ledger_dir) / self.arm / f"seed_{self.seed}.json"

    def result_problem(self, ledger_dir: Path = LEDGER_DIR, probe_dir: Path = PROBE_DIR) -> str | None:
        """Why its existing result file cannot be used (None: it can): `result_state`."""
        return ledger.entry_problem(self.result_file(ledger_dir, probe_dir))

    def run_dir(self) -> Path:
        """bench_multi30k.py's run dir: under one --output_dir per budget (it refuses other settings in a dir)."""
        return WORK_DIR / "runs" / f"steps_{self.max_steps}_warmup_{self.warmup_steps}" / self.arm / f"seed_{self.seed}"

    def checkpoint_dir(self) -> Path:
        """Where the run's `checkpoint-<step>` dirs are written."""
        return self.run_dir()

    def command(self, snapshot: Path, args) -> list[str]:
        return [
            *module_command(snapshot, "bench_multi30k"),
            "--models", self.arm, "--seeds", str(self.seed), "--run_only", *self.budget_options(),
            "--warmup_steps", str(self.warmup_steps),
            "--output_dir", str(self.run_dir().parents[1]), "--tokenizer_dir", str(args.ledger_dir / "tokenizer"),
            "--ledger_dir", str(args.ledger_dir), "--data_dir", str(args.data_dir),
        ]

    def budget_options(self) -> list[str]:
        return ["--max_steps_per_model", str(self.max_steps)]


@dataclass(frozen=True)
class ConvergedRun(StudyRun):
    """One run of priority 9 trained to convergence: an arm of bench_multi30k.py that evaluates val BLEU every epoch
    and stops once it has not improved for `early_stopping_patience` evaluations, or after `max_epochs` epochs.
    `max_steps` is that cap in steps; `--hours` expects it to train as many epochs as the longest converged run in the
    ledger did (`expected_epochs`)."""

    max_steps: int = CONVERGED_BUDGET["max_epochs"] * STEPS_PER_EPOCH
    warmup_steps: int = CONVERGED_BUDGET["warmup_steps"]
    max_epochs: int = CONVERGED_BUDGET["max_epochs"]
    early_stopping_patience: int = CONVERGED_BUDGET["early_stopping_patience"]

    def __post_init__(self):
        if self.max_steps != self.max_epochs * STEPS_PER_EPOCH:
            raise ValueError(f"{self.label}: max_steps is the cap of {self.max_epochs} epochs in steps, "
                             f"{self.max_epochs * STEPS_PER_EPOCH}, not {self.max_steps}")

    @property
    def budget(self) -> str:
        return (f"until val BLEU stalls {self.early_stopping_patience} epochs, at most {self.max_epochs} epochs "
                f"({self.max_steps} steps; warm-up {self.warmup_steps})")

    def run_dir(self) -> Path:
        return (WORK_DIR / "runs" / f"epochs_{self.max_epochs}_patience_{self.early_stopping_patience}_warmup_"
                f"{self.warmup_steps}" / self.arm / f"seed_{self.seed}")

    def budget_options(self) -> list[str]:
        return ["--max_epochs_per_model", str(self.max_epochs),
                "--early_stopping_patience", str(self.early_stopping_patience)]


@dataclass(frozen=True)
class Rerun(StudyRun):
    """A fine-tuning arm's seed (`arm`: a fine-tuning arm or its baseline) again, fine-tuning the starting run that
    the run it is compared with started from (`start`: `ledger.start_tag` of that run's `init_from`) where its entry
    started from another: the same command in the same run dir as the arm's `StudyRun`, on a machine whose starting
    run is that one (`runnable_here`); bench_multi30k.py writes the result beside the entry (`ledger.rerun_path`)."""

    start: str = ""
    # what the label says, not what the run is (the run is the same when another arm's seed joins the start)
    start_test_bleu: float = field(default=0.0, compare=False)
    for_runs: tuple[str, ...] = field(default=(), compare=False)  # the runs it is for (labels), which started there

    @property
    def label(self) -> str:
        return (f"`{self.arm}` seed {self.seed} again, from the start of {', '.join(self.for_runs)} "
                f"(test {self.start_test_bleu:.2f})")

    def result_file(self, ledger_dir: Path = LEDGER_DIR, probe_dir: Path = PROBE_DIR) -> Path:
        return ledger.rerun_path(ledger_dir, self.arm, self.seed, self.start)

    def runnable_here(self) -> bool:
        """Whether this machine's finished starting run of the seed is the one the arm's seed started from."""
        start_from = starting_run(self)
        if not finished_here(start_from):
            return False
        record = ledger.starting_run_record(start_from.run_dir(), start_from.arm, self.seed)
        return ledger.start_tag(record) == self.start


def reruns_from_one_start(ledger_dir: Path = LEDGER_DIR) -> list[Rerun]:
    """The reruns priority 7 asks for: for each fine-tuning arm's seed none of whose runs (entry, reruns) started
    where a run of its baseline's seed did (`ledger.starts_apart`), the baseline's seed from each start of the arm's
    runs and the arm's seed from each start of the baseline's; one rerun per arm, seed and start. Unreadable entries
    are left out (the queue reruns them first)."""
    def runs_of(arm, seed):
        """The seed's entry, then its readable reruns; [] without a readable entry."""
        found = []
        for path in [ledger.ledger_path(ledger_dir, arm, seed),
                     *sorted((Path(ledger_dir) / arm).glob(f"seed_{seed}_from_*.json"))]:
            try:
                found.append(ledger.read_entry(path, ("baseline", "init_from")))
            except ledger.UnreadableResult:
                if not found:
                    return []
        return found

    wanted: dict[tuple, tuple[float, list[str]]] = {}
    # the step budget's fine-tuning arms (those trained to convergence have no reruns: run the arm and its baseline
    # on the machine that trained their starting run, or the report marks the seed with the two starts)
    for arm in (arm for arm in STARTING_RUNS if not arm.endswith(CONVERGED_SUFFIX)):
        for path in sorted((Path(ledger_dir) / arm).glob("seed_*.json")):
            if not ledger.ENTRY_NAME.fullmatch(path.name):
                continue
            seed = int(path.stem.removeprefix("seed_"))
            arm_runs = runs_of(arm, seed)
            baseline = arm_runs[0]["baseline"] if arm_runs else None
            baseline_runs = [] if baseline is None else runs_of(baseline, seed)
            if not baseline_runs or any(not ledger.starts_apart(a, b) for a in arm_runs for b in baseline_runs):
                continue
            for rerun_arm, starts_from, other_arm in ((baseline, arm_runs, arm), (arm, baseline_runs, baseline)):
                for run in starts_from:
                    key = (rerun_arm, seed, ledger.start_tag(run["init_from"]))
                    test_bleu, labels = wanted.setdefault(key, (run["init_from"]["test_bleu"], []))
                    labels.append(f"`{other_arm}` seed {seed}")
    return [Rerun(rerun_arm, seed, **STANDARD_BUDGET, start=tag, start_test_bleu=test_bleu, for_runs=tuple(labels))
            for (rerun_arm, seed, tag), (test_bleu, labels) in sorted(wanted.items())]


@dataclass(frozen=True)
class DepthProbe:
    """One shape of priority 2's depth probes (`probe_post_norm_depth.py`: the plain post-norm model, seed 1)."""

    encoder_layers: int
    decoder_layers: int

    @property
    def label(self) -> str:
        return f"depth probe {self.encoder_layers} + {self.decoder_layers}"

    @property
    def budget(self) -> str:
        return f"600 steps (warm-up {DEEP_BUDGET['warmup_steps']})"

    def result_file(self, ledger_dir: Path = LEDGER_DIR, probe_dir: Path = PROBE_DIR) -> Path:
        return depth_probes.result_file(Path(probe_dir), "plain_transformer",
                                        (self.encoder_layers, self.decoder_layers), 1)

    def result_problem(self, ledger_dir: Path = LEDGER_DIR, probe_dir: Path = PROBE_DIR) -> str | None:
        return depth_probes.result_problem(self.result_file(ledger_dir, probe_dir))

    def run_dir(self) -> Path:
        return WORK_DIR / "post_norm_depth" / f"plain_transformer_{self.encoder_layers}x{self.decoder_layers}_seed_1"

    def checkpoint_dir(self) -> Path:
        return self.run_dir()

    def command(self, snapshot: Path, args) -> list[str]:
        return [
            *module_command(snapshot, "probe_post_norm_depth"),
            "--shapes", f"{self.encoder_layers}x{self.decoder_layers}", "--threads", str(args.threads),
            "--steps", "600", "--warmup_steps", str(DEEP_BUDGET["warmup_steps"]),
            "--output_dir", str(self.run_dir().parent), "--results_dir", str(args.probe_dir),
            "--tokenizer_dir", str(args.ledger_dir / "tokenizer"), "--data_dir", str(args.data_dir),
        ]


@dataclass(frozen=True)
class ManyToManyRun(ArmRun):
    """One run of priority 5: an arm of `bench_multilingual.py` (`plain_transformer_m2m` or `gtrans_m2m`) and a
    seed, with the steps-matched budget of the 6 + 6 comparisons."""

    @property
    def label(self) -> str:
        return f"{super().label} (many-to-many)"

    def result_file(self, ledger_dir: Path = LEDGER_DIR, probe_dir: Path = PROBE_DIR) -> Path:
        return m2m_ledger_dir(ledger_dir) / self.arm / f"seed_{self.seed}.json"

    def result_problem(self, ledger_dir: Path = LEDGER_DIR, probe_dir: Path = PROBE_DIR) -> str | None:
        return ledger.entry_problem(self.result_file(ledger_dir, probe_dir), ledger.MANY_TO_MANY_REQUIRED_KEYS)

    def run_dir(self) -> Path:
        """bench_multilingual.py's run dir (`<output_dir>/<arm>/seed_<s>`)."""
        return (WORK_DIR / "many_to_many" / f"steps_{self.max_steps}_warmup_{self.warmup_steps}" / self.arm
                / f"seed_{self.seed}")

    def checkpoint_dir(self) -> Path:
        """run_multilingual.py's output dir inside the run dir."""
        return self.run_dir() / "model"

    def command(self, snapshot: Path, args) -> list[str]:
        return [
            *module_command(snapshot, "bench_multilingual"),
            "--arm", self.arm, "--seed", str(self.seed),
            "--max_steps", str(self.max_steps), "--warmup_steps", str(self.warmup_steps),
            "--output_dir", str(self.run_dir().parents[1]), "--ledger_dir", str(m2m_ledger_dir(args.ledger_dir)),
            "--tokenizer_dir", str(m2m_ledger_dir(args.ledger_dir) / "tokenizer"), "--data_dir", str(args.data_dir),
        ]


def deep_post_norm_pair(probe_dir: Path = PROBE_DIR) -> tuple[tuple[int, int] | None, str]:
    """Priority 2's shape (encoder, decoder layers) from the depth probes, and why; (None, why) while probes are
    missing or when no probed shape both answers the question and fits (see the module docstring)."""
    results = depth_probes.read_results(probe_dir)
    missing = [shape for shape in (depth_probes.REFERENCE_SHAPE, *DEEP_SHAPES) if shape not in results]
    if missing:
        return None, "decided by the depth probes, which have not all run yet"

    def fits(shape):
        return depth_probes.training_minutes(results[shape], DEEP_BUDGET["max_steps"]) <= MAX_DEEP_TRAIN_MINUTES

    def name(shape):
        return f"{shape[0]} + {shape[1]}"

    reference = results[depth_probes.REFERENCE_SHAPE]
    paper = DEEP_SHAPES[-1]
    if fits(paper):
        return paper, f"{name(paper)} (the paper's shape) fits"
    failing = [shape for shape in DEEP_SHAPES if depth_probes.fails(results[shape], reference)]
    if failing:
        shallowest = min(failing, key=sum)
        if fits(shallowest):
            return shallowest, f"{name(paper)} does not fit; {name(shallowest)} is the shallowest failing depth"
        return None, (f"neither {name(paper)} nor the shallowest failing depth ({name(shallowest)}) fits "
                      f"{MAX_DEEP_TRAIN_MINUTES} training minutes on one core")
    fitting = [shape for shape in DEEP_SHAPES if fits(shape)]
    if not fitting:
        return None, f"no probed depth fits {MAX_DEEP_TRAIN_MINUTES} training minutes on one core"
    deepest = max(fitting, key=sum)
    return deepest, (f"the plain model trains at every probed depth; {name(deepest)} is the deepest that fits "
                     f"{MAX_DEEP_TRAIN_MINUTES} training minutes")


def study_queue(probe_dir: Path = PROBE_DIR, ledger_dir: Path = LEDGER_DIR) -> list[ArmRun | DepthProbe]:
    """Every run of the study, in the order they are run (priority 2's pair once the depth probes decided it,
    priority 7's reruns as the ledger in `ledger_dir` asks for them)."""
    standard = STANDARD_BUDGET
    queue = []
    for seed in (1, 2, 3):  # priority 1
        queue += [StudyRun("plain_transformer", seed, **standard), StudyRun("gtrans", seed, **standard)]
    queue += [DepthProbe(*shape) for shape in (depth_probes.REFERENCE_SHAPE, *DEEP_SHAPES)]  # priority 2
    shape, _ = deep_post_norm_pair(probe_dir)
    if shape is not None:
        queue += [StudyRun(f"{family}_{shape[0]}x{shape[1]}", 1, **DEEP_BUDGET)
                  for family in ("plain_transformer", "gtrans")]
    other_families = ("layerwise_coordination_14", "re_transformer_2", "re_transformer_4",
                      "deep_representations_no_diversity",
                      "plain_transformer_prenorm", "rtal_paper", "plain_transformer_continued",
                      "deep_representations_paper")
    queue += [StudyRun(arm, 1, **standard) for arm in other_families]  # priority 3: seed 1 of every family first,
    # then seeds 2-3 of the arms the done-when names (layer-wise coordination, Re-Transformer), then the rest
    done_when_arms = ("layerwise_coordination_14", "re_transformer_2", "re_transformer_4")
    for arms in (done_when_arms, [arm for arm in other_families if arm not in done_when_arms]):
        queue += [StudyRun(arm, seed, **standard) for seed in (2, 3) for arm in arms]
    study_arms = ("plain_transformer_embed_init", "gtrans_embed_init", "plain_transformer_ls0", "gtrans_ls0", "plain_transformer_wd", "gtrans_wd",
                  "gtrans_wd_decay_fusion", "gtrans_init_w1", "gtrans_tau1", "gtrans_fused_dropout")
    queue += [StudyRun(arm, seed, **standard) for seed in (1, 2) for arm in study_arms]  # priority 4

    # priority 6 (issue 38), by value: the paper's headline claim (24 + 18) with 3 seeds first, then fusion added to
    # a trained model with seed 1 of every family, then the seeds that test the recipe's win and the many-to-many
    # pair (priority 5), then the rest: the fine-tuning arms' seeds 2-3, the 12 + 12 pair, priority 4's 12 + 6
    # shape, and 18 + 12 with one seed last
    def depth_pair(shape, seed):
        return [StudyRun(f"{family}_{shape[0]}x{shape[1]}{LONG_DEPTH_SUFFIX}", seed, **DEEP_LONG_BUDGET)
                for family in ("plain_transformer", "gtrans")]

    queue += [run for seed in (1, 2, 3) for run in depth_pair((24, 18), seed)]
    queue += [StudyRun(arm, 1, **standard) for arm in FINE_TUNING_ARMS]
    # seeds 4-5 of deep representations' recipe, its baseline, and the runs both start from
    queue += [StudyRun(arm, seed, **standard) for seed in (4, 5)
              for arm in ("plain_transformer", "plain_transformer_continued", "deep_representations_paper")]
    queue += [ManyToManyRun(arm, seed) for seed in (1, 2, 3) for arm in ("plain_transformer_m2m", "gtrans_m2m")]
    queue += reruns_from_one_start(ledger_dir)  # priority 7: repairs comparisons in the ledger, before new seeds
    queue += [StudyRun(arm, seed, **standard) for seed in (2, 3) for arm in FINE_TUNING_ARMS]
    queue += [run for seed in (1, 2, 3) for run in depth_pair((12, 12), seed)]
    queue += [StudyRun(arm, seed, **standard) for seed in (1, 2) for arm in ("plain_transformer_12x6", "gtrans_12x6")]
    queue += depth_pair((18, 12), 1)
    queue += [StudyRun(arm, seed, **standard) for seed in (4, 5) for arm in FROM_SCRATCH_ARMS]  # priority 8
    return queue + converged_and_deep_baselines()  # priority 9


def converged_and_deep_baselines() -> list[StudyRun]:
    """Priority 9 (issue 76) in its order: the plain / GTrans pair trained to convergence with 3 seeds, the other
    families trained to convergence (seed 1 of each, then seeds 2-3); then the deep baselines that should train,
    pre-norm 12 + 12 (2,000 steps) and post-norm 12 + 12 with a 4,000-step warm-up (trained to convergence, and
    GTrans 12 + 12 beside it) with 3 seeds, pre-norm 24 + 18 with seed 1 among them and its seeds 2-3 last."""
    queue = [ConvergedRun(arm, seed) for seed in (1, 2, 3) for arm in CONVERGED_PAIR]
    queue += [ConvergedRun(arm, seed) for seed in (1, 2, 3) for arm in CONVERGED_FAMILIES]
    prenorm_12x12, prenorm_24x18 = PRE_NORM_DEEP_ARMS
    for seed in (1, 2, 3):
        queue.append(StudyRun(prenorm_12x12, seed, **DEEP_LONG_BUDGET))
        if seed == 1:
            queue.append(StudyRun(prenorm_24x18, seed, **DEEP_LONG_BUDGET))
        queue += [ConvergedRun(arm, seed, warmup_steps=WARMUP_4000_STEPS) for arm in WARMUP_4000_PAIR]
    return queue + [StudyRun(prenorm_24x18, seed, **DEEP_LONG_BUDGET) for seed in (2, 3)]


def pending_runs(ledger_dir: Path = LEDGER_DIR, probe_dir: Path = PROBE_DIR, arms: list[str] | None = None,
                 here: bool = True) -> list[ArmRun | DepthProbe]:
    """The queue's runs that the ledger lacks, in queue order; with `arms`, only the runs of those arms; with
    `here`, a rerun only where this machine holds its starting run (`here=False`: the queue as the ledger
    alone says, as the README lists it)."""
    return [
        run for run in study_queue(probe_dir, ledger_dir)
        if result_state(run, ledger_dir, probe_dir)[0] != "done"
        and (arms is None or (isinstance(run, ArmRun) and run.arm in arms))
        and (not here or not isinstance(run, Rerun) or run.runnable_here())
    ]


def result_state(run: ArmRun | DepthProbe, ledger_dir: Path = LEDGER_DIR, probe_dir: Path = PROBE_DIR
                 ) -> tuple[str, str | None]:
    """("done", None), ("pending", None), or ("unreadable", why) for a result file that exists but cannot be read as
    one (cut short, a bad merge): its run is not done, and its rerun replaces the file."""
    if not run.result_file(ledger_dir, probe_dir).is_file():
        return "pending", None
    problem = run.result_problem(ledger_dir, probe_dir)
    return ("done", None) if problem is None else ("unreadable", problem)


def finished_here(run: ArmRun | DepthProbe) -> bool:
    """Whether `run`'s run dir on this machine holds a finished run (its benchmark wrote bench_results.json last)."""
    return (run.run_dir() / "bench_results.json").is_file()


def starting_run(run: ArmRun | DepthProbe) -> StudyRun | None:
    """The run of the same seed and budget that a fine-tuning arm starts from (`STARTING_RUNS`), else None."""
    starting_arm = STARTING_RUNS.get(run.arm) if isinstance(run, StudyRun) else None
    if starting_arm is None:
        return None
    if isinstance(run, ConvergedRun):
        return replace(run, arm=starting_arm)
    return StudyRun(starting_arm, run.seed, run.max_steps, run.warmup_steps)


def ledger_cpu_minutes(arm_dir: Path, cpu: ledger.CpuKind, steps: int, evaluations: float = 1.0,
                       threads: int = 1, runs_at_once: int = 1) -> list[float]:
    """Training + evaluation minutes of the finished CPU runs in `arm_dir` (an arm's ledger dir), their training
    scaled to `steps` steps and their evaluation (val and test) to `evaluations` of them: those on `cpu`'s model and
    instruction set where there are any, else those on its model whose entries predate `device.cpu_capability`, else
    all; of those, the ones trained with `threads` torch threads (`--threads`) where there are any (a run with more
    threads is faster, and must not make one-thread runs look shorter), then the ones that shared the machine with
    `runs_at_once` runs (`--parallel`) where there are any, else those whose entries predate `runs_at_once` (runs
    sharing the machine's cores train slower than one alone on a core); unreadable files are left out (the queue
    reruns them)."""
    entries = []
    for path in Path(arm_dir).glob("seed_*.json"):
        try:
            entries.append(ledger.read_result_file(path, ("device.gpu", "device.cpu", "train_minutes",
                                                          "evaluation_minutes", "steps")))
        except ledger.UnreadableResult:
            continue
    on_cpu = [entry for entry in entries if entry["device"]["gpu"] is None]
    same_model = [entry for entry in on_cpu if entry["device"]["cpu"] == cpu.model]
    same_kind = [entry for entry in same_model if entry["device"].get("cpu_capability") == cpu.capability]
    unrecorded_kind = [entry for entry in same_model if entry["device"].get("cpu_capability") is None]
    chosen = same_kind or unrecorded_kind or on_cpu
    chosen = [entry for entry in chosen if entry["device"].get("torch_threads") == threads] or chosen
    same_sharing = [entry for entry in chosen if entry.get("runs_at_once") == runs_at_once]
    unrecorded_sharing = [entry for entry in chosen if entry.get("runs_at_once") is None]
    chosen = same_sharing or unrecorded_sharing or chosen
    return [entry["train_minutes"] * steps / entry["steps"] + (entry["evaluation_minutes"] or 0.0) * evaluations
            for entry in chosen]


PLAIN_LAYERS = 12  # the 6 + 6 plain model's, whose step time a deep stand-in scales by the layers


def timing_stand_ins(arm: str) -> list[tuple[str, float]]:
    """The arms whose CPU runs time `arm`'s runs while the ledger holds none of its own, in order of preference, each
    with the time of `arm`'s step relative to theirs: the same model at another budget (an arm trained to
    convergence: the arm at the step budget; a `_2000steps` arm: its 1,000-step runs); for priority 9's deep
    baselines, the post-norm model of their shape (its 2,000-step, then its 1,000-step runs), then the 6 + 6 plain
    model, its step time scaled by the layers (a step's time grows about linearly with them)."""
    if arm.endswith(CONVERGED_SUFFIX):
        return [(arm.removesuffix(CONVERGED_SUFFIX), 1.0)]
    if arm in PRE_NORM_DEEP_ARMS + WARMUP_4000_PAIR:
        family, encoder_layers, decoder_layers = re.fullmatch(r"(\w+?)(?:_prenorm)?_(\d+)x(\d+)_\w+", arm).groups()
        post_norm = f"{family}_{encoder_layers}x{decoder_layers}"
        return [(post_norm + LONG_DEPTH_SUFFIX, 1.0), (post_norm, 1.0),
                ("plain_transformer", (int(encoder_layers) + int(decoder_layers)) / PLAIN_LAYERS)]
    if arm.endswith(LONG_DEPTH_SUFFIX):
        return [(arm.removesuffix(LONG_DEPTH_SUFFIX), 1.0)]
    return []


def expected_epochs(run: ConvergedRun, ledger_dir: Path) -> tuple[int, str]:
    """The epochs `run` is expected to train, and why: as many as the longest of the ledger's converged runs trained
    (every arm's and device's: early stopping ends a run by its val BLEU, not by time), at most its cap; its cap
    while the ledger holds no converged run. A run that trains longer than any before is cut off by a session's end
    and resumes where runs/ survives."""
    epochs = []
    for path in Path(ledger_dir).glob("*/seed_*.json"):
        try:
            entry = ledger.read_entry(path)
        except ledger.UnreadableResult:
            continue  # the queue reruns it
        if ledger.is_converged(entry):
            epochs.append(len(entry["epoch_curve"]))
    if not epochs:
        return run.max_epochs, f"its cap of {run.max_epochs} epochs (no converged run in the ledger yet)"
    longest = min(max(epochs), run.max_epochs)
    return longest, f"{longest} epochs, the longest of the ledger's {len(epochs)} converged run(s)"


def expected_minutes(run: ArmRun | DepthProbe, args, cpu: ledger.CpuKind) -> tuple[float, str]:
    """How long `run` should take on one core of this CPU, and where that estimate comes from: the median of its
    arm's CPU runs in the ledger, else of the first of its stand-ins with any (`timing_stand_ins`), else
    `UNTIMED_RUN_MINUTES` per run of the standard budget; plus its starting run's when a fine-tuning arm must train
    that first (`STARTING_RUNS`; bench_multi30k.py does it when the finished run dir is missing). A run trained to
    convergence is expected to train `expected_epochs` (a resumed one at least one more epoch); timed from a stand-in
    at a step budget, it adds a val evaluation per epoch (half a val + test evaluation) and its two final ones, the
    best checkpoint's and the last checkpoints' average's (a converged run's own minutes hold them)."""
    if isinstance(run, DepthProbe):
        return UNTIMED_RUN_MINUTES, "no estimate for a depth probe"
    arm_dir = run.result_file(args.ledger_dir, args.probe_dir).parent
    done = resumed_step(run)
    steps_left, epochs_source = run.max_steps - done, None
    if isinstance(run, ConvergedRun):
        epochs, epochs_source = expected_epochs(run, args.ledger_dir)
        steps_left = min(max(epochs * STEPS_PER_EPOCH - done, STEPS_PER_EPOCH), steps_left)
    minutes = ledger_cpu_minutes(arm_dir, cpu, steps_left, threads=args.threads, runs_at_once=args.parallel)
    expected, source = None, f"the median of its arm's {len(minutes)} CPU run(s) in the ledger"
    if minutes:
        expected = statistics.median(minutes)
    evaluations = 2 + math.ceil(steps_left / STEPS_PER_EPOCH) / 2 if isinstance(run, ConvergedRun) else 1
    for stand_in, step_time in timing_stand_ins(run.arm) if expected is None else ():
        minutes = ledger_cpu_minutes(arm_dir.parent / stand_in, cpu, steps_left, evaluations, args.threads,
                                     args.parallel)
        if minutes:
            expected = statistics.median(minutes) * step_time
            source = (f"the median of `{stand_in}`'s {len(minutes)} CPU run(s) in the ledger, scaled to {steps_left} "
                      "steps" + (f" and {evaluations:g} val + test evaluations" if evaluations != 1 else "")
                      + (f", times {step_time:g} for its layers" if step_time != 1 else ""))
            break
    if expected is None:
        standard_runs = steps_left / min(run.max_steps, STANDARD_BUDGET["max_steps"])
        expected = UNTIMED_RUN_MINUTES * standard_runs
        source = (f"no CPU run of its arm in the ledger: the issue's {UNTIMED_RUN_MINUTES} min per run"
                  + (f" of {STANDARD_BUDGET['max_steps']} steps, scaled to {steps_left}" if standard_runs > 1 else ""))
    if epochs_source:
        source += f", for {epochs_source}"
    if done:
        source += f", for the {steps_left} steps left after its checkpoint at step {done}"
    start_from = starting_run(run)
    if start_from is not None and not finished_here(start_from):
        starting_minutes, _ = expected_minutes(start_from, args, cpu)
        expected += starting_minutes
        source += f", plus {starting_minutes:.0f} min to train its starting run {start_from.label} first"
    return expected, source


def git(*arguments: str) -> str:
    return subprocess.run(["git", "-C", str(REPO_ROOT), *arguments], capture_output=True, text=True,
                          check=True).stdout.strip()


def code_snapshot(commit: str) -> Path:
    """The committed tree of `commit`, exported once into runs/study/code/<commit>."""
    snapshot = WORK_DIR / "code" / commit
    if not (snapshot / SNAPSHOT_COMMIT_FILE).is_file():
        if snapshot.exists():
            shutil.rmtree(snapshot)  # an interrupted export
        snapshot.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", commit], capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(snapshot)], input=archive.stdout, check=True)
        (snapshot / SNAPSHOT_COMMIT_FILE).write_text(commit + "\n")
    return snapshot


def discard_stale_run(run: ArmRun | DepthProbe, commit: str) -> None:
    """An unfinished run dir of another commit would resume with other code: start that run over. Finished runs
    (their result file written) are kept whatever their commit: their result records it."""
    run_dir = run.run_dir()
    marker = run_dir / "STUDY_COMMIT"
    if run_dir.is_dir() and not finished_here(run):
        made_by = marker.read_text().strip() if marker.is_file() else "an unknown commit"
        if made_by != commit:
            print(f"study: discarding the unfinished {run_dir} (made by {made_by[:12]}, HEAD is {commit[:12]})",
                  flush=True)
            shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    marker.write_text(commit + "\n")


def resumed_step(run: ArmRun | DepthProbe) -> int:
    """The step of the checkpoint a resumed `run` continues from (`resumable_commit`), else 0: only the steps after it
    are still to train, so a run a stop interrupted fits a session its full length would not. That checkpoint is
    the one `run_translation.last_complete_checkpoint` picks, the newest with a readable `trainer_state.json` (its
    rule, restated here so that the queue imports no torch)."""
    if isinstance(run, DepthProbe) or resumable_commit(run) is None:
        return 0
    numbers = ((path.name.removeprefix("checkpoint-"), path) for path in run.checkpoint_dir().glob("checkpoint-*"))
    steps = sorted((int(number), path) for number, path in numbers if number.isdigit())
    for step, path in reversed(steps):
        try:
            json.loads((path / "trainer_state.json").read_text())
        except (OSError, ValueError):
            continue  # written while the process was killed
        return min(step, run.max_steps)
    return 0


def resumable_commit(run: ArmRun | DepthProbe) -> str | None:
    """The commit that started `run`'s unfinished run dir, where the dir holds a checkpoint to resume from and the
    repository still has that commit (its code exported or exportable): a run that a stop interrupted continues with
    the code it started with, whatever was committed since, instead of starting over (runs longer than a session
    would never finish otherwise)."""
    run_dir = run.run_dir()
    marker = run_dir / "STUDY_COMMIT"
    if not marker.is_file() or finished_here(run) or not any(run.checkpoint_dir().glob("checkpoint-*")):
        return None
    commit = marker.read_text().strip()
    if (WORK_DIR / "code" / commit / SNAPSHOT_COMMIT_FILE).is_file():
        return commit
    known = subprocess.run(["git", "-C", str(REPO_ROOT), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True)
    return commit if known.returncode == 0 else None


def code_to_run(resume: str | None = None) -> tuple[str, Path]:
    """The commit a run runs and the tree that holds its code: `resume` (an interrupted run's own commit,
    `resumable_commit`) or else HEAD, exported into runs/study/code/<commit>; or, in a tree exported from a commit
    without its .git (a copy sent to a lent GPU machine, say: write the commit into its SNAPSHOT_COMMIT file first),
    that tree itself."""
    exported = REPO_ROOT / SNAPSHOT_COMMIT_FILE
    if exported.is_file() and not (REPO_ROOT / ".git").exists():
        return exported.read_text().strip(), REPO_ROOT
    if resume is not None:
        return resume, code_snapshot(resume)
    commit = git("rev-parse", "HEAD")
    if git("status", "--porcelain", "--untracked-files=no", "--", "hf_layerfusion", "examples", "study"):
        print(f"study: uncommitted changes in the working tree are not part of this run (it runs {commit[:12]})",
              flush=True)
    return commit, code_snapshot(commit)


def shared_state(run: ArmRun | DepthProbe) -> tuple:
    """What a run shares with other runs of the queue: runs with the same key never run at the same time. A
    fine-tuning arm shares its starting run until that has finished here (it would train it first); once finished,
    the arms starting from it only read it and run side by side. Many-to-many runs share their tokenizer; a depth
    probe measures seconds per step, so it runs alone (`ALONE`)."""
    if isinstance(run, DepthProbe):
        return ALONE
    if isinstance(run, ManyToManyRun):
        return ("many-to-many",)
    start_from = starting_run(run)
    shared = run if start_from is None or finished_here(start_from) else start_from
    return (shared.arm, run.seed, run.max_steps, run.warmup_steps)


ALONE = ("alone",)


@dataclass
class RunningRun:
    run: ArmRun | DepthProbe
    process: subprocess.Popen
    log: Path
    started: float


def start(run: ArmRun | DepthProbe, args, runs_at_once: int) -> RunningRun:
    """Start one study run in a subprocess; `runs_at_once` is how many runs share the device as it starts (itself
    included), which the ledger records beside its throughput."""
    resume = resumable_commit(run)
    commit, snapshot = code_to_run(resume)
    if resume is not None:
        print(f"study: resuming the unfinished {run.run_dir()} with the code of its own commit {resume[:12]}",
              flush=True)
    discard_stale_run(run, commit)
    command = run.command(snapshot, args)
    if isinstance(run, StudyRun):
        command += ["--runs_at_once", str(runs_at_once)]
    environment = {
        **os.environ,
        "PYTHONPATH": str(snapshot),  # before the editable install of the working tree
        "OMP_NUM_THREADS": str(args.threads),
        "MKL_NUM_THREADS": str(args.threads),
        "OMP_WAIT_POLICY": "PASSIVE",  # never spin on cores another job uses
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }
    log = WORK_DIR / "logs" / f"{time.strftime('%Y%m%d-%H%M%S')}_{run.run_dir().parent.name}_{run.run_dir().name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"study: {time.strftime('%H:%M:%S')} {run.label}, commit {commit[:12]}; log {log}", flush=True)
    with open(log, "w") as stream:
        stream.write(" ".join(command) + "\n")
        stream.flush()
        process = subprocess.Popen(command, stdout=stream, stderr=subprocess.STDOUT, env=environment, cwd=snapshot)
    return RunningRun(run, process, log, time.monotonic())


def finish(running: RunningRun, args) -> bool:
    """Wait for a started run; True when its result file exists afterwards."""
    returncode = running.process.wait()
    minutes = (time.monotonic() - running.started) / 60
    done = result_state(running.run, args.ledger_dir, args.probe_dir)[0] == "done"
    print(f"study: {time.strftime('%H:%M:%S')} {running.run.label} "
          f"{'finished' if done else f'FAILED (exit {returncode})'} after {minutes:.0f} min"
          + ("" if done else f"; see {running.log}"), flush=True)
    return done


def startable(pending: list, running: list[RunningRun], slots: int) -> list:
    """The pending runs to start now, in queue order: up to `slots` more than are running, none sharing state with
    a running run or with each other (`shared_state`), and a depth probe only when nothing else runs."""
    chosen: list = []
    busy = {shared_state(r.run) for r in running} | {r.run for r in running}
    if ALONE in busy:
        return []
    for run in pending:
        if len(running) + len(chosen) >= slots:
            break
        key = shared_state(run)
        if run in busy or key in busy:
            continue
        if key == ALONE and (running or chosen):
            break  # a probe waits for the runs before it, and nothing after it starts before it
        chosen.append(run)
        busy |= {key, run}
        if key == ALONE:
            break
    return chosen


def fitting_runs(pending: list, minutes_left: float, args, cpu: ledger.CpuKind, skipped: set) -> list:
    """The pending runs expected to finish in `minutes_left` (`expected_minutes`), in queue order; with `--fill`,
    the others after them, in queue order. Says once for each run that does not fit why (`skipped` remembers
    which)."""
    fitting, longer = [], []
    for run in pending:
        minutes, source = expected_minutes(run, args, cpu)
        if minutes <= minutes_left:
            fitting.append(run)
            continue
        longer.append(run)
        if run not in skipped:
            skipped.add(run)
            then = ("--fill starts it when no run that fits waits for a free slot" if args.fill
                    else "not starting it")
            print(f"study: {time.strftime('%H:%M:%S')} {run.label} does not fit: expected {minutes:.0f} min "
                  f"({source}), {minutes_left:.0f} min of --hours left; {then}", flush=True)
    return fitting + longer if args.fill else fitting


def stop(running: list[RunningRun]) -> None:
    """Stop the runs still running (the queue itself is stopping): each resumes from its last checkpoint when a queue
    starts it again. Left running, a run would hold its run dir (`_run.lock`) and make the next queue's start of it
    fail."""
    stopping = [running_run for running_run in running if running_run.process.poll() is None]
    for running_run in stopping:
        running_run.process.terminate()
    for running_run in stopping:
        try:
            running_run.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            running_run.process.kill()
            running_run.process.wait()
        print(f"study: {time.strftime('%H:%M:%S')} stopped {running_run.run.label} with the queue; it resumes from its "
              f"last checkpoint", flush=True)


def run_queue(args) -> bool:
    """Run the pending runs, `args.parallel` at a time; False when a run failed (the running ones are waited for,
    no new one starts: a failing run is not retried in a loop, its log says why). Stopped (Ctrl-C, SIGTERM: `main`
    makes it SystemExit), it stops its runs."""
    running: list[RunningRun] = []
    try:
        return run_pending(args, running)
    finally:
        stop(running)


def run_pending(args, running: list[RunningRun]) -> bool:
    """`run_queue`'s loop; `running`: the runs started and not yet finished, kept up to date for `stop`."""
    failed, started = False, 0
    deadline = None if args.hours is None else time.monotonic() + args.hours * 3600
    cpu, skipped = ledger.this_cpu(), set()
    while True:
        pending = [] if failed or (args.once and started) else pending_runs(args.ledger_dir, args.probe_dir, args.arms)
        if deadline is not None:
            pending = fitting_runs(pending, (deadline - time.monotonic()) / 60, args, cpu, skipped)
        pending = pending[: 1 if args.once else None]
        starting = startable(pending, running, args.parallel)
        # --parallel is a ceiling: the ledger gets the number of runs that really share the device
        runs_at_once = len(running) + len(starting)
        for run in starting:
            running.append(start(run, args, runs_at_once))
            started += 1
        if not running:
            return not failed
        while all(r.process.poll() is None for r in running):
            time.sleep(2)
        for done in [r for r in running if r.process.poll() is not None]:
            running.remove(done)
            failed |= not finish(done, args)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m study", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--list", action="store_true", help="Print the queue with what is done, and exit.")
    parser.add_argument("--once", action="store_true", help="Run only the next pending run.")
    parser.add_argument(
        "--arms", nargs="+", metavar="ARM",
        help="Run only these arms' pending runs, in queue order (e.g. the shorter arms, where a session cannot fit the "
             "next one on this machine); default: the whole queue.",
    )
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of a run (default: %(default)s).")
    parser.add_argument(
        "--parallel", type=int, default=1, metavar="N",
        help="Runs at once (default: %(default)s). On a GPU several of these small runs share it well (8 at once "
             "took 7 minutes for 8 runs on an H200); on a CPU keep 1 (one core). The ledger records with each run "
             "how many ran as it started, itself included (`runs_at_once`, at most N), since its throughput then is "
             "a share of the device. Runs that share state (a fine-tuning arm and its starting run until that has finished here, the many-to-many runs) never run "
             "together, and a depth probe (it measures seconds per step) runs alone.",
    )
    parser.add_argument(
        "--hours", type=float, metavar="H",
        help="How long this machine stays up (a session's time left, say): start only runs expected to finish within "
             "it, on one core of this CPU (the median of the arm's CPU runs in the ledger, on this CPU model and vector "
             "instruction set where there are any, else on this model as recorded before the set was, else on any "
             "CPU; without any, those of a stand-in at another budget: a run trained to convergence is timed to its "
             "cap of epochs from its arm's 2,000-step runs, with a val evaluation every epoch; a deep baseline of "
             "priority 9 from the post-norm runs of its shape; %d min per 2,000-step run without any; plus a "
             "fine-tuning arm's starting run when that must train first), and skip the others for later runs of the "
             "queue that fit. A new machine starts without runs/, so a run that does not fit would only be lost. "
             "Default: no limit." % UNTIMED_RUN_MINUTES,
    )
    parser.add_argument(
        "--fill", action="store_true",
        help="With --hours, on a machine that keeps runs/ from one session to the next: once no pending run that "
             "fits the time left waits for a free slot, start the runs that do not fit, in queue order. Each "
             "checkpoints (every 500 steps; every epoch trained to convergence) and the next queue resumes it, so "
             "runs longer than any session land in pieces instead of never starting; where runs/ is lost at the "
             "stop, the run is lost with it, having used a core nothing else was using.",
    )
    parser.add_argument("--nice", type=int, default=19, help="Niceness of the queue (default: %(default)s).")
    parser.add_argument("--ledger_dir", type=Path, default=LEDGER_DIR, help="default: %(default)s")
    parser.add_argument("--probe_dir", type=Path, default=PROBE_DIR,
                        help="Results of the depth probes (default: %(default)s)")
    parser.add_argument("--data_dir", type=Path, default=DEFAULT_DATA, help="Multi30k (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error(f"--threads must be positive, got {args.threads}")
    if args.parallel < 1:
        parser.error(f"--parallel must be positive, got {args.parallel}")
    if args.once and args.parallel != 1:
        parser.error(f"--once runs one run; it does not go with --parallel {args.parallel}")
    if args.hours is not None and not (math.isfinite(args.hours) and args.hours > 0):
        parser.error(f"--hours must be a positive number of hours, got {args.hours}")
    if args.fill and args.hours is None:
        parser.error("--fill starts the runs that do not fit the time --hours leaves; without --hours every run "
                     "starts anyway: give --hours H or leave out --fill")
    if not 0 <= args.nice <= 19:
        parser.error(f"--nice must be in 0..19, got {args.nice}")
    # a directory that is not there holds no result: the whole queue would read as pending
    for option, directory in (("--ledger_dir", args.ledger_dir), ("--probe_dir", args.probe_dir)):
        if not directory.is_dir():
            parser.error(f"{option} {directory} is not a directory: give the existing results directory "
                         f"(default: {parser.get_default(option[2:])})")
    if args.arms is not None:
        known = {run.arm for run in study_queue(args.probe_dir, args.ledger_dir) if isinstance(run, ArmRun)}
        unknown = sorted(set(args.arms) - known)
        if unknown:
            parser.error(f"--arms: unknown arm(s) {', '.join(unknown)}; the queue's arms: {', '.join(sorted(known))}")
    args.ledger_dir, args.probe_dir, args.data_dir = (path.resolve() for path in
                                                      (args.ledger_dir, args.probe_dir, args.data_dir))
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.list:
        queue = study_queue(args.probe_dir, args.ledger_dir)
        for number, run in enumerate(queue, start=1):
            state, problem = result_state(run, args.ledger_dir, args.probe_dir)
            mark = {"done": "done", "pending": "    ", "unreadable": "BAD "}[state]
            print(f"{number:>3} {mark} {run.label:<46} {run.budget}")
            if isinstance(run, Rerun) and state != "done" and not run.runnable_here():
                print("         its starting run is not on this machine: only a machine that kept that run can run it")
            if problem is not None:
                print(f"         unreadable result {run.result_file(args.ledger_dir, args.probe_dir)}: {problem}; "
                      "not done, the queue reruns it")
            if run == DepthProbe(*DEEP_SHAPES[-1]):  # the last probe
                print(f"         priority 2's pair: {deep_post_norm_pair(args.probe_dir)[1]}")
        return
    if not args.data_dir.is_dir():
        raise SystemExit(f"study: no Multi30k directory at {args.data_dir} (--data_dir)")
    os.nice(max(args.nice - os.nice(0), 0))
    WORK_DIR.mkdir(parents=True, exist_ok=True)
    lock = open(WORK_DIR / "lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SystemExit("study: another study queue is running in this checkout (runs/study/lock)") from None
    # `kill` stops the queue's runs too (`run_queue`), as Ctrl-C does
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if not run_queue(args):
        raise SystemExit(1)
    if args.once:
        return
    left = pending_runs(args.ledger_dir, args.probe_dir, args.arms)
    if left:
        print(f"study: {len(left)} pending run(s) do not fit the time --hours leaves; next: {left[0].label}.")
    else:
        print("study: the queue is empty: every run is in the ledger." if args.arms is None
              else f"study: every run of {', '.join(args.arms)} is in the ledger.")


if __name__ == "__main__":
    main()
