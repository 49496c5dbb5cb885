"""`Seq2SeqTrainer` for hf_layerfusion models: label smoothing applied by the model's own loss.

Why a subclass: `Seq2SeqTrainer` implements `label_smoothing_factor` with its `LabelSmoother`, which pops the
labels before the forward pass and smooths the cross entropy of `outputs.logits`. For a family with several output
groups that is the wrong objective: GTrans's `logits` are the log of the psi-weighted *mixture* (Eq. 5), while its
training loss is the psi-weighted sum of the per-group cross entropies (Eq. 7), each smoothed on its own (and GTrans
raises a `ValueError` when called in training mode without labels, so the stock trainer fails loudly). Every
hf_layerfusion model applies `config.label_smoothing` itself, so this trainer moves
`args.label_smoothing_factor` into `model.config.label_smoothing` and switches the `LabelSmoother` off. For the plain
Transformer the result is the same loss as the `LabelSmoother`'s (same smoothing, same token-count reduction).
Models from outside this package keep the stock behaviour.

Weight decay: with `weight_decay > 0` (its default is 0) `Seq2SeqTrainer` decays every parameter but biases and
LayerNorm weights. This trainer also leaves out the fusion weights (`model.fusion_parameter_names()`: GTrans' gates
w^e, w^{dr} and psi logits w^{dp}, RTAL's gamma, ...) unless `model.config.decay_fusion_weights` is true: they are
scales like LayerNorm gains, and decay would pull them towards 0 (for GTrans sigma = 1/2 and uniform psi), a prior
none of the papers states.

Length-grouped batches: `train_sampling_strategy="group_by_length"` uses transformers' `LengthGroupedSampler`,
which sorts each mega-batch of 50 batches by length and then serves those 50 batches *in that order*: the model
sees a run of the longest sentences, then shorter and shorter ones. Length correlates with content (on the
built-in number corpus: millions first, small numbers last), and that non-i.i.d. order stalls learning (measured in
docs/training.md). So this trainer keeps the length grouping but visits the batches in random order (the batch with
the longest sentence still first, so that out-of-memory errors happen at once), as fairseq does.
transformers also length-groups (and shuffles) *evaluation* batches under that strategy, so `predict()` returns
translations in another order than the dataset's and they no longer line up with their references; this trainer
evaluates in dataset order.

Learning-rate schedule: fairseq's `inverse_sqrt` (Vaswani et al.; used by the papers) is
`lr * min(step / warmup, sqrt(warmup / step))`. transformers' `lr_scheduler_type="inverse_sqrt"` with
`warmup_steps=W` (and the default `timescale=W`) is exactly that: `step / W` during warm-up, then
`1 / sqrt((step + timescale - W) / timescale) = sqrt(W / step)` (tests/test_training_pipeline.py checks it step by
step), so no custom scheduler is needed. Note it needs `warmup_steps >= 1`: with no warm-up transformers falls back
to `timescale=10000`, which is not fairseq's schedule.

Resuming a finished run: transformers' training loop, resumed from a checkpoint that already holds `max_steps`
(a run stopped after saving its last checkpoint, while evaluating say), trains one step before it checks the limit,
so the run would end at `max_steps + 1` and no longer be steps-matched. This trainer takes such a checkpoint's weights
and state and trains no further step (`train`).

A run, an evaluation or a prediction that ends with an exception (an error, Ctrl-C) leaves the callbacks' progress
bars open; this trainer closes them before the exception leaves `train`, `evaluate` or `predict`
(`callbacks.close_progress_bars` says why: on Python 3.13 a bar left open crashes the process at exit).

Evaluation with `predict_with_generate`: hf_layerfusion models translate with the fast decoding loop
(`hf_layerfusion.inference.fast_decoding_loop`: the tokens of `generate()`, faster) unless
`fast_generation=False`; models from outside the package, and DeepSpeed ZeRO-3 / FSDP runs (whose `generate()`
must keep the processes in step, which the loop does not do), use `generate()`'s own loop.

PEFT: a PEFT model around an hf_layerfusion model (`peft.get_peft_model(model, LoraConfig(...))`) is trained as the
model itself is (`layerfusion_model_of`): its smoothing moved into the wrapped model's loss, its training diagnostics
logged, its fusion weights out of weight decay, its evaluation through the fast decoding loop (on the model's own
layers and adapters); resumed from a finished checkpoint, it takes the checkpoint's adapters (PEFT's `load_adapter`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.utils.data import SequentialSampler
from transformers import Seq2SeqTrainer, TrainerState
from transformers.integrations import is_deepspeed_zero3_enabled
from transformers.integrations.fsdp import is_fsdp_managed_module
from transformers.trainer_pt_utils import LengthGroupedSampler, get_length_grouped_indices
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, TrainOutput, get_last_checkpoint, has_length
from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_NAME, logging

from ..file_checks import check_write_error, refused_write
from ..inference.fast_generation import fast_decoding_loop
from ..modeling.input_checks import check_finite_number, check_switch
from ..modeling.model import LayerFusionForConditionalGeneration
from ..modeling.pretrained import LayerFusionPreTrainedModel
from .callbacks import LOG_ENRICHING_CALLBACKS, close_progress_bars

logger = logging.get_logger(__name__)

# below this spread of the cross-attention memory across source positions the memory is collapsed: the threshold lies
# between what collapsed and healthy runs reach (docs/training.md)
COLLAPSE_SPREAD = 0.05


class LayerFusionSeq2SeqTrainer(Seq2SeqTrainer):
    """`Seq2SeqTrainer` whose `label_smoothing_factor` is applied by the model's loss (see the module docstring).

    Takes `Seq2SeqTrainer`'s arguments, and `fast_generation` (default True): translate with the fast decoding loop
    in evaluation and prediction (see the module docstring). After construction, `trainer.model.config.label_smoothing` holds the
    smoothing in use (saved with the model) and `trainer.label_smoother` is `None` for hf_layerfusion models.
    Callbacks that add values to the logs (`hf_layerfusion.training.callbacks.LOG_ENRICHING_CALLBACKS`) are run before
    the reporting integrations, so that TensorBoard & co. receive those values. The training diagnostics a model
    returns (the output fields its class names in `training_diagnostics`; deep_representations: each stack's layer
    diversity D of Eq. 10, their mean, and the memory's spread across source positions) are logged as their means over the training steps since the
    previous log, and a memory spread below `COLLAPSE_SPREAD` is warned about (once per run): the encoder states
    are then nearly the same vector at every position and the decoder can no longer read the source.
    """

    def __init__(self, *args, fast_generation: bool = True, **kwargs):
        check_switch(fast_generation, "fast_generation")
        # before transformers' Trainer creates the output dir; `args` is its second parameter, after `model`
        training_args = kwargs["args"] if "args" in kwargs else args[1] if len(args) > 1 else None
        if training_args is not None:
            check_label_smoothing_factor(training_args.label_smoothing_factor)
        super().__init__(*args, **kwargs)
        self.fast_generation = fast_generation
        trained = layerfusion_model_of(self.model)
        if trained is not None:
            move_label_smoothing_to_model(trained, self.args.label_smoothing_factor)
            self.label_smoother = None
        # per training diagnostic of the model: sum and count over the training steps since the last log
        self._diagnostics: dict[str, list] = {}
        self._collapse_warned = False
        self._run_log_enriching_callbacks_first()

    def train(self, resume_from_checkpoint: str | bool | None = None, trial=None, ignore_keys_for_eval=None, **kwargs):
        """`Seq2SeqTrainer.train`, except from a checkpoint that already holds the run's last step (`max_steps`):
        there the model takes the checkpoint's weights and the trainer its state (log history, time budget), no step
        is trained, and the returned metrics say so (`train_steps` 0; see the module docstring). DeepSpeed and FSDP
        runs, whose models are sharded, always run transformers' loop."""
        checkpoint = resume_from_checkpoint
        if checkpoint is True:  # transformers' shorthand for the output dir's newest checkpoint
            checkpoint = get_last_checkpoint(self.args.output_dir)
        state = None
        if isinstance(checkpoint, (str, os.PathLike)) and not (self.is_deepspeed_enabled or self.is_fsdp_enabled):
            state = finished_checkpoint_state(checkpoint, self.args.max_steps)
        if state is None:
            with self._progress_bars_closed_on_error():
                return super().train(resume_from_checkpoint=resume_from_checkpoint, trial=trial,
                                     ignore_keys_for_eval=ignore_keys_for_eval, **kwargs)
        logger.info(f"{checkpoint} holds step {state.global_step} of max_steps={self.args.max_steps}: its weights and "
                    "state are the run's, no step is trained.")
        if isinstance(self.model, LayerFusionPreTrainedModel):
            load_checkpoint_weights(self.model, checkpoint)
        else:  # a PEFT model: the checkpoint holds its adapters, loaded by PEFT (as transformers' loop resumes them)
            self.model.load_adapter(checkpoint, self.model.active_adapter, is_trainable=True)
        self.state = state
        # no loss was computed in this call (a number here would be read as one)
        return TrainOutput(state.global_step, float("nan"), {"epoch": state.epoch, "train_steps": 0})

    def evaluate(self, *args, **kwargs):
        with self._progress_bars_closed_on_error():
            return super().evaluate(*args, **kwargs)

    def predict(self, *args, **kwargs):
        with self._progress_bars_closed_on_error():
            return super().predict(*args, **kwargs)

    @contextlib.contextmanager
    def _progress_bars_closed_on_error(self):
        try:
            yield
        except BaseException:  # an error, or Ctrl-C: no callback hears of it, and their bars would stay open
            close_progress_bars(self.callback_handler.callbacks)
            raise

    def _issue_warnings_after_load(self, load_result) -> None:
        # transformers warns about every key the checkpoint lacks, the tied ones that `save_pretrained` saves once
        # included (layer-wise coordination's shared layers: two hundred names at every resume); only keys loaded
        # through no twin are missing
        missing = untied_missing_keys(self.model, load_result.missing_keys)
        if missing:
            logger.warning(f"There were missing keys in the checkpoint model loaded: {missing}.")
        if load_result.unexpected_keys:
            logger.warning(f"There were unexpected keys in the checkpoint model loaded: {load_result.unexpected_keys}.")

    def add_callback(self, callback):
        super().add_callback(callback)
        self._run_log_enriching_callbacks_first()

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        loss, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        trained = layerfusion_model_of(self.model)
        if isinstance(outputs, dict) and model.training and isinstance(trained, LayerFusionForConditionalGeneration):
            for key in trained.training_diagnostics:
                if outputs.get(key) is not None:
                    total = self._diagnostics.setdefault(key, [0.0, 0])
                    total[0] += outputs[key].detach()
                    total[1] += 1
        return (loss, outputs) if return_outputs else loss

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        # training logs get the mean of each diagnostic over the steps since the previous log (models that return it)
        if "loss" in logs and self._diagnostics:
            logs.update({key: float(total) / steps for key, (total, steps) in self._diagnostics.items()})
            self._diagnostics = {}
            spread = logs.get("memory_spread")
            if spread is not None and spread < COLLAPSE_SPREAD and not self._collapse_warned:
                self._collapse_warned = True
                logger.warning(
                    f"memory_spread {spread:.3f} at step {self.state.global_step} (< {COLLAPSE_SPREAD}): the encoder "
                    "memory holds nearly the same vector at every source position, so the decoder cannot read the "
                    "source (a collapse). With a layer-diversity term (diversity_weight > 0; layer_diversity "
                    f"{logs.get('layer_diversity', float('nan')):.3f}, 1 at its degenerate maximum) use it only to "
                    "fine-tune a trained model, as the paper does (see hf_layerfusion.models.deep_representations)."
                )
        super().log(logs, start_time)

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None, **gen_kwargs):
        if (
            self.fast_generation
            and self.args.predict_with_generate
            and not prediction_loss_only
            and layerfusion_model_of(self.model) is not None
            and not (is_deepspeed_zero3_enabled() or is_fsdp_managed_module(self.model))
        ):
            # `Seq2SeqTrainer` falls back to the `evaluate()` / `predict()` kwargs only when none are passed
            gen_kwargs = {**(gen_kwargs or getattr(self, "_gen_kwargs", {})), "custom_generate": fast_decoding_loop()}
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys, **gen_kwargs)

    def _save_checkpoint(self, model, trial):
        # a full disk makes torch.save fail with "unexpected pos 191616 vs 191504", a file size limit with a bare
        # "[Errno 27] File too large", naming neither the reason nor a path
        run_dir = self._get_output_dir(trial=trial)
        folder = os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}")  # as transformers names it
        existed = os.path.exists(folder)
        try:
            super()._save_checkpoint(model, trial)
        except Exception as error:  # safetensors' errors are no OSError
            # a checkpoint cut short would be resumed from (`--resume_from_checkpoint last`) or averaged: the folder
            # this save created goes
            if refused_write(error) is not None and not existed:
                shutil.rmtree(folder, ignore_errors=True)
            check_write_error(error, folder, "the checkpoint", removed=not os.path.exists(folder))
            raise

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        try:
            super().save_model(output_dir, _internal_call)
        except Exception as error:  # safetensors' errors are no OSError
            if not _internal_call:  # a checkpoint's save is named by `_save_checkpoint`
                check_write_error(error, output_dir or self.args.output_dir, "the model")
            raise

    def _run_log_enriching_callbacks_first(self):
        # stable sort: the relative order within each of the two sets is kept
        self.callback_handler.callbacks.sort(key=lambda callback: not isinstance(callback, LOG_ENRICHING_CALLBACKS))

    def get_decay_parameter_names(self, model) -> list[str]:
        # fusion weights are scales like LayerNorm gains: out of weight decay unless the config asks for it
        decay = super().get_decay_parameter_names(model)
        trained = layerfusion_model_of(model)
        if trained is not None and not trained.config.decay_fusion_weights:
            # by tensor, not by name: a PEFT model names the same parameters with its own prefix
            fusion = {id(trained.get_parameter(name)) for name in trained.fusion_parameter_names()}
            parameters = dict(model.named_parameters(remove_duplicate=False))
            decay = [name for name in decay if id(parameters[name]) not in fusion]
        return decay

    def _get_train_sampler(self, train_dataset=None):
        sampler = super()._get_train_sampler(train_dataset)
        if type(sampler) is LengthGroupedSampler:
            return BatchShuffledLengthGroupedSampler(
                sampler.batch_size, lengths=sampler.lengths, generator=sampler.generator
            )
        return sampler

    def _get_eval_sampler(self, eval_dataset):
        # dataset order, whatever the training sampler (see the module docstring); distributed: accelerate shards
        # the batches and `gather_for_metrics` restores the order
        if eval_dataset is None or not has_length(eval_dataset):
            return None
        return SequentialSampler(eval_dataset) if self.args.world_size <= 1 else None

    def call_model_init(self, trial=None):
        # hyper-parameter search builds a fresh model per trial: it must get the smoothing too
        model = super().call_model_init(trial)
        trained = layerfusion_model_of(model)
        if trained is not None:
            move_label_smoothing_to_model(trained, self.args.label_smoothing_factor)
        return model


