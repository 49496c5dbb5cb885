"""Real-data benchmark and GTrans study: models ("arms") on Multi30k en->de, several seeds each, compared with their
baseline by sacreBLEU's paired bootstrap resampling.

Setting (every arm unless it overrides something): joint 8k unigram (SentencePiece-style) vocabulary trained on
train.en + train.de, shared by all arms and seeds of one `--output_dir`; the `multi30k` preset (d_model 256, 6 + 6
post-norm layers, FFN 1024, 4 heads, dropout 0.1); AdamW, lr 1e-3, no weight decay, inverse-sqrt schedule with 1000
warm-up steps, label smoothing 0.1, 64 sentences per batch grouped by length; the same training budget per run
(`--minutes_per_model` of wall clock and/or `--max_steps_per_model` steps: steps-matched); then beam-4 sacreBLEU on
`val` and `test_2016_flickr`. `--seeds 1 2 3` trains every arm once per seed (the seed sets the initialisation and
the batch order). Arms (`--list_models` prints them with the question each one asks) are the plain Transformer,
GTrans (T_e = 3, T_d = 2) and its variants for the study of docs/gtrans_study.md, deeper shapes, and the other
families (in their papers' settings, and the package's earlier ones). Each arm names its baseline (the plain
Transformer of the same shape and training options); baselines of the requested arms are trained too.

Fine-tuning arms (`Arm.init_from`, deep representations' recipe: the paper starts from a trained model; issue 38's
`gtrans_finetuned`, `rtal_finetuned` and `layerwise_coordination_finetuned` apply it to the other families) start from
another arm's finished run of the same seed in the same `--output_dir` (trained first when it is missing, with the
same budget): `run_translation.py --model_name_or_path <that run dir> --model_type <family>` with the arm's config
overrides, a fresh optimizer and learning-rate schedule (warm-up included), then the same budget again (with the
study's 2,000 steps: 2,000 + 2,000). Their baseline is the starting run trained as long again the same way
(`plain_transformer_continued`), so that only the change of model differs. The ledger entry of such a run records
what it started from (`init_from`: arm, seed, steps, BLEU and directory of the starting run).

Trained to convergence (issue 76: `--max_epochs_per_model 30 --early_stopping_patience 3`, the budget of the arms
with `Arm.converged`, which `study/queue.py` passes them): val BLEU is evaluated at the end of every epoch (beam
as `--num_beams`) and training stops once it has not improved for `--early_stopping_patience` evaluations, or after
`--max_epochs_per_model` epochs (transformers' `EarlyStoppingCallback`, `load_best_model_at_end` on the metric
`bleu`); the val-best checkpoint becomes the run's model, whose val and test BLEU are the run's, and the average of
the last `AVERAGED_CHECKPOINTS` checkpoints (GTrans' multilingual recipe) is saved in `<run dir>/averaged` and scored
on val and test beside it. The learning rate and its warm-up stay the study's (peak 1e-3, inverse-sqrt decay after
`--warmup_steps`, 1,000 steps for the 6 + 6 arms): only the budget differs from the 2,000-step runs. A checkpoint is
saved with every evaluation, so a stopped run resumes at the end of its last epoch with its count of evaluations
without a better BLEU.

Selection and significance: arms are compared on the validation set (`val BLEU`, for choosing a setting) and
reported on the test set; for every seed s the arm's test translations are compared with the baseline's seed-s
translations by sacreBLEU's paired bootstrap resampling (`sacrebleu.significance.PairedTest`, test_type "bs",
1000 resamples, two-sided p-value of the BLEU difference, sacreBLEU's fixed resampling seed; p = 1 where the two
systems' sentences score alike, `common.tested_pair`). The table gives mean
± standard deviation over seeds, the mean test difference to the baseline, and the p-value of each seed.
GTrans (the `gtrans` arm) is also evaluated as in its Table VI: each decoder group alone, and groups k..N mixed.

Everything lands in `--output_dir`: `results.json` (every run, the summary and the p-values), one training dir per
arm and seed (`<arm>/seed_<s>/`, with `generated_predictions_{validation,test}.txt`), `settings.json`.

Resumable: training checkpoints every 500 steps (every epoch trained to convergence) and the time already spent
travels with them, so re-running the
same command after an interruption continues where it stopped (finished runs and evaluations are not redone). An
output dir remembers the settings that change results (budget, schedule, vocabulary, evaluation sets, beam) and
refuses to be continued with other ones.

    python -m study.bench_multi30k                                  # plain vs GTrans, 35 min each, seed 1
    python -m study.bench_multi30k --list_models                    # the arms of the study
    # steps-matched study arms, 3 seeds (see study/README.md for the whole study and its cost)
    python -m study.bench_multi30k --models gtrans gtrans_init_w1 --seeds 1 2 3 --max_steps_per_model 2000 \\
        --output_dir runs/gtrans_study
    # end-to-end smoke run (tiny budget and evaluation sets; its BLEU means nothing)
    python -m study.bench_multi30k --models plain_transformer gtrans --seeds 1 2 --max_steps_per_model 30 \\
        --warmup_steps 10 --max_eval_samples 50 --max_predict_samples 50 --max_new_tokens 24 --output_dir /tmp/smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from transformers.trainer import TRAINER_STATE_NAME
from transformers.trainer_utils import sort_checkpoints

import hf_layerfusion
from hf_layerfusion.cli.run_translation import PREDICTIONS_FILE, RESULTS_FILE
from hf_layerfusion.cli.run_translation import main as run_translation
from hf_layerfusion.modeling.presets import BACKBONE_PRESETS
from hf_layerfusion.models.rtal import RTAL_PAPER_SETTING
from hf_layerfusion.training.checkpoint_averaging import (
    AVERAGE_RECORD,
    average_last_checkpoints,
)
from hf_layerfusion.training.data import load_parallel_text
from hf_layerfusion.training.tokenization import train_joint_tokenizer
from hf_layerfusion.translation.bleu import corpus_bleu
from hf_layerfusion.translation.translate import translate
from study import bench_multilingual, queue
from study import multi30k_ledger as ledger
from study.common import (
    BOOTSTRAP_SAMPLES,
    DEFAULT_DATA,
    GTRANS,
    REPO_ROOT,
    SOURCE_LANG,
    TARGET_LANG,
    TRAINING_OPTIONS,
    format_value,
    paired_bootstrap,
    positive_int,
    reproduction_command,
)
from study.training_time import seconds_trained_before, trained_seconds

BASE_ARM = "plain_transformer"
DEFAULT_MINUTES = 35.0
SIGNIFICANCE_LEVEL = 0.05


@dataclass(frozen=True)
class Arm:
    """One model of the study: a family, its config overrides (on top of the `multi30k` preset), its training-option
    overrides (on top of `TRAINING_OPTIONS`), the arm it is compared with, and the question it answers."""

    model_type: str
    question: str
    config: dict = field(default_factory=dict)
    training: dict = field(default_factory=dict)
    baseline: str | None = BASE_ARM
    show_loss_curve: bool = False  # the report prints its training loss (does it train at all?)
    init_from: str | None = None  # fine-tune this arm's finished run of the same seed (see the module docstring)
    decoder_group_table: bool = True  # a GTrans arm's ledger entry holds Table VI (2N - 1 more passes over test)
    # trained to convergence: the arm takes the converged budget (--max_epochs_per_model, --early_stopping_patience)
    # and no other, so that the ledger holds one budget per arm
    converged: bool = False


SHAPE_12X6 = dict(encoder_layers=12, decoder_layers=6)  # the OPUS-100 shape (12-layer encoder)
# post-norm depths of the study's priority 2 (study/queue.py DEEP_SHAPES); paper Table VIII: at 24 + 18 the
# model without fusion "failed to train"
DEEP_POST_NORM_SHAPES = ((12, 12), (18, 12), (24, 18))
# Table VI for at most 6 decoder groups (11 beam passes over test): 24 + 18's 9 groups take 17, longer than its
# training where 5 runs share a GPU, and a depth arm asks whether the model trains at all, which its test BLEU and loss
# curve answer
TABLE_VI_MAX_GROUPS = 6
WEIGHT_DECAY = {"weight_decay": 0.1}  # AdamW decoupled decay; 0.1 shrinks an undriven weight by ~20% in 2k steps
EMBED_INIT = {"embedding_init": "rsqrt_d_model"}  # fairseq / THUMT: embeddings N(0, d^-1/2) instead of N(0, 0.02)
NO_LABEL_SMOOTHING = {"label_smoothing_factor": 0.0}
PRE_NORM = {"normalize_before": True}
HIERARCHICAL = {"encoder_aggregation": "hierarchical", "decoder_aggregation": "hierarchical"}

MODELS: dict[str, Arm] = {
    "plain_transformer": Arm("plain_transformer", "baseline (the backbone, fusion off)", baseline=None),
    "gtrans": Arm("gtrans", "GTrans as published: T_e = 3, T_d = 2, w = 0, tau = sqrt(d)", GTRANS),
    # --- the choices of docs/gtrans_study.md
    "gtrans_init_w1": Arm(
        "gtrans", "initial fusion weights: w = 1 (sigma = 0.73) instead of 0 (sigma = 1/2)",
        {**GTRANS, "fusion_weight_init": 1.0},
    ),
    "gtrans_tau1": Arm(
        "gtrans", "tau of Eq. 6 = 1 instead of sqrt(d) = 16 (with Adam: a 16x larger learning rate for psi)",
        {**GTRANS, "probability_temperature": 1.0},
    ),
    "gtrans_fused_dropout": Arm(
        "gtrans", "dropout 0.1 on the fused memory and on every decoder group feature (none by default)",
        {**GTRANS, "fused_state_dropout": 0.1},
    ),
    "plain_transformer_ls0": Arm("plain_transformer", "baseline without label smoothing", training=NO_LABEL_SMOOTHING,
                                 baseline=None),
    "plain_transformer_prenorm": Arm("plain_transformer", "baseline, pre-norm (RTAL's tensor2tensor setting)",
                                     PRE_NORM, baseline=None),
    "plain_transformer_continued": Arm(
        "plain_transformer",
        "baseline of the fine-tuning arms: plain_transformer's finished run trained as many steps again",
        baseline=None, init_from="plain_transformer",
    ),
    "gtrans_ls0": Arm(
        "gtrans", "label smoothing: none (per-group smoothing inside Eq. 7 is the default)", GTRANS,
        NO_LABEL_SMOOTHING, baseline="plain_transformer_ls0",
    ),
    "plain_transformer_wd": Arm("plain_transformer", "baseline with weight decay 0.1", training=WEIGHT_DECAY,
                                baseline=None),
    "gtrans_wd": Arm(
        "gtrans", "weight decay 0.1 on the network, fusion weights not decayed (the default)", GTRANS, WEIGHT_DECAY,
        baseline="plain_transformer_wd",
    ),
    "gtrans_wd_decay_fusion": Arm(
        "gtrans", "weight decay 0.1 on the fusion weights too (decay_fusion_weights=True)",
        {**GTRANS, "decay_fusion_weights": True}, WEIGHT_DECAY, baseline="plain_transformer_wd",
    ),
    "plain_transformer_embed_init": Arm(
        "plain_transformer", "baseline with embeddings N(0, d^-1/2) (fairseq / THUMT) instead of N(0, 0.02)",
        EMBED_INIT, baseline=None,
    ),
    "gtrans_embed_init": Arm(
        "gtrans", "GTrans with embeddings N(0, d^-1/2) (fairseq / THUMT) instead of N(0, 0.02)",
        {**GTRANS, **EMBED_INIT}, baseline="plain_transformer_embed_init",
    ),
    # --- depth (the paper's gains grow with depth)
    "plain_transformer_12x6": Arm("plain_transformer", "baseline, 12-layer encoder", SHAPE_12X6, baseline=None),
    "gtrans_12x6": Arm(
        "gtrans", "12-layer encoder (OPUS-100 shape)", {**SHAPE_12X6, **GTRANS}, baseline="plain_transformer_12x6"
    ),
}


# the suffix of the depth arms of issue 38 (study/queue.py runs them for 2,000 steps, warm-up 400): the
# 1,000-step pair of priority 2 keeps its arm names, so that its ledger entries stay one budget per arm
LONG_DEPTH_SUFFIX = "_2000steps"


def deep_post_norm_arms(encoder_layers: int, decoder_layers: int, suffix: str = "") -> dict[str, Arm]:
    """The plain model and GTrans at one post-norm depth of the study's priority 2 (loss curves in the report);
    `suffix` names the arms of another budget."""
    shape = dict(encoder_layers=encoder_layers, decoder_layers=decoder_layers)
    plain = f"plain_transformer_{encoder_layers}x{decoder_layers}{suffix}"
    return {
        plain: Arm("plain_transformer", f"baseline, deep post-norm {encoder_layers} + {decoder_layers} layers", shape,
                   baseline=None, show_loss_curve=True),
        f"gtrans_{encoder_layers}x{decoder_layers}{suffix}": Arm(
            "gtrans", f"deep post-norm {encoder_layers} + {decoder_layers} layers (paper Table VIII: without fusion "
            "24 + 18 fails)", {**shape, **GTRANS}, baseline=plain, show_loss_curve=True,
            decoder_group_table=decoder_layers // GTRANS["decoder_group_size"] <= TABLE_VI_MAX_GROUPS,
        ),
    }


for depth in DEEP_POST_NORM_SHAPES:
    MODELS.update(deep_post_norm_arms(*depth))
    MODELS.update(deep_post_norm_arms(*depth, suffix=LONG_DEPTH_SUFFIX))

# the other families, with the settings their papers recommend (and the package's earlier Multi30k settings), once
# they are part of the package
FAMILY_ARMS = {
    "rtal_paper": Arm(
        "rtal", "RTAL as the paper ran it: EWP + FFN nodes, children residual, pre-norm, trees over both stacks",
        RTAL_PAPER_SETTING, baseline="plain_transformer_prenorm",
    ),
    "rtal": Arm("rtal", "RTAL, concat + FFN nodes, block_input residual, post-norm (not the paper's setting; the "
                        "README's earlier 1,000-step runs)", {"aggregation_function": "concat_ffn"}),
    "deep_representations_paper": Arm(
        "deep_representations",
        "deep representations as the paper trains them: hierarchical aggregation + layer diversity lambda = 1, "
        "fine-tuned from plain_transformer's finished run",
        {**HIERARCHICAL, "diversity_weight": 1.0}, baseline="plain_transformer_continued",
        init_from="plain_transformer",
    ),
    # fusion added to a trained model, for the other families (issue 38): their papers train from scratch and give
    # no fine-tuning recipe, so each takes deep_representations_paper's (the only paper that fine-tunes): the plain
    # run's weights load as the family's class (run_translation.py --model_name_or_path --model_type), the weights
    # the plain model lacks start fresh at the family's initialisation, then a fresh AdamW at the study's peak
    # learning rate 1e-3 with the inverse-sqrt schedule and its warm-up (1,000 steps in the study) for 2,000 more
    # steps: exactly what the baseline plain_transformer_continued does, so only the change of model differs
    "gtrans_finetuned": Arm(
        "gtrans",
        "GTrans (T_e = 3, T_d = 2) added to plain_transformer's finished run and fine-tuned; fresh: the encoder's "
        "group fusion weights and LayerNorm, the decoder's group and layer weights (w = 0, as from scratch)",
        GTRANS, baseline="plain_transformer_continued", init_from="plain_transformer",
    ),
    "rtal_finetuned": Arm(
        "rtal",
        "RTAL added to plain_transformer's finished run and fine-tuned: the paper's nodes (EWP + FFN, children "
        "residual, trees over both stacks) but post-norm like the checkpoint (the paper's pre-norm would change "
        "every trained layer's function); fresh: the tree nodes",
        {**RTAL_PAPER_SETTING, "normalize_before": False}, baseline="plain_transformer_continued",
        init_from="plain_transformer",
    ),
    # the paper's layout cannot hold a plain checkpoint: it shares encoder layer i's parameters with decoder layer
    # i (a plain model has two stacks of its own) and replaces the decoder's self- and cross-attention by one mixed
    # attention; without both (the paper's Table 3 ablations) its coordination, decoder layer i reading encoder
    # layer i's input, and its language embeddings remain, and the plain weights all load
    "layerwise_coordination_finetuned": Arm(
        "layerwise_coordination",
        "layer-wise coordination added to plain_transformer's finished run and fine-tuned, in the layout a plain "
        "checkpoint fits (no parameter sharing, no mixed attention: the paper's Table 3 ablations): decoder layer i "
        "attends to encoder layer i's input; fresh: the source / target language embeddings",
        {"share_layer_parameters": False, "mixed_attention": False, "unshared_cross_attention": True,
         "layerwise_memory": True, "language_embeddings": True},
        baseline="plain_transformer_continued", init_from="plain_transformer",
    ),
    "deep_representations": Arm(
        "deep_representations",
        "deep representations: hierarchical aggregation + layer diversity lambda = 1 from scratch (not the paper's "
        "recipe: collapses)",
        {**HIERARCHICAL, "diversity_weight": 1.0},
    ),
    "deep_representations_no_diversity": Arm(
        "deep_representations",
        "deep representations: hierarchical aggregation alone, from scratch (lambda = 0, the default)",
        {**HIERARCHICAL, "diversity_weight": 0.0},
    ),
    "layerwise_coordination": Arm("layerwise_coordination", "layer-wise coordination (defaults)"),
    "layerwise_coordination_14": Arm(
        "layerwise_coordination",
        "layer-wise coordination as in the paper: 14 shared layers, parameter-matched to the 6 + 6 plain model "
        "(Sec. 4.2), SOS start token",
        {"encoder_layers": 14, "decoder_layers": 14},
    ),
    "re_transformer_2": Arm("re_transformer", "Re-Transformer-2 (encoder s-sf-s-sf-s-sf, 2 decoder layers)",
                            {"encoder_layout": "s-sf-s-sf-s-sf", "encoder_layers": None, "decoder_layers": 2}),
    "re_transformer_4": Arm("re_transformer", "Re-Transformer-4 (encoder s-sf-s-sf-s-sf, 4 decoder layers)",
                            {"encoder_layout": "s-sf-s-sf-s-sf", "encoder_layers": None, "decoder_layers": 4}),
}
MODELS.update({name: arm for name, arm in FAMILY_ARMS.items() if arm.model_type in hf_layerfusion.FAMILIES})
# a registered family without an arm of its own gets one with its config's defaults (the registry is the family list)
MODELS.update({
    model_type: Arm(model_type, f"{model_type} with its config's defaults")
    for model_type in hf_layerfusion.FAMILIES
    if model_type not in {arm.model_type for arm in MODELS.values()}
})

# --- issue 76: do the verdicts hold trained to convergence, and against deep baselines that train?
# (study/queue.py's priority 9)
# The arms trained to convergence: each is the arm of its name without the suffix under the converged budget (see the
# module docstring), compared with its baseline's converged run; a fine-tuning arm starts from its starting arm's
# converged run. plain_transformer_continued_converged (the converged plain run trained on until early stopping
# again, the same way) is the baseline of deep representations' recipe, as plain_transformer_continued at 2,000 steps.
CONVERGED_SUFFIX = "_converged"
CONVERGED_FROM = ("plain_transformer", "gtrans", "layerwise_coordination_14", "plain_transformer_prenorm", "rtal_paper",
                  "re_transformer_2", "plain_transformer_continued", "deep_representations_paper")
AVERAGED_CHECKPOINTS = 5  # averaged beside the val-best checkpoint (GTrans' multilingual recipe, fairseq's script)
AVERAGED_DIR = "averaged"  # in the run dir: the average and its val and test translations


def converged_arm(name: str) -> Arm:
    """Arm `name` trained to convergence, against (and starting from) its baseline's (starting arm's) converged run."""
    arm = MODELS[name]

    def converged(other: str | None) -> str | None:
        return None if other is None else other + CONVERGED_SUFFIX

    start = "" if arm.init_from is None else f" (fine-tuning {converged(arm.init_from)}'s run)"
    return replace(arm, question=f"{arm.question}; trained to convergence{start}", baseline=converged(arm.baseline),
                   init_from=converged(arm.init_from), converged=True)


# the arm of the same comparison at the step budget, for each arm trained to convergence (the report's side by side)
STEP_BUDGET_ARMS = {name + CONVERGED_SUFFIX: name for name in CONVERGED_FROM if name in MODELS}
MODELS.update({converged: converged_arm(name) for converged, name in STEP_BUDGET_ARMS.items()})

# Deep baselines that train. Pre-norm at depth, with the post-norm depth arms' recipe (2,000 steps, warm-up 400: the
# study passes it): GTrans Table III's pre-norm 12 + 12 baseline trains (34.88 BLEU on IWSLT14 De-En)
PRE_NORM_DEEP_SHAPES = ((12, 12), (24, 18))
# issue 76's deep baselines that train, per shape: until one of a shape has run, the depth conclusion has no data for
# "does GTrans beat a deep baseline that trains?" at that shape
TRAINING_DEEP_BASELINES: dict[tuple[int, int], list[str]] = {}
for encoder_layers, decoder_layers in PRE_NORM_DEEP_SHAPES:
    name = f"plain_transformer_prenorm_{encoder_layers}x{decoder_layers}{LONG_DEPTH_SUFFIX}"
    TRAINING_DEEP_BASELINES[(encoder_layers, decoder_layers)] = [name]
    MODELS[name] = Arm(
        "plain_transformer", f"baseline, deep pre-norm {encoder_layers} + {decoder_layers} layers (a deep baseline "
        "that trains: GTrans Table III's pre-norm baseline)",
        dict(encoder_layers=encoder_layers, decoder_layers=decoder_layers, **PRE_NORM), baseline=None,
        show_loss_curve=True,
    )
# Post-norm 12 + 12 with the papers' warm-up (4,000 steps; GTrans: 4,000-8,000, Table III's post-norm 12 + 12
# baseline trains to 35.12 BLEU) at the study's peak learning rate 1e-3, and GTrans 12 + 12 under the same schedule.
# Their budget is the converged one: 2,000 steps would end inside the warm-up at half the peak rate, and early stopping
# on val lets the model train as long as val BLEU improves (up to 30 epochs, ~13,600 steps: 9 epochs of warm-up and
# 21 after the peak) and reports its val-best checkpoint, so a model that trains and then diverges at the peak rate is
# reported at its best, as the papers select theirs (one whose val BLEU stalls for 3 epochs inside the warm-up stops
# there, before the peak rate: its entry's epoch curve shows it). study/queue.py passes --warmup_steps 4000.
WARMUP_4000_SUFFIX = "_warmup4000"
for name, arm in deep_post_norm_arms(12, 12, suffix=WARMUP_4000_SUFFIX).items():
    MODELS[name] = replace(arm, question=f"{arm.question}; warm-up 4,000 steps, trained to convergence",
                           converged=True)
    STEP_BUDGET_ARMS[name] = name.removesuffix(WARMUP_4000_SUFFIX) + LONG_DEPTH_SUFFIX
    if arm.model_type == BASE_ARM:
        TRAINING_DEEP_BASELINES[(12, 12)].append(name)

# settings that change the numbers of a run: an output dir is only continued with the same ones
RESULT_SETTINGS = (
    "data_dir", "minutes_per_model", "max_steps_per_model", "warmup_steps", "vocab_size", "max_eval_samples",
    "max_predict_samples", "num_beams", "max_new_tokens", "max_epochs_per_model", "early_stopping_patience",
)


def run_dir(args, arm_name: str, seed: int) -> Path:
    return args.output_dir / arm_name / f"seed_{seed}"


def run_translation_command(arm_name: str, seed: int, args, tokenizer_dir: Path) -> list[str]:
    """`examples/run_translation.py`'s arguments for one run of an arm."""
    arm = MODELS[arm_name]
    options = {**TRAINING_OPTIONS, **arm.training}
    if arm.init_from is None:
        model = [f"--model_type={arm.model_type}", "--preset=multi30k"]
    else:  # the starting run's model, read as this arm's family
        model = [f"--model_name_or_path={starting_run_dir(args, arm_name, seed)}", f"--model_type={arm.model_type}"]
    command = [
        f"--dataset_name={args.data_dir}",
        f"--source_lang={SOURCE_LANG}",
        f"--target_lang={TARGET_LANG}",
        *model,
        f"--tokenizer_name={tokenizer_dir}",
        f"--output_dir={run_dir(args, arm_name, seed)}",
        "--do_train",
        "--do_eval",
        "--do_predict",
        "--resume_from_checkpoint=last",
        "--overwrite_output_dir=True",  # without a checkpoint the run starts over in its own dir
        *budget_options(arm, args),
        *(f"--{key}={value}" for key, value in options.items()),
        f"--warmup_steps={args.warmup_steps}",
        f"--num_beams={args.num_beams}",
        "--logging_steps=50",  # the loss curve of the ledger
        "--include_num_input_tokens_seen=true",  # padded source tokens ("non_padding" is not settable from the CLI)
        "--disable_tqdm=True",
        f"--dataloader_pin_memory={torch.cuda.is_available()}",
        f"--seed={seed}",
    ]
    if args.minutes_per_model is not None:
        command.append(f"--max_train_minutes={args.minutes_per_model}")
    if arm.config:
        command.append("--config_overrides=" + ",".join(f"{k}={format_value(v)}" for k, v in arm.config.items()))
    return command + evaluation_limits(args)


