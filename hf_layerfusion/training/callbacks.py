"""Trainer callbacks: training time budget, fusion-weight logging and per-layer gradient norms (with plots).

- `TimeBudgetCallback`: stops training after a wall-clock budget; the time spent is saved in every checkpoint
  (`trainer_state.json`), so a resumed run continues the same budget instead of starting a new one.
- `FusionWeightsCallback`: at every training log, adds each family's fusion weights to the logs (GTrans: sigma(w^e)
  per encoder group, sigma(w^{dr}) per decoder layer, psi per decoder group) and plots them over the steps at the
  end of training (`fusion_weights.png`).
- `LayerGradientNormCallback`: per-layer gradient norms of the encoder and decoder (GTrans Fig. 11), averaged over
  the optimisation steps between two logs, logged and plotted (`layer_gradient_norms.png`).
- `CompactLogCallback`: a console view for people watching a run: a tqdm bar over the training steps (with an
  estimate of the time left), one short line per log (`compact_log_line`: step, loss, learning rate, validation BLEU
  when evaluated, elapsed time) instead of the Trainer's raw dicts, and a bar while a split is translated. It
  replaces transformers' `PrinterCallback` / `ProgressCallback` (`use_compact_logging`); the training CLI's
  `--compact_logging True` turns it on (off by default), `examples/quickstart.py` uses it.

The plots need matplotlib (the `train` extra). Without it both callbacks still log their values and say once, when
they are made, that they will not plot them: a training run never fails at its end for want of a plotting library.

The logged values go into the Trainer's `state.log_history` (hence `trainer_state.json` of every checkpoint, so the
plots of a resumed run cover the whole run) and to the reporting integrations (TensorBoard, W&B, ...). Integrations
are callbacks that run in list order and `Trainer(callbacks=...)` appends user callbacks after them, so these two
put their values in the logs on `on_log` *and* ask to run first: `LayerFusionSeq2SeqTrainer` moves them to the front
of its callback list (`LOG_ENRICHING_CALLBACKS`); with a plain `Trainer`, integrations other than the console and
`log_history` do not see them.
"""

from __future__ import annotations

import io
import logging
import os
import time
from collections import defaultdict
from collections.abc import Iterable

import torch
from tqdm.auto import tqdm
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import SaveStrategy

from ..file_checks import write_file_atomically
from ..modeling.input_checks import check_finite_number


FUSION_PREFIX = "fusion/"
GRAD_NORM_PREFIX = "layer_grad_norm/"

logger = logging.getLogger(__name__)


class TimeBudgetCallback(TrainerCallback, ExportableState):
    """Stop training once `max_minutes` of training wall-clock time have passed (`None`: no budget, only measure).

    The time counts from `on_train_begin` (evaluations during training included). It is stored in the checkpoints'
    `trainer_state.json` under `stateful_callbacks`, and `on_train_begin` of a resumed run reads it back from there,
    so killing and resuming a run does not extend its budget. The budget itself is always the current run's
    argument (a resumed run may be given more time). When the budget stops training, a checkpoint is saved (unless
    `save_strategy="no"`), a warning says so (step reached, time spent), and `ended_training` becomes true: a run
    cut short by the clock must not pass for one that did all its steps.
    """

    def __init__(self, max_minutes: float | None = None):
        # None is no budget; infinity would be one that never stops, which None says
        if max_minutes is not None and not (check_finite_number(max_minutes, "max_minutes") > 0):
            raise ValueError(f"`max_minutes` must be positive, got {max_minutes}.")
        self.max_minutes = max_minutes
        self.elapsed_seconds = 0.0
        self._previous_seconds = 0.0
        self._session_start: float | None = None
        self.ended_training = False

    def state(self) -> dict:
        return {"args": {"max_minutes": self.max_minutes}, "attributes": {"elapsed_seconds": self.elapsed_seconds}}

    def on_train_begin(self, args, state, control, **kwargs):
        stored = state.stateful_callbacks.get(type(self).__name__)
        # on resume `state` was loaded from the checkpoint: continue from the time it recorded
        self._previous_seconds = stored["attributes"]["elapsed_seconds"] if stored else self.elapsed_seconds
        self.elapsed_seconds = self._previous_seconds
        self._session_start = time.monotonic()
        self.ended_training = False

    def on_step_end(self, args, state, control, **kwargs):
        self.elapsed_seconds = self._previous_seconds + time.monotonic() - self._session_start
        if self.max_minutes is None:
            return control
        out_of_time = self.elapsed_seconds >= 60 * self.max_minutes
        if args.world_size > 1:
            # the processes' clocks differ: all must stop at the same step (else the others wait forever in the
            # next gradient all-reduce), so process 0 decides
            decision = torch.tensor(int(out_of_time), device=args.device)
            torch.distributed.broadcast(decision, src=0)
            out_of_time = bool(decision.item())
        if out_of_time:
            control.should_training_stop = True
            # a checkpoint where the budget ran out: resumable, and it records the time spent
            control.should_save = args.save_strategy != SaveStrategy.NO
            self.ended_training = True
            if state.is_world_process_zero:
                logger.warning(
                    "The time budget ended training: %.1f of %g minutes used at step %d of %d.",
                    self.elapsed_seconds / 60,
                    self.max_minutes,
                    state.global_step,
                    state.max_steps,
                )
        return control