def layerfusion_model_of(model: torch.nn.Module) -> LayerFusionPreTrainedModel | None:
    """The hf_layerfusion model that `model` is, or that it wraps as a PEFT model (PEFT's public `get_base_model()`:
    the PEFT model's forward and `generate()` are the wrapped model's, its adapters inside it); else None."""
    if isinstance(model, LayerFusionPreTrainedModel):
        return model
    get_base_model = getattr(model, "get_base_model", None)
    wrapped = get_base_model() if callable(get_base_model) else None
    return wrapped if isinstance(wrapped, LayerFusionPreTrainedModel) else None


def finished_checkpoint_state(checkpoint: str | os.PathLike, max_steps: int) -> TrainerState | None:
    """`checkpoint`'s trainer state where it holds the run's last step (`global_step >= max_steps > 0`), else None
    (also for a directory without `trainer_state.json`, which transformers resumes from as it does)."""
    path = os.path.join(checkpoint, "trainer_state.json")
    if not os.path.isfile(path):
        return None
    state = TrainerState.load_from_json(path)
    return state if 0 < max_steps <= state.global_step else None


def untied_missing_keys(model: torch.nn.Module, missing_keys) -> list[str]:
    """Of the keys of `model`'s state dict that a load did not give (`missing_keys`), those whose tensor shares no
    storage with a tensor it gave: a tied tensor (saved once by `save_pretrained`) is loaded through its twin."""
    own = model.state_dict(keep_vars=True)
    missing = set(missing_keys)
    loaded = {tensor.untyped_storage().data_ptr() for key, tensor in own.items() if key not in missing}
    return sorted(key for key in missing if key not in own or own[key].untyped_storage().data_ptr() not in loaded)


