"""How long a study run trained, across the sessions it was resumed in: the benchmarks record it in the ledger
(`train_minutes`) and, from it, the time their last session spent on the final translations (`evaluation_minutes`),
which `study.queue --hours` adds to a run's expected time."""

from __future__ import annotations

import json
from pathlib import Path

from transformers.trainer import TRAINER_STATE_NAME

from hf_layerfusion.cli.run_translation import last_complete_checkpoint


def trained_seconds(directory: Path) -> float:
    """The training time in the trainer state of a run dir or checkpoint: `TimeBudgetCallback`'s, which carries on
    across resumes (the Trainer's `train_runtime` covers one process)."""
    state = json.loads((directory / TRAINER_STATE_NAME).read_text())
    return state["stateful_callbacks"]["TimeBudgetCallback"]["attributes"]["elapsed_seconds"]


def seconds_trained_before(output_dir: Path) -> float:
    """What a run training into `output_dir` with `--resume_from_checkpoint last` has trained before it starts: its
    newest complete checkpoint's time, the one run_translation and run_multilingual resume from; 0 for a fresh run."""
    checkpoint = last_complete_checkpoint(str(output_dir)) if output_dir.is_dir() else None
    return 0.0 if checkpoint is None else trained_seconds(Path(checkpoint))
