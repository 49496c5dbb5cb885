"""Early-training probe: does a model learn to read the source, or do its encoder states collapse?

Trains one model for a few hundred steps on Multi30k en->de with the recipe of `bench_multi30k.py` (the `multi30k`
preset, AdamW lr 1e-3 without weight decay, inverse-sqrt schedule, label smoothing 0.1, 64 sentences per batch
grouped by length, gradient clipping 1.0) and every `--log_every` steps prints, on the first 128 validation pairs:

- `val_loss`: the model's loss (for deep representations with `diversity_weight > 0`: CE - lambda * D);
- `val_loss_wrong_source`: the same targets with every sentence's source replaced by another sentence's; equal to
  `val_loss` while the decoder does not use the source, higher once it does;
- `encoder_spread`: per encoder state (embeddings, layer 1 .. L), `||X - mean_positions(X)|| / ||X||` over each
  sentence's real positions, averaged over sentences: 0 when every position holds the same vector (collapse;
  `hf_layerfusion.models.deep_representations.position_spread`, which deep representations also log in training);
- `memory_spread`, `memory_norm`: the same spread and the mean L2 norm of the memory cross-attention reads.

The probe found the Multi30k collapses of RTAL (`concat_ffn`, raw FFN root) and of deep representations (the
diversity term trained from scratch); the family docstrings quote it. Examples:

    python -m study.probe_training --model_type rtal --config '{"aggregation_function": "concat_ffn"}'
    python -m study.probe_training --model_type deep_representations --config '{"diversity_weight": 0.0}'
    # the paper's recipe for the diversity term: start from a trained plain checkpoint (and its tokenizer)
    python -m study.probe_training --model_type deep_representations --init_from runs/plain \\
        --config '{"encoder_aggregation": "hierarchical", "decoder_aggregation": "hierarchical", "diversity_weight": 1.0}'
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shlex
import sys
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

import hf_layerfusion
from hf_layerfusion.models.deep_representations import position_spread
from hf_layerfusion.training.tokenization import train_joint_tokenizer
from study.common import DEFAULT_DATA, read_lines

PROBE_PAIRS = 128
BATCH_SIZE = 64
LENGTH_GROUP = 50  # batches per length-sorted chunk, as the Trainer's group_by_length


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="Multi30k directory (default: %(default)s)")
    parser.add_argument("--model_type", choices=sorted(hf_layerfusion.FAMILIES), default="plain_transformer")
    parser.add_argument("--config", default="{}", help="JSON config overrides, e.g. '{\"diversity_weight\": 0.0}'")
    parser.add_argument("--init_from", type=Path, help="a trained checkpoint to start from (its tokenizer is used)")
    parser.add_argument("--tokenizer", type=Path, help="tokenizer dir (default: train an 8k unigram one)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--warmup_steps", type=int, default=400)
    parser.add_argument("--log_every", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    for split in ("train.en", "train.de", "val.en", "val.de"):
        if not (args.data / split).is_file():
            parser.error(f"--data {args.data}: missing {split}")
    for option in ("init_from", "tokenizer"):
        path = getattr(args, option)
        if path is not None and not (path / "config.json" if option == "init_from" else path).exists():
            parser.error(f"--{option} {path}: no such {'checkpoint' if option == 'init_from' else 'directory'}")
    try:
        overrides = json.loads(args.config)
    except json.JSONDecodeError as error:
        parser.error(f"--config {args.config!r} is not JSON: {error}")
    if not isinstance(overrides, dict):
        parser.error(f"--config must be a JSON object of config keys, got {args.config!r}")
    for option in ("steps", "warmup_steps", "log_every", "threads"):
        if getattr(args, option) < 1:
            parser.error(f"--{option} must be a positive integer, got {getattr(args, option)}")
    return args


def load_tokenizer(args, train_texts: list[str]):
    if args.tokenizer or args.init_from:
        return AutoTokenizer.from_pretrained(args.tokenizer or args.init_from)
    return train_joint_tokenizer(train_texts, 8000)


def build_model(args, tokenizer):
    config_class, _, model_class = hf_layerfusion.FAMILIES[args.model_type]
    overrides = json.loads(args.config)
    if args.init_from:
        return model_class.from_pretrained(args.init_from, **overrides)
    config = config_class.from_preset(
        "multi30k",
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,  # the decoder starts with the family's start token (config default)
        **overrides,
    )
    return model_class(config)


def collate(pairs, tokenizer) -> dict:
    batch = tokenizer.pad({"input_ids": [source for source, _ in pairs]}, return_tensors="pt")
    labels = torch.full((len(pairs), max(len(target) for _, target in pairs)), -100)
    for row, (_, target) in enumerate(pairs):
        labels[row, : len(target)] = torch.tensor(target)
    return {**batch, "labels": labels}


def training_batches(pairs, tokenizer, seed: int):
    rng = random.Random(seed)
    while True:
        order = list(range(len(pairs)))
        rng.shuffle(order)
        for start in range(0, len(order), BATCH_SIZE * LENGTH_GROUP):
            chunk = sorted(order[start : start + BATCH_SIZE * LENGTH_GROUP], key=lambda i: len(pairs[i][0]))
            batches = [chunk[i : i + BATCH_SIZE] for i in range(0, len(chunk), BATCH_SIZE)]
            rng.shuffle(batches)
            for batch in batches:
                yield collate([pairs[i] for i in batch], tokenizer)


@torch.no_grad()
def probe(model, batch: dict) -> dict:
    model.eval()
    wrong = torch.roll(torch.arange(len(batch["input_ids"])), 1)  # sentence i gets sentence i-1's source
    out = model(**batch, output_hidden_states=True)
    wrong_source = model(input_ids=batch["input_ids"][wrong], attention_mask=batch["attention_mask"][wrong],
                         labels=batch["labels"])
    model.train()
    mask = batch["attention_mask"]
    return {
        "val_loss": round(out.loss.item(), 3),
        "val_loss_wrong_source": round(wrong_source.loss.item(), 3),
        "encoder_spread": [round(position_spread(states, mask).item(), 4) for states in out.encoder_hidden_states],
        "memory_spread": round(position_spread(out.encoder_last_hidden_state, mask).item(), 4),
        "memory_norm": round(out.encoder_last_hidden_state.norm(dim=-1)[mask.bool()].mean().item(), 2),
    }


def main(argv=None) -> None:
    args = parse_args(argv)
    print("# python -m study.probe_training " + shlex.join(sys.argv[1:] if argv is None else argv), flush=True)
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    sources, targets = read_lines(args.data / "train.en"), read_lines(args.data / "train.de")
    tokenizer = load_tokenizer(args, sources + targets)
    model = build_model(args, tokenizer).train()
    model.config.label_smoothing = 0.1
    encoded = tokenizer(sources, text_target=targets, truncation=True, max_length=128)
    pairs = list(zip(encoded["input_ids"], encoded["labels"]))
    val = tokenizer(read_lines(args.data / "val.en")[:PROBE_PAIRS], text_target=read_lines(args.data / "val.de")[
        :PROBE_PAIRS], truncation=True, max_length=128)
    probe_batch = collate(list(zip(val["input_ids"], val["labels"])), tokenizer)

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.0)
    # the Trainer's "inverse_sqrt" with linear warm-up
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / args.warmup_steps, math.sqrt(args.warmup_steps / (step + 1)))
    )
    print(json.dumps({"step": 0, "train_loss": None, **probe(model, probe_batch)}), flush=True)
    batches, losses, start = training_batches(pairs, tokenizer, args.seed), [], time.time()
    for step in range(1, args.steps + 1):
        loss = model(**next(batches)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        if step % args.log_every == 0:
            row = {"step": step, "train_loss": round(sum(losses) / len(losses), 3), **probe(model, probe_batch)}
            print(json.dumps(row), flush=True)
            losses = []
    print(f"# {args.steps} steps in {time.time() - start:.0f} s", flush=True)


if __name__ == "__main__":
    main()