def budget_options(arm: Arm, args) -> list[str]:
    """run_translation.py's options of a run's budget: its steps (or the time budget's), a checkpoint every 500 steps;
    or, for an arm trained to convergence, the converged budget (see the module docstring)."""
    if not arm.converged:
        # without a step cap the time budget ends training
        return [f"--max_steps={args.max_steps_per_model or 1_000_000}", "--save_steps=500", "--save_total_limit=2"]
    return [
        f"--num_train_epochs={args.max_epochs_per_model}",
        # a checkpoint with every evaluation: the best one becomes the model, a stopped run resumes at an epoch's end
        "--eval_strategy=epoch",
        "--save_strategy=epoch",
        "--load_best_model_at_end=True",
        "--metric_for_best_model=bleu",
        "--greater_is_better=True",
        f"--early_stopping_patience={args.early_stopping_patience}",
        # a resumed run keeps its count of evaluations without a better BLEU (transformers restores it from the state)
        "--restore_callback_states_from_checkpoint=True",
        # the last checkpoints to average, and the best one, which the Trainer keeps whatever its age
        f"--save_total_limit={AVERAGED_CHECKPOINTS + 1}",
    ]


def evaluation_limits(args) -> list[str]:
    """The options that cut the evaluation sets and translations short (smoke runs)."""
    return [f"--{option}={getattr(args, option)}" for option in ("max_eval_samples", "max_predict_samples",
                                                                  "max_new_tokens") if getattr(args, option)]