@torch.no_grad()
def fusion_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """`{name: 1-D tensor}` of the fusion weights of the model's encoder and decoder readouts (empty for the plain
    Transformer): every readout reports its own, with the transforms of its paper, through `fusion_weights()`."""
    weights = {}
    for stack in (model.get_encoder(), model.get_decoder()):
        weights.update(stack.readout.fusion_weights())
    return {name: value.detach().float().cpu() for name, value in weights.items()}


def flatten_indexed(prefix: str, values: dict[str, torch.Tensor | Iterable[float]]) -> dict[str, float]:
    """`{"gate": [a, b]}` -> `{"<prefix>gate_1": a, "<prefix>gate_2": b}` (1-based, as groups and layers in the papers)."""
    return {f"{prefix}{name}_{i}": float(v) for name, vector in values.items() for i, v in enumerate(vector, start=1)}


def is_training_log(logs: dict) -> bool:
    """The periodic training log (`loss`, `learning_rate`, ...), not an evaluation or the end-of-training summary."""
    return "loss" in logs and "train_runtime" not in logs


def add_to_logs(values: dict[str, float], state, logs: dict) -> None:
    """Add values to the logs the integrations receive and to the `log_history` entry `Trainer.log` just wrote."""
    logs.update(values)
    if state.log_history:
        state.log_history[-1].update(values)


PLOTTING_REQUIREMENT = "pip install matplotlib, or hf_layerfusion[train],"


def can_plot(what: str) -> bool:
    """Whether matplotlib can be imported; without it, a warning that `what` is logged but not plotted."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        logger.warning(f"matplotlib is not installed: {what} will be logged but not plotted ({PLOTTING_REQUIREMENT} "
                       "to plot them).")
        return False
    return True


def plot_at_train_end(args, state, plot_dir: str | None, prefix: str, file_name: str, title: str) -> None:
    """`plot_logged_series` into `<plot_dir or output_dir>/<file_name>`, on the main process only."""
    if state.is_world_process_zero:
        plot_dir = plot_dir or args.output_dir
        os.makedirs(plot_dir, exist_ok=True)
        plot_logged_series(state.log_history, prefix, os.path.join(plot_dir, file_name), title)


def plot_logged_series(log_history: list[dict], prefix: str, path: str, title: str) -> str | None:
    """One subplot per series family (`<prefix><name>_<index>`), one line per index, against the global step.
    Returns the PNG path, or `None` when nothing with that prefix was logged. The image is rendered in memory and
    written through a temporary file renamed into place: a failure (a full disk) leaves the previous plot whole."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    series: dict[str, dict[int, tuple[list[int], list[float]]]] = defaultdict(lambda: defaultdict(lambda: ([], [])))
    for entry in log_history:
        for key, value in entry.items():
            if key.startswith(prefix):
                name, index = key[len(prefix) :].rsplit("_", 1)
                steps, values = series[name][int(index)]
                steps.append(entry["step"])
                values.append(value)
    if not series:
        return None
    fig, axes = plt.subplots(len(series), 1, figsize=(7, 2.8 * len(series)), squeeze=False)
    for ax, (name, lines) in zip(axes[:, 0], sorted(series.items())):
        for index, (steps, values) in sorted(lines.items()):
            ax.plot(steps, values, label=str(index))
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.legend(fontsize="small", ncol=min(len(lines), 6), title="layer / group", title_fontsize="small")
    fig.suptitle(title)
    fig.tight_layout()
    image = io.BytesIO()
    try:
        # the format from the file name as `savefig(path)` would take it (none: matplotlib's default, PNG)
        fig.savefig(image, format=os.path.splitext(path)[1][1:] or None)
    finally:
        plt.close(fig)
    write_file_atomically(path, image.getvalue(), what="Plot")
    return path