def load_checkpoint_weights(model: torch.nn.Module, checkpoint: str | os.PathLike) -> None:
    """The weights `Trainer` saved in `checkpoint` (`model.safetensors`, its shards, or `pytorch_model.bin`) loaded
    into `model` in place. Every tensor of the model's state dict must come from the checkpoint, itself or through
    a tensor it shares storage with (tied embeddings and output projection, layer-wise coordination's shared
    layers, which `save_pretrained` saves once), and the checkpoint must hold nothing else: else a `ValueError`
    naming the keys, before the model is changed."""
    folder = Path(checkpoint)
    if (folder / SAFE_WEIGHTS_NAME).is_file():
        weights = load_file(folder / SAFE_WEIGHTS_NAME)
    elif (folder / SAFE_WEIGHTS_INDEX_NAME).is_file():
        shards = sorted(set(json.loads((folder / SAFE_WEIGHTS_INDEX_NAME).read_text())["weight_map"].values()))
        weights = {key: value for shard in shards for key, value in load_file(folder / shard).items()}
    elif (folder / WEIGHTS_NAME).is_file():
        weights = torch.load(folder / WEIGHTS_NAME, map_location="cpu", weights_only=True)
    else:
        raise FileNotFoundError(
            f"{folder} holds no model weights ({SAFE_WEIGHTS_NAME}, {SAFE_WEIGHTS_INDEX_NAME} or {WEIGHTS_NAME}); "
            "resume from a complete checkpoint."
        )
    own = model.state_dict(keep_vars=True)
    unexpected = sorted(set(weights) - set(own))
    reshaped = sorted(key for key in weights if key in own and weights[key].shape != own[key].shape)
    missing = untied_missing_keys(model, set(own) - set(weights))
    if unexpected or missing or reshaped:
        raise ValueError(
            f"The weights of {folder} do not fit the model: {len(missing)} of its tensors missing {missing[:5]}, "
            f"{len(unexpected)} unknown {unexpected[:5]}, {len(reshaped)} of another shape {reshaped[:5]}; resume "
            "with the model the checkpoint was saved from."
        )
    model.load_state_dict(weights, strict=False)