def evaluation_command(args, model_dir: Path) -> list[str]:
    """run_translation.py's arguments that translate and score val and test with the model saved in `model_dir`, as a
    run's own evaluation does, writing the results beside it."""
    return [
        f"--dataset_name={args.data_dir}",
        f"--source_lang={SOURCE_LANG}",
        f"--target_lang={TARGET_LANG}",
        f"--model_name_or_path={model_dir}",
        f"--output_dir={model_dir}",
        "--do_eval",
        "--do_predict",
        f"--num_beams={args.num_beams}",
        f"--per_device_eval_batch_size={TRAINING_OPTIONS['per_device_eval_batch_size']}",
        "--disable_tqdm=True",
        f"--dataloader_pin_memory={torch.cuda.is_available()}",
        *evaluation_limits(args),
    ]


def evaluated(args, model_dir: Path) -> dict:
    """run_translation.py's val and test results of the model in `model_dir`: those its evaluation wrote there (its
    results file, written last), else a new evaluation's; the translations of one a stop cut short are removed first
    (an evaluation replaces no file in the model dir it reads)."""
    results_file = model_dir / RESULTS_FILE
    if results_file.is_file():
        return json.loads(results_file.read_text())
    for split in ("validation", "test"):
        (model_dir / PREDICTIONS_FILE.format(split)).unlink(missing_ok=True)
    return run_translation(evaluation_command(args, model_dir))