class FusionWeightsCallback(TrainerCallback):
    """Log the model's fusion weights (keys `fusion/<name>_<i>`) at every training log; plot them at train end
    into `<plot_dir or output_dir>/fusion_weights.png` (where matplotlib is installed: `can_plot`)."""

    def __init__(self, plot_dir: str | None = None):
        self.plot_dir = plot_dir
        self.plots = can_plot("the fusion weights")

    def on_log(self, args, state, control, logs=None, model=None, **kwargs):
        if logs is not None and is_training_log(logs):
            add_to_logs(flatten_indexed(FUSION_PREFIX, fusion_weights(model)), state, logs)

    def on_train_end(self, args, state, control, **kwargs):
        if self.plots:
            plot_at_train_end(args, state, self.plot_dir, FUSION_PREFIX, "fusion_weights.png", "Fusion weights")


@torch.no_grad()
def layer_gradient_norms(model: torch.nn.Module) -> dict[str, list[float]]:
    """L2 norm of the gradient of every encoder and decoder layer's parameters (0 for a layer without gradient,
    e.g. a decoder layer above the groups being trained)."""
    norms = {}
    for name, stack in (("encoder", model.get_encoder()), ("decoder", model.get_decoder())):
        per_layer = []
        for layer in stack.layers:
            grads = [p.grad.float() for p in layer.parameters() if p.grad is not None]
            per_layer.append(
                torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
                if grads
                else torch.zeros(())
            )
        norms[name] = torch.stack([norm.cpu() for norm in per_layer]).tolist()
    return norms


class LayerGradientNormCallback(TrainerCallback):
    """Per-layer gradient norms (GTrans Fig. 11), keys `layer_grad_norm/<encoder|decoder>_<layer>`: the mean over
    the optimisation steps since the previous log, measured before each optimizer step (after clipping, which
    scales every layer alike). Plotted at train end into `<plot_dir or output_dir>/layer_gradient_norms.png` (where
    matplotlib is installed: `can_plot`)."""

    def __init__(self, plot_dir: str | None = None):
        self.plot_dir = plot_dir
        self.plots = can_plot("the per-layer gradient norms")
        self._sums: dict[str, list[float]] = {}
        self._steps = 0

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        norms = layer_gradient_norms(model)
        if not self._sums:
            self._sums = {name: [0.0] * len(values) for name, values in norms.items()}
        for name, values in norms.items():
            self._sums[name] = [total + value for total, value in zip(self._sums[name], values)]
        self._steps += 1

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs is not None and is_training_log(logs) and self._steps:
            means = {name: [total / self._steps for total in totals] for name, totals in self._sums.items()}
            add_to_logs(flatten_indexed(GRAD_NORM_PREFIX, means), state, logs)
            self._sums, self._steps = {}, 0

    def on_train_end(self, args, state, control, **kwargs):
        if self.plots:
            plot_at_train_end(args, state, self.plot_dir, GRAD_NORM_PREFIX, "layer_gradient_norms.png",
                              "Gradient norm per layer")


PROGRESS_POSITION_VARIABLE = "HF_LAYERFUSION_PROGRESS_POSITION"


def format_duration(seconds: float) -> str:
    """`75.4` -> `"1:15"`, `3725` -> `"1:02:05"` (whole seconds, as tqdm writes them)."""
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def compact_log_line(logs: dict, step: int, max_steps: int, elapsed_seconds: float, prefix: str = "") -> str | None:
    """One short line for a Trainer log, e.g. `gtrans  step 400/1600  loss 3.214  lr 1.60e-03  0:52`, or
    `... step 800/1600  val loss 2.871  val BLEU 85.21  1:40` for an evaluation; `None` for a log with neither a
    training loss nor evaluation metrics (the end-of-training summary, say). Values may be numbers or the strings
    transformers formats them into; keys the line does not show (fusion weights, gradient norms, ...) stay in
    `state.log_history` and the reporting integrations."""

    def number(key: str) -> float:
        return float(logs[key])

    parts = []
    if "loss" in logs:
        parts.append(f"loss {number('loss'):.3f}")
    if "learning_rate" in logs:
        parts.append(f"lr {number('learning_rate'):.2e}")
    if "eval_loss" in logs:
        parts.append(f"val loss {number('eval_loss'):.3f}")
    if "eval_bleu" in logs:
        parts.append(f"val BLEU {number('eval_bleu'):.2f}")
    if not parts or "train_runtime" in logs:
        return None
    width = len(str(max_steps)) if max_steps > 0 else 0
    position = f"step {step:>{width}}/{max_steps}" if max_steps > 0 else f"step {step}"
    return "  ".join([*([prefix] if prefix else []), position, *parts, format_duration(elapsed_seconds)])