def check_label_smoothing_factor(label_smoothing_factor) -> None:
    """Refuse a `label_smoothing_factor` outside [0, 1) by name: torch's cross entropy treats NaN or a negative
    smoothing as none, and the config it is moved into would not load."""
    check_finite_number(label_smoothing_factor, "label_smoothing_factor")
    if not 0 <= label_smoothing_factor < 1:
        raise ValueError(f"`label_smoothing_factor` must lie in [0, 1), got {label_smoothing_factor!r}.")


def move_label_smoothing_to_model(model: LayerFusionPreTrainedModel, label_smoothing_factor: float) -> None:
    """Set `model.config.label_smoothing` from the Trainer's `label_smoothing_factor`.

    A factor of 0 leaves the model's own setting alone (the smoothing may have been configured on the model);
    a non-zero factor that contradicts a different non-zero model setting is an error rather than a silent choice.
    """
    check_label_smoothing_factor(label_smoothing_factor)
    if not label_smoothing_factor:
        return
    configured = model.config.label_smoothing
    if configured and configured != label_smoothing_factor:
        raise ValueError(
            f"`label_smoothing_factor={label_smoothing_factor}` contradicts the model's "
            f"`config.label_smoothing={configured}`; set only one of them."
        )
    model.config.label_smoothing = label_smoothing_factor


class BatchShuffledLengthGroupedSampler(LengthGroupedSampler):
    """`LengthGroupedSampler` whose batches come in random order (see the module docstring); the first batch is
    still the one holding the longest example."""

    def __iter__(self):
        indices = get_length_grouped_indices(self.lengths, self.batch_size, generator=self.generator)
        batches = [indices[start : start + self.batch_size] for start in range(0, len(indices), self.batch_size)]
        if not batches:
            return iter([])
        order = [0] + (torch.randperm(len(batches) - 1, generator=self.generator) + 1).tolist()
        return iter([index for batch in order for index in batches[batch]])