def averaged_checkpoints(args, output_dir: Path) -> dict:
    """The average of the run's last `AVERAGED_CHECKPOINTS` checkpoints (as many as it saved, where fewer), saved in
    `<output_dir>/AVERAGED_DIR` and scored on val and test like the run's model: `{"checkpoints": their names,
    "validation": ..., "test": ...}`. Averaged again after a stop before its evaluation finished."""
    averaged_dir = output_dir / AVERAGED_DIR
    if not (averaged_dir / RESULTS_FILE).is_file():
        count = min(AVERAGED_CHECKPOINTS, len(sort_checkpoints(str(output_dir))))
        average_last_checkpoints(output_dir, count, averaged_dir, overwrite=True)
    results = evaluated(args, averaged_dir)
    return {"checkpoints": json.loads((averaged_dir / AVERAGE_RECORD).read_text())["averaged"],
            **{split: results[split] for split in ("validation", "test")}}


def train_and_evaluate(arm_name: str, seed: int, args, tokenizer_dir: Path) -> dict:
    """Train one arm with one seed (or resume it), translate val and test; returns run_translation's results plus
    whole-run training statistics, cached in `<run dir>/bench_results.json`. A fine-tuning arm's starting run is
    trained first when it has not finished."""
    output_dir = run_dir(args, arm_name, seed)
    finished = output_dir / "bench_results.json"
    if finished.is_file():
        return json.loads(finished.read_text())
    arm = MODELS[arm_name]
    if arm.init_from is not None:
        train_and_evaluate(arm.init_from, seed, args, tokenizer_dir)
    started = time.monotonic()
    if arm.converged and (output_dir / TRAINER_STATE_NAME).is_file():
        # trained to convergence (the state is saved once training ends) before a stop cut its evaluation short:
        # resuming its last checkpoint would train another epoch, so the best model saved there is only evaluated
        seconds_before = trained_seconds(output_dir)
        results = evaluated(args, output_dir)
    else:
        seconds_before = seconds_trained_before(output_dir)
        results = run_translation(run_translation_command(arm_name, seed, args, tokenizer_dir))
    if arm.converged:
        results["averaged_checkpoints"] = averaged_checkpoints(args, output_dir)
    session_minutes = (time.monotonic() - started) / 60
    # whole-run training statistics (a resumed run's own metrics only cover its last session)
    state = json.loads((output_dir / TRAINER_STATE_NAME).read_text())
    seconds = trained_seconds(output_dir)
    results["train"] = {
        "global_step": state["global_step"],
        "train_minutes": seconds / 60,
        "source_tokens_per_second": state["num_input_tokens_seen"] / seconds,
        # this session's time but its training: the final translations of val and test (and the average's)
        "evaluation_minutes": session_minutes - (seconds - seconds_before) / 60,
    }
    finished.write_text(json.dumps(results, indent=2) + "\n")
    return results


def hypotheses(args, arm_name: str, seed: int, split: str) -> list[str]:
    return translations(run_dir(args, arm_name, seed), split)


def translations(model_dir: Path, split: str) -> list[str]:
    """The translations of `split` that run_translation.py wrote beside the model in `model_dir`."""
    return (model_dir / PREDICTIONS_FILE.format(split)).read_text(encoding="utf-8").splitlines()