class CompactLogCallback(TrainerCallback):
    """A console view of a run (see the module docstring): a progress bar over the training steps with tqdm's
    estimate of the time left, one `compact_log_line` per training log or evaluation (written above the bar), a bar
    over the batches while a split is translated, and a last line with the steps done and the training time.
    `prefix` starts every line and names the bars (the model being trained, say); `file` is where they go
    (default: tqdm's, stderr; a file that is not a terminal gets the same lines and a bar redrawn every
    `mininterval` seconds). `position` is the bars' line (tqdm's `position`; default: the environment variable
    `HF_LAYERFUSION_PROGRESS_POSITION`, else 0), for runs side by side in one terminal, each on its own line (as
    `examples/quickstart.py` trains its two models). Only the main process prints. Meant to replace the Trainer's
    printing callbacks: `use_compact_logging(trainer, ...)`."""

    def __init__(self, prefix: str = "", file=None, mininterval: float = 1.0, position: int | None = None):
        self.prefix = prefix
        self.file = file
        self.mininterval = mininterval
        if position is None:
            raw = os.environ.get(PROGRESS_POSITION_VARIABLE, "").strip() or "0"
            if not raw.isdigit():
                raise ValueError(f"{PROGRESS_POSITION_VARIABLE} must be a line number (0, 1, ...), got {raw!r}.")
            position = int(raw)
        self.position = position
        self.training_bar = None
        self.prediction_bar = None
        self._start: float | None = None
        self._step = 0

    def elapsed(self) -> float:
        return 0.0 if self._start is None else time.monotonic() - self._start

    def write(self, line: str) -> None:
        tqdm.write(line, file=self.file)

    def on_train_begin(self, args, state, control, **kwargs):
        self._start = time.monotonic()
        self._step = state.global_step
        if state.is_world_process_zero:
            self.training_bar = tqdm(
                total=state.max_steps, initial=state.global_step, desc=f"{self.prefix} training".strip(),
                unit="step", file=self.file, mininterval=self.mininterval, dynamic_ncols=True, position=self.position,
            )

    def on_step_end(self, args, state, control, **kwargs):
        if self.training_bar is not None:
            self.training_bar.update(state.global_step - self._step)
        self._step = state.global_step

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or logs is None:
            return
        line = compact_log_line(logs, state.global_step, state.max_steps, self.elapsed(), self.prefix)
        if line is not None:
            self.write(line)

    def on_prediction_step(self, args, state, control, eval_dataloader=None, **kwargs):
        if not state.is_world_process_zero:
            return
        if self.prediction_bar is None:
            total = len(eval_dataloader) if eval_dataloader is not None and hasattr(eval_dataloader, "__len__") else None
            self.prediction_bar = tqdm(
                total=total, desc=f"{self.prefix} translating".strip(), unit="batch", file=self.file,
                mininterval=self.mininterval, leave=False, dynamic_ncols=True, position=self.position,
            )
        self.prediction_bar.update(1)

    def _close_prediction_bar(self):
        if self.prediction_bar is not None:
            self.prediction_bar.close()
            self.prediction_bar = None

    def on_evaluate(self, args, state, control, **kwargs):
        self._close_prediction_bar()

    def on_predict(self, args, state, control, **kwargs):
        self._close_prediction_bar()

    def on_train_end(self, args, state, control, **kwargs):
        if self.training_bar is not None:
            self.training_bar.close()
            self.training_bar = None
            prefix = f"{self.prefix}  " if self.prefix else ""
            self.write(f"{prefix}trained {state.global_step} steps in {format_duration(self.elapsed())}")


def use_compact_logging(trainer, prefix: str = "", file=None) -> CompactLogCallback:
    """Replace `trainer`'s printing callbacks (transformers' `PrinterCallback` / `ProgressCallback`, whichever
    `disable_tqdm` chose) with a `CompactLogCallback`, which it returns."""
    trainer.remove_callback(PrinterCallback)
    trainer.remove_callback(ProgressCallback)
    callback = CompactLogCallback(prefix, file=file)
    trainer.add_callback(callback)
    return callback


def close_progress_bars(callbacks: Iterable[TrainerCallback]) -> None:
    """Close the progress bars that transformers' `ProgressCallback` and `CompactLogCallback` hold open in
    `callbacks` (a trainer's `callback_handler.callbacks`), for a training run that ended with an exception: neither
    callback hears of it (`on_train_end` is not called). A bar left open would be closed by its finaliser at
    interpreter exit, where on Python 3.13 it crashes the process with a segmentation fault once `__main__` has been
    imported (dill, which torch imports, imports it; tqdm/tqdm#1687), after the exception's own traceback."""
    for callback in callbacks:
        if isinstance(callback, (ProgressCallback, CompactLogCallback)):
            bars = (callback.training_bar, callback.prediction_bar)
            callback.training_bar = callback.prediction_bar = None
            for bar in bars:
                if bar is not None:
                    bar.close()


# callbacks whose `on_log` adds values to the logs: they must run before the reporting integrations
LOG_ENRICHING_CALLBACKS = (FusionWeightsCallback, LayerGradientNormCallback)