def decoder_group_table(model_dir: Path, test_pairs: list[dict]) -> list[dict]:
    """GTrans Table VI on the test set: BLEU of each decoder group alone and of the mixture of groups k..N."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    table_file = model_dir / "gtrans_decoder_groups.json"
    table = json.loads(table_file.read_text()) if table_file.is_file() else {}
    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir)
    if torch.cuda.is_available():
        # where val and test were translated: on a GPU machine the CPU has one thread per run, and the 2N - 1
        # passes over test took longer there than training (GTrans 12 + 12: ~45 s per pass at 6 runs at once)
        model.to("cuda")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    num_groups = model.config.num_decoder_groups
    sources = [pair[SOURCE_LANG] for pair in test_pairs]
    references = [pair[TARGET_LANG] for pair in test_pairs]
    # "k" is group k alone, "k..N" the mixture of groups k..N; the last group alone is also "N..N", decoded once
    runs = {f"{k}": [k] for k in range(1, num_groups + 1)}
    runs.update({f"{k}..{num_groups}": list(range(k, num_groups + 1)) for k in range(1, num_groups)})
    for name, groups in runs.items():
        if name not in table:
            translations = translate(model, tokenizer, sources, batch_size=64, decoder_groups=groups, progress=True)
            table[name] = corpus_bleu(translations, references)[0]
            table_file.write_text(json.dumps(table, indent=2) + "\n")  # resumable, one entry at a time
    table[f"{num_groups}..{num_groups}"] = table[f"{num_groups}"]
    psi = model.model.decoder.readout.fusion_weights()["decoder_group_psi"].tolist()  # Table VI's "Weight" row
    return [
        {"k": k, "alone": table[f"{k}"], "mixed": table[f"{k}..{num_groups}"], "psi": psi[k - 1]}
        for k in range(1, num_groups + 1)
    ]


def ledger_entry(args, arm_name: str, seed: int, results: dict, tokenizer_dir: Path, references: dict,
                 table_vi: list[dict] | None) -> dict:
    """The ledger's record of one finished run (see study/multi30k_ledger.py)."""
    arm = MODELS[arm_name]
    directory = run_dir(args, arm_name, seed)
    state = json.loads((directory / "trainer_state.json").read_text())
    train = results["train"]
    return {
        "arm": arm_name,
        "family": arm.model_type,
        "question": arm.question,
        "baseline": arm.baseline,
        "show_loss_curve": arm.show_loss_curve,
        "arm_config": arm.config,
        "config": json.loads((directory / "config.json").read_text()),
        "training": {**TRAINING_OPTIONS, **arm.training, "warmup_steps": args.warmup_steps,
                     "max_steps": args.max_steps_per_model, "max_train_minutes": args.minutes_per_model,
                     "max_epochs": args.max_epochs_per_model, "early_stopping_patience": args.early_stopping_patience,
                     "vocab_size": args.vocab_size, "num_beams": args.num_beams},
        "seed": seed,
        "steps": train["global_step"],
        "train_minutes": train["train_minutes"],
        "source_tokens_per_second": train["source_tokens_per_second"],
        # None for a run dir that finished before its evaluation time was recorded
        "evaluation_minutes": train.get("evaluation_minutes"),
        **ledger.code_revision(REPO_ROOT),
        "device": ledger.device_description(),
        "runs_at_once": args.runs_at_once,
        "finished_at": ledger.now(),
        "tokenizer_sha256": ledger.file_sha256(tokenizer_dir / "tokenizer.json"),
        "test_references_sha256": ledger.sha256_lines(references["test"]),
        "validation_references_sha256": ledger.sha256_lines(references["validation"]),
        # the val translations, so that the report tests val as it tests test (a verdict on each)
        **{split: scored(results[split], references[split], translations(directory, split))
           for split in ("validation", "test")},
        "loss_curve": ledger.loss_curve(state),
        "gtrans_decoder_groups": table_vi,
        "init_from": None if arm.init_from is None else starting_run(args, arm_name, seed),
        **(converged_record(results["averaged_checkpoints"], state, references, directory / AVERAGED_DIR)
           if arm.converged else {}),
    }


def scored(result: dict, references: list[str], hypotheses: list[str]) -> dict:
    """A ledger entry's record of a model's translations of one split: BLEU, signature, and the translations."""
    return {"bleu": result["bleu"], "signature": result["signature"], "sentences": len(references),
            "hypotheses": hypotheses}


def converged_record(averaged: dict, state: dict, references: dict, averaged_dir: Path) -> dict:
    """What an entry trained to convergence adds (see study/multi30k_ledger.py): the val BLEU of every epoch, its
    val-best checkpoint, and its last checkpoints' average scored on val and test (`averaged`, from
    `averaged_checkpoints`)."""
    return {
        "epoch_curve": ledger.epoch_curve(state),
        "best_checkpoint": ledger.best_checkpoint(state),
        "averaged_checkpoints": {
            "checkpoints": averaged["checkpoints"],
            **{split: scored(averaged[split], references[split], translations(averaged_dir, split))
               for split in ("validation", "test")},
        },
    }


def starting_run_dir(args, arm_name: str, seed: int) -> Path:
    """The run the fine-tuning arm `arm_name` of `seed` starts from: its `init_from` arm's run of the same seed in this
    output dir. The one place that says so: the run's command trains from it and its ledger entry records it."""
    return run_dir(args, MODELS[arm_name].init_from, seed)


def starting_run(args, arm_name: str, seed: int) -> dict:
    """What the fine-tuning run of `arm_name` and `seed` started from (its ledger entry's `init_from`): the finished
    run in `starting_run_dir`."""
    return ledger.starting_run_record(starting_run_dir(args, arm_name, seed), MODELS[arm_name].init_from, seed)


def mean_std(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None}


def format_mean_std(stats: dict) -> str:
    std = "   –" if stats["std"] is None else f"{stats['std']:4.2f}"
    return f"{stats['mean']:6.2f} ± {std}"


def summarise(args, runs: dict, references: dict) -> dict:
    """Per arm: mean ± std over seeds of val/test BLEU and training statistics; per seed: paired bootstrap of the
    test translations against the baseline's of the same seed."""
    summary = {}
    for arm_name, by_seed in runs.items():
        seeds = sorted(by_seed)
        entry = {
            "model_type": MODELS[arm_name].model_type,
            "config": MODELS[arm_name].config,
            "training": MODELS[arm_name].training,
            "baseline": MODELS[arm_name].baseline,
            "init_from": MODELS[arm_name].init_from,
            "seeds": seeds,
            "val_bleu": mean_std([by_seed[s]["validation"]["bleu"] for s in seeds]),
            "test_bleu": mean_std([by_seed[s]["test"]["bleu"] for s in seeds]),
            "steps": statistics.fmean(by_seed[s]["train"]["global_step"] for s in seeds),
            "train_minutes": statistics.fmean(by_seed[s]["train"]["train_minutes"] for s in seeds),
            "source_tokens_per_second": statistics.fmean(
                by_seed[s]["train"]["source_tokens_per_second"] for s in seeds
            ),
        }
        baseline = MODELS[arm_name].baseline
        if baseline is not None:
            baseline_runs = runs[baseline]
            entry["val_delta"] = mean_std(
                [by_seed[s]["validation"]["bleu"] - baseline_runs[s]["validation"]["bleu"] for s in seeds]
            )
            entry["test_delta"] = mean_std(
                [by_seed[s]["test"]["bleu"] - baseline_runs[s]["test"]["bleu"] for s in seeds]
            )
            entry["test_paired_bootstrap"] = {
                s: paired_bootstrap(
                    hypotheses(args, baseline, s, "test"), hypotheses(args, arm_name, s, "test"), references["test"]
                )
                for s in seeds
            }
        summary[arm_name] = entry
    return summary


def print_summary(args, summary: dict, signature: str, table_vi: dict | None) -> None:
    budget = []
    if args.minutes_per_model is not None:
        budget.append(f"{args.minutes_per_model:g} min")
    if args.max_steps_per_model:
        budget.append(f"{args.max_steps_per_model} steps")
    seeds = " ".join(str(s) for s in args.seeds)
    first = " (whichever comes first)" if len(budget) > 1 else ""
    print(f"\nMulti30k {SOURCE_LANG}->{TARGET_LANG}, {' or '.join(budget)} of training per run{first}, "
          f"beam {args.num_beams}, seeds {seeds}; BLEU mean ± std over seeds")
    print(f"{'arm':<26} {'steps':>6} {'src tok/s':>9} {'val BLEU':>14} {'test BLEU':>14} {'test Δ':>14} "
          f"{'p (test, per seed)':<24} baseline")
    for arm_name, entry in summary.items():
        delta = format_mean_std(entry["test_delta"]) if "test_delta" in entry else f"{'':>14}"
        tests = entry.get("test_paired_bootstrap", {})
        p_values = " / ".join(f"{tests[s]['p_value']:.3f}" for s in entry["seeds"]) if tests else ""
        print(
            f"{arm_name:<26} {entry['steps']:>6.0f} {entry['source_tokens_per_second']:>9.0f} "
            f"{format_mean_std(entry['val_bleu']):>14} {format_mean_std(entry['test_bleu']):>14} {delta:>14} "
            f"{p_values:<24} {entry['baseline'] or ''}"
        )
    print(f"sacreBLEU signature: {signature}")
    print(f"Paired bootstrap: sacrebleu.significance.PairedTest, {BOOTSTRAP_SAMPLES} resamples, two-sided; "
          f"p < {SIGNIFICANCE_LEVEL} marks a difference unlikely under resampling of the test sentences (one seed).")
    compared = {name: entry for name, entry in summary.items() if "val_delta" in entry}
    if compared:
        best = max(compared, key=lambda name: compared[name]["val_delta"]["mean"])
        entry = compared[best]
        significant = sum(
            test["p_value"] < SIGNIFICANCE_LEVEL and test["bleu"] > test["baseline_bleu"]
            for test in entry["test_paired_bootstrap"].values()
        )
        print(
            f"Selected on validation (largest mean val Δ over its baseline): {best}, val Δ "
            f"{entry['val_delta']['mean']:+.2f}; its test Δ {entry['test_delta']['mean']:+.2f}, better with "
            f"p < {SIGNIFICANCE_LEVEL} on {significant} of {len(entry['seeds'])} seeds."
        )
    if table_vi:
        print("\nGTrans decoder groups (paper Table VI), test BLEU, mean over seeds:")
        print(f"{'k':>3} {'group k alone':>14} {'groups k..N mixed':>18} {'psi_k (Eq. 6)':>14}")
        for k, rows in enumerate(zip(*table_vi.values()), start=1):
            print(
                f"{k:>3} {statistics.fmean(r['alone'] for r in rows):>14.2f} "
                f"{statistics.fmean(r['mixed'] for r in rows):>18.2f} {statistics.fmean(r['psi'] for r in rows):>14.3f}"
            )


def check_settings(args) -> None:
    """Write the result-changing settings into a new output dir; refuse to continue one made with other settings."""
    settings = {name: format_value(getattr(args, name)) for name in RESULT_SETTINGS}
    settings_file = args.output_dir / "settings.json"
    if settings_file.is_file():
        # a setting added since the dir was made was not set there
        saved = {name: format_value(None) for name in RESULT_SETTINGS} | json.loads(settings_file.read_text())
        changed = {name: (saved[name], value) for name, value in settings.items() if saved[name] != value}
        if changed:
            details = ", ".join(f"--{name} was {old} and is now {new}" for name, (old, new) in changed.items())
            raise SystemExit(f"{args.output_dir} holds runs made with other settings ({details}); use another "
                             "--output_dir (and --tokenizer_dir to share the tokenizer).")
    else:
        args.output_dir.mkdir(parents=True, exist_ok=True)
        # atomically: runs started together (study/queue.py --parallel) may write it at once and read it meanwhile
        temporary = settings_file.with_name(f"settings.json.{os.getpid()}.tmp")
        temporary.write_text(json.dumps(settings, indent=2) + "\n")
        os.replace(temporary, settings_file)


def with_prerequisites(arm_names: list[str], baselines: bool = True) -> list[str]:
    """The requested arms, each preceded by the runs it starts from (`init_from`) and, with `baselines`, by its
    baseline (and what that starts from) if not requested: the comparison needs them."""
    ordered = []

    def add(name: str, with_baseline: bool) -> None:
        arm = MODELS[name]
        for needed in (arm.init_from, arm.baseline if with_baseline else None):
            if needed is not None:
                add(needed, with_baseline)
        if name not in ordered:
            ordered.append(name)

    for name in arm_names:
        add(name, baselines)
    return ordered


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data_dir", type=Path, default=DEFAULT_DATA, help="Multi30k directory (default: %(default)s)")
    parser.add_argument("--output_dir", type=Path, default=Path("runs/bench_multi30k"))
    parser.add_argument(
        "--minutes_per_model", type=positive_float, default=None,
        help=f"Training wall-clock budget per run (default: {DEFAULT_MINUTES:g}, or none with --max_steps_per_model).",
    )
    parser.add_argument(
        "--max_steps_per_model", type=positive_int, default=None,
        help="Stop every run at this many optimisation steps (a steps-matched comparison; the schedule does not "
        "depend on it).",
    )
    parser.add_argument(
        "--max_epochs_per_model", type=positive_int, default=None,
        help="The converged budget, for the arms trained to convergence (and only for them; see the module docstring): "
        "train at most this many epochs, evaluating val BLEU at the end of each; with --early_stopping_patience, "
        "instead of --max_steps_per_model and --minutes_per_model.",
    )
    parser.add_argument(
        "--early_stopping_patience", type=positive_int, default=None,
        help="With --max_epochs_per_model: stop once val BLEU has not improved for this many evaluations (epochs); "
        f"the val-best checkpoint is the run's model, and the average of its last {AVERAGED_CHECKPOINTS} checkpoints "
        "is scored beside it.",
    )
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["plain_transformer", "gtrans"],
                        metavar="ARM", help="Arms to run (see --list_models); their baselines are added.")
    parser.add_argument("--seeds", nargs="+", type=int, default=[1], help="Seeds; every arm is trained once per seed.")
    parser.add_argument("--list_models", action="store_true", help="Print the arms and exit.")
    parser.add_argument(
        "--tokenizer_dir", type=Path, default=None,
        help="Reuse this tokenizer (default: <output_dir>/tokenizer, trained on the first run).",
    )
    parser.add_argument("--warmup_steps", type=positive_int, default=1000)
    parser.add_argument("--vocab_size", type=positive_int, default=8000)
    parser.add_argument("--max_eval_samples", type=positive_int, default=None, help="Validation sentences (default: all).")
    parser.add_argument("--max_predict_samples", type=positive_int, default=None, help="Test sentences (default: all).")
    parser.add_argument("--num_beams", type=positive_int, default=4)
    parser.add_argument("--runs_at_once", type=positive_int, default=1,
                        help="How many runs share the device as this one starts, itself included (study/queue.py passes it); "
                        "the ledger records it beside the throughput, which is then a share of the device.")
    parser.add_argument("--max_new_tokens", type=positive_int, default=None,
                        help="Longest translation (default: run_translation's, 128 tokens); for smoke runs.")
    parser.add_argument(
        "--ledger_dir", type=Path, default=None,
        help="Write every finished run into this results ledger (study/results/multi30k: one committed JSON "
        "file per arm and seed); with --report, the ledger to read (default: study/results/multi30k).",
    )
    parser.add_argument("--run_only", action="store_true",
                        help="Train and evaluate only the listed arms and seeds (no baselines, no summary; a "
                        "fine-tuning arm's starting run too): one study run, as study/queue.py does.")
    parser.add_argument("--report", action="store_true",
                        help="Print the Multi30k results tables from the ledger alone and exit (`python -m "
                        "study.report` writes them into study/README.md and docs/results.md).")
    args = parser.parse_args(argv)
    if len(set(args.seeds)) != len(args.seeds):
        parser.error(f"--seeds must differ, got {args.seeds}")
    converged = args.max_epochs_per_model is not None
    if converged != (args.early_stopping_patience is not None):
        parser.error("--max_epochs_per_model and --early_stopping_patience go together: they are the converged budget")
    if converged and (args.max_steps_per_model is not None or args.minutes_per_model is not None):
        parser.error("the converged budget (--max_epochs_per_model) replaces --max_steps_per_model and "
                     "--minutes_per_model")
    if not (args.report or args.list_models):
        # one budget per arm in the ledger: an arm trained to convergence takes the converged budget, no other does
        other_budget = [name for name in with_prerequisites(args.models, baselines=not args.run_only)
                        if MODELS[name].converged != converged]
        if other_budget:
            parser.error(f"{', '.join(other_budget)} {'are not' if converged else 'are'} trained to convergence: "
                         + ("the converged budget (--max_epochs_per_model) is only for the arms that are"
                            if converged else "give them the converged budget (--max_epochs_per_model, "
                            "--early_stopping_patience)"))
    if args.minutes_per_model is None and args.max_steps_per_model is None and not converged:
        args.minutes_per_model = DEFAULT_MINUTES
    return args


PAPER_CLAIMS = {
    "gtrans": "+1.73 BLEU on WMT14 En-De and +0.78 on IWSLT14 De-En with 6 + 6 layers (Table II), +0.89 at 12 + 12 "
              "(Table VII); at 24L-18L post-norm the model without fusion \"failed to train\" (Table VIII).",
    "layerwise_coordination": "+2.21 BLEU on IWSLT14 De-En with 14 shared layers parameter-matched to the 6 + 6 "
                              "Transformer (Sec. 4.2, 5.1), +1.03 on WMT14 En-De (base).",
    "rtal": "+1.16 BLEU over Transformer-Base on WMT14 En-De (6 + 6 layers, Table 1), best with EWP + FFN nodes "
            "(Table 4).",
    "deep_representations": "up to +0.99 BLEU from iterative / hierarchical aggregation and +1.14 with the diversity "
                            "term on WMT14 En-De (Table 1), fine-tuned from a trained model.",
    "re_transformer": "Re-Transformer-2 32.14 vs 27.3 BLEU on WMT14 En-De (Table 3) with fewer parameters and faster "
                      "inference.",
}


def report_references(data_dir: Path, max_predict_samples: int | None = None) -> dict[str, list[str]]:
    """The test references (the first `max_predict_samples`) and the val references the ledger's runs were scored
    on."""
    corpus = load_parallel_text(data_dir, SOURCE_LANG, TARGET_LANG)
    test = corpus["test"]["translation"]
    return {"test": [pair[TARGET_LANG] for pair in test[: max_predict_samples or len(test)]],
            "validation": [pair[TARGET_LANG] for pair in corpus["validation"]["translation"]]}


def report_text(ledger_dir: Path, data_dir: Path, max_predict_samples: int | None = None,
                plot_link: str | None = None) -> str:
    """The Multi30k results section of study/README.md and docs/results.md, computed from the ledger (and the test
    references); `plot_link`: the epoch curves' plot as the page that holds the section links it (`ledger.report`)."""
    pending = [run.label for run in queue.pending_runs(ledger_dir, here=False)[:3]]  # not this machine's runs/
    references = report_references(data_dir, max_predict_samples)
    runs = ledger.read_ledger(ledger_dir)
    depth_probes = [
        "",
        "Deep post-norm, priority 2 (`study/probe_post_norm_depth.py`, 600 steps, warm-up 400): does the plain "
        "post-norm model train at this depth, and how long would a 1,000-step run take on one core?",
        "",
        *queue.depth_probes.report(queue.PROBE_DIR),
        "",
        f"Priority 2's pair (plain vs GTrans, 1,000 steps): {queue.deep_post_norm_pair()[1]}.",
        "",
        *depth_runs(runs),
        "",
        *depth_conclusion(runs, references),
    ]
    many_to_many = ["", *bench_multilingual.report_lines(ledger.m2m_ledger_dir(ledger_dir),
                                                         bench_multilingual.test_references(data_dir))]
    return ledger.report(ledger_dir, references, paired_bootstrap, PAPER_CLAIMS, pending,
                         depth_probes + many_to_many, STEP_BUDGET_ARMS, plot_link)


def depth_runs(runs: dict) -> list[str]:
    """Whether the plain model trains at each probed depth, as its study runs say (Markdown lines): post-norm, and the
    deep baselines of issue 76 (pre-norm; post-norm with a 4,000-step warm-up, trained to convergence). The probe's
    600-step rule only chose the 1,000-step pair's depth; the 2,000-step runs of issue 38 decide."""
    lines = ["Does the plain model train at depth? The study runs decide, not the probe's 600-step rule "
             "(its *trains?* column): each plain run's test BLEU against the 6 + 6 plain model's and its last logged "
             "training loss (the runs' rows, loss curves and GTrans' verdicts above)."]
    reference = runs.get(BASE_ARM)
    if reference is not None:
        lines[0] += (f" 6 + 6 (`{BASE_ARM}`, {len(reference)} seed(s)): test BLEU "
                     f"{ledger.mean_std([e['test']['bleu'] for e in reference.values()])}.")
    lines.append("")
    for shape in DEEP_POST_NORM_SHAPES:
        for arm in deep_baselines(shape):
            if arm not in runs:
                continue
            entries = list(runs[arm].values())
            steps = "/".join(sorted({f"{entry['steps']:,}" for entry in entries}))
            lines.append(
                f"- {shape[0]} + {shape[1]}, `{arm}` ({steps} steps, "
                f"{len(entries)} seed(s)): test BLEU {ledger.mean_std([e['test']['bleu'] for e in entries])}, "
                f"training loss {ledger.mean_std([e['loss_curve'][-1][1] for e in entries])} at its last log"
            )
    if lines[-1] == "":
        lines.append("- No deep post-norm study run has finished yet.")
    return lines


def arm_shape(arm: Arm) -> tuple[int, int]:
    """An arm's encoder and decoder layers (the `multi30k` preset's unless its config says)."""
    preset = BACKBONE_PRESETS["multi30k"]
    return tuple(arm.config.get(key) or preset[key] for key in ("encoder_layers", "decoder_layers"))


def deep_baselines(shape: tuple[int, int]) -> list[str]:
    """The arms of the plain model from scratch with `shape`'s layers: post-norm (1,000 and 2,000 steps) and issue
    76's deep baselines that train (pre-norm; post-norm with a 4,000-step warm-up)."""
    return [name for name, arm in MODELS.items() if arm.model_type == BASE_ARM and arm.init_from is None
            and arm_shape(arm) == shape]


def best_on_val(runs: dict, arms: list[str]) -> str | None:
    """The arm of `arms` with the highest mean val BLEU in the ledger `runs` (the selection is on val), if any ran."""
    ran = [arm for arm in arms if arm in runs]
    return max(ran, key=lambda arm: statistics.fmean(e["validation"]["bleu"] for e in runs[arm].values()),
               default=None)


def from_scratch(families: tuple[str, ...], deeper_than: tuple[int, int] | None = None,
                 shape: tuple[int, int] | None = None) -> list[str]:
    """The arms of `families` trained from scratch, of `shape` or with more layers than `deeper_than` if given."""
    return [name for name, arm in MODELS.items() if arm.model_type in families and arm.init_from is None
            and (shape is None or arm_shape(arm) == shape)
            and (deeper_than is None or sum(arm_shape(arm)) > sum(deeper_than))]


def budget_words(runs: dict, arm: str) -> str:
    """How long `arm`'s runs in the ledger `runs` trained: to convergence, or their step budget."""
    if MODELS[arm].converged:
        return "trained to convergence"
    steps = sorted({entry["steps"] for entry in runs[arm].values()})
    return " / ".join(f"{count:,}" for count in steps) + " steps"


def different_budgets(runs: dict, arm: str, baseline: str) -> str | None:
    """Where `arm` and `baseline` trained to different budgets (a best-on-val pick may take each from another), the
    words that say so; None where they match."""
    arm_budget, baseline_budget = budget_words(runs, arm), budget_words(runs, baseline)
    if arm_budget == baseline_budget:
        return None
    return f"trained to different budgets: `{arm}` {arm_budget}, `{baseline}` {baseline_budget}"


@dataclass(frozen=True)
class DeepComparison:
    """One of issue 76's depth questions in the ledger: `arm` (best on val) against `baseline` (best on val), either
    None while their runs are missing; `waiting`: the deep baselines that should train that have not run."""
    question: str
    arm: str | None
    baseline: str | None
    waiting: tuple[str, ...]


def deep_comparisons(runs: dict) -> list[DeepComparison]:
    """Does GTrans beat a deep baseline that trains, at each depth of `TRAINING_DEEP_BASELINES` (the GTrans arm of
    that depth best on val against the plain arm of that depth best on val, once one of its baselines that should
    train has run), and does depth pay at all at this data size (the deep plain or GTrans model best on val against
    the best 6 + 6 one; its `waiting`: every deep baseline that should train and has not run)?"""
    comparisons = []
    for shape, training_baselines in TRAINING_DEEP_BASELINES.items():
        waiting = tuple(arm for arm in training_baselines if arm not in runs)
        trains = len(waiting) < len(training_baselines)
        comparisons.append(DeepComparison(
            f"GTrans against a {shape[0]} + {shape[1]} baseline that trains",
            best_on_val(runs, from_scratch(("gtrans",), shape=shape)),
            best_on_val(runs, deep_baselines(shape)) if trains else None, waiting))
    six = arm_shape(MODELS[BASE_ARM])
    comparisons.append(DeepComparison(
        f"the best deep model against the best {six[0]} + {six[1]} one",
        best_on_val(runs, from_scratch((BASE_ARM, "gtrans"), deeper_than=six)),
        best_on_val(runs, from_scratch((BASE_ARM, "gtrans"), shape=six)),
        tuple(arm for comparison in comparisons for arm in comparison.waiting)))
    return comparisons


def depth_conclusion(runs: dict, references: dict) -> list[str]:
    """Issue 76's depth questions (`deep_comparisons`), answered from the ledger (Markdown lines), each with its
    verdicts on test and val (paired bootstrap over the seeds both ran), or "no data yet" while the runs are
    missing."""
    def described(arm: str) -> str:
        entries = list(runs[arm].values())
        return (f"`{arm}` (val {ledger.mean_std([e['validation']['bleu'] for e in entries])}, test "
                f"{ledger.mean_std([e['test']['bleu'] for e in entries])}, {ledger.seed_list(sorted(runs[arm]))})")

    def verdicts(arm: str, baseline: str) -> str:
        comparison = ledger.compare(runs[arm], runs[baseline], references, paired_bootstrap)
        budgets = different_budgets(runs, arm, baseline)
        budgets = f" ({budgets})" if budgets else ""
        if comparison is None:
            return f"`{arm}` against `{baseline}`{budgets}: no seed of both has run yet"
        return f"`{arm}` against `{baseline}`{budgets} {comparison.summary()}"

    def still_to_run(waiting: tuple[str, ...]) -> str:
        return ", ".join(f"`{arm}`" for arm in waiting)

    *by_depth, depth_pays = deep_comparisons(runs)
    lines = ["**Does GTrans beat a deep baseline that trains?** At each depth that has a deep baseline that should "
             "train, the best-trained plain model of that depth (on val) against the best GTrans of that depth (on "
             "val):", ""]
    for shape, comparison in zip(TRAINING_DEEP_BASELINES, by_depth):
        depth = f"{shape[0]} + {shape[1]}"
        if comparison.baseline is None:
            plural = len(comparison.waiting) > 1
            lines.append(f"- {depth}: no data yet: {' and '.join(f'`{arm}`' for arm in comparison.waiting)}, the "
                         f"{depth} baseline{'s' * plural} that should train, {'have' if plural else 'has'} not run "
                         "(`study/queue.py` priority 9).")
        elif comparison.arm is None:
            lines.append(f"- {depth}: no data yet: no GTrans {depth} run has finished.")
        else:
            lines.append(f"- {depth}: the best-trained baseline is {described(comparison.baseline)}; the best GTrans "
                         f"is {described(comparison.arm)}: {verdicts(comparison.arm, comparison.baseline)}."
                         + (f" Still to run: {still_to_run(comparison.waiting)}." if comparison.waiting else ""))
    six = arm_shape(MODELS[BASE_ARM])
    lines += ["", "**Does depth pay at all at this data size?** "]
    if depth_pays.arm is None or depth_pays.baseline is None:
        lines[-1] += ("No data yet: no " + ("deep" if depth_pays.arm is None else f"{six[0]} + {six[1]}")
                      + " run has finished.")
    else:
        lines[-1] += (f"The best deep model (plain or GTrans from scratch with more than {six[0]} + {six[1]} layers, "
                      f"on val) is {described(depth_pays.arm)}, the best {six[0]} + {six[1]} one "
                      f"{described(depth_pays.baseline)}: {verdicts(depth_pays.arm, depth_pays.baseline)}."
                      + (f" Still to run: {still_to_run(depth_pays.waiting)}, the deep baselines that should train."
                         if depth_pays.waiting else ""))
    return lines


def record_in_ledger(args, arm_name: str, seed: int, results: dict, tokenizer_dir: Path, references: dict,
                     test_pairs: list[dict]) -> Path:
    path = ledger.ledger_path(args.ledger_dir, arm_name, seed)
    init_from = MODELS[arm_name].init_from
    if path.exists() and ledger.entry_problem(path) is None:  # an unreadable file is replaced (`ledger.write_entry`)
        start = None if init_from is None else starting_run(args, arm_name, seed)
        if start is None or not ledger.starts_apart(ledger.read_entry(path), {"init_from": start}):
            return path
        # the entry fine-tuned another run of its starting arm (trained on another machine): this run, from this
        # machine's, is a rerun beside it (the study's baseline reruns: `ledger.rerun_path`)
        path = ledger.rerun_path(args.ledger_dir, arm_name, seed, ledger.start_tag(start))
        if path.exists() and ledger.entry_problem(path) is None:
            return path
    table_vi = None
    if MODELS[arm_name].model_type == "gtrans" and MODELS[arm_name].decoder_group_table:
        table_vi = decoder_group_table(run_dir(args, arm_name, seed), test_pairs)
    ledger.write_entry(path, ledger_entry(args, arm_name, seed, results, tokenizer_dir, references, table_vi))
    print(f"Ledger: wrote {path}")
    return path


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.list_models:
        for name, arm in MODELS.items():
            start = f"; starts from: {arm.init_from}" if arm.init_from else ""
            print(f"{name:<26} {arm.question}  [baseline: {arm.baseline or '-'}{start}]")
        return
    if args.report:
        try:
            section = report_text(args.ledger_dir or ledger.DEFAULT_LEDGER, args.data_dir, args.max_predict_samples)
        except ledger.UnreadableResult as error:  # names the file and what to do: no traceback to read through
            raise SystemExit(f"--report: {error}") from None
        print(section, end="")
        return
    check_settings(args)
    corpus = load_parallel_text(args.data_dir, SOURCE_LANG, TARGET_LANG)
    tokenizer_dir = args.tokenizer_dir or args.output_dir / "tokenizer"
    if not (tokenizer_dir / "tokenizer.json").is_file():
        texts = [pair[lang] for pair in corpus["train"]["translation"] for lang in (SOURCE_LANG, TARGET_LANG)]
        train_joint_tokenizer(texts, args.vocab_size, model="unigram", save_dir=tokenizer_dir)
    references, limits = {}, {"validation": args.max_eval_samples, "test": args.max_predict_samples}
    for split, limit in limits.items():
        pairs = corpus[split].select(range(min(limit or len(corpus[split]), len(corpus[split]))))["translation"]
        references[split] = [pair[TARGET_LANG] for pair in pairs]
    test_pairs = corpus["test"].select(range(len(references["test"])))["translation"]

    arm_names = with_prerequisites(args.models, baselines=not args.run_only)
    runs = {}
    for name in arm_names:
        for seed in args.seeds:
            runs.setdefault(name, {})[seed] = train_and_evaluate(name, seed, args, tokenizer_dir)
            if args.ledger_dir is not None:
                record_in_ledger(args, name, seed, runs[name][seed], tokenizer_dir, references, test_pairs)
    if args.run_only:
        return
    summary = summarise(args, runs, references)
    table_vi = None
    if "gtrans" in runs:
        table_vi = {seed: decoder_group_table(run_dir(args, "gtrans", seed), test_pairs) for seed in args.seeds}
    signature = next(iter(next(iter(runs.values())).values()))["test"]["signature"]
    (args.output_dir / "results.json").write_text(
        json.dumps(
            {"runs": runs, "summary": summary, "gtrans_decoder_groups": table_vi, "signature": signature},
            indent=2,
        )
        + "\n"
    )
    print_summary(args, summary, signature, table_vi)
    print(f"\nReproduce: {reproduction_command(__spec__.name, sys.argv[1:] if argv is None else argv)}")


if __name__ == "__main__":
    main()
