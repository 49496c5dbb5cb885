"""Fused projection + cross entropy for a weighted sum of output groups (GTrans Eq. 7: `sum_k psi_k CE_k`).

A multi-group loss computed with plain autograd keeps one `tokens x vocab` logits tensor per group until the
backward pass; recomputing each group's projection in the backward pass (activation checkpointing) saves that
memory but costs a third vocabulary-sized matmul per group. This function does what fused linear cross entropy
kernels do (e.g. Liger-Kernel's): the forward pass computes the loss *and* its gradients with respect to the
features and the output matrix, chunk by chunk, and keeps only those gradients (`tokens x d` and `vocab x d`);
the backward pass just scales them by the incoming gradient. Three vocabulary matmuls per group, as in plain
autograd, and at most one chunk of logits alive at a time.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# at most this many logits (float32: 128 MiB) are alive at once; the token chunk size follows from the vocabulary
MAX_CHUNK_LOGITS = 2**25


class _WeightedGroupCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features, weight, bias, group_weights, labels, label_smoothing, normaliser, chunk_tokens):
        num_groups, num_tokens, _ = features.shape
        vocab_size = weight.shape[0]
        need_features, need_weight = features.requires_grad, weight.requires_grad
        grad_features = torch.empty_like(features) if need_features else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_weight else None
        group_ce = torch.zeros(num_groups, dtype=torch.float32, device=features.device)
        # d loss / d logits of each group is psi_k / normaliser times that of its summed cross entropy
        logit_scale = group_weights.detach().float() / normaliser
        for k in range(num_groups):
            for start in range(0, num_tokens, chunk_tokens):
                chunk = slice(start, start + chunk_tokens)
                hidden, targets = features[k, chunk], labels[chunk]
                log_probs = F.log_softmax(F.linear(hidden, weight, bias).float(), dim=-1)
                rows = torch.arange(len(targets), device=targets.device)
                # F.cross_entropy's label smoothing: (1 - eps) * NLL + eps * mean over the vocabulary of -log p
                nll = -log_probs[rows, targets]
                smoothed = -log_probs.mean(dim=-1)
                group_ce[k] += ((1 - label_smoothing) * nll + label_smoothing * smoothed).sum()
                if not (need_features or need_weight):
                    continue
                # d CE / d logits = softmax - ((1 - eps) one_hot + eps / V), built in place in the log_probs buffer
                grad_logits = log_probs.exp_()
                grad_logits.sub_(label_smoothing / vocab_size)
                grad_logits[rows, targets] -= 1 - label_smoothing
                grad_logits.mul_(logit_scale[k])
                if need_features:
                    grad_features[k, chunk] = grad_logits.to(weight.dtype) @ weight
                if need_weight:
                    grad_weight.addmm_(grad_logits.t(), hidden.float())
        group_ce /= normaliser
        ctx.save_for_backward(grad_features, grad_weight, group_ce)
        ctx.weight_dtype = weight.dtype
        return (group_weights.float() * group_ce).sum()

    @staticmethod
    def backward(ctx, grad_loss):
        grad_features, grad_weight, group_ce = ctx.saved_tensors
        if grad_features is not None:
            grad_features = grad_features * grad_loss.to(grad_features.dtype)
        if grad_weight is not None:
            grad_weight = (grad_weight * grad_loss).to(ctx.weight_dtype)
        grad_group_weights = group_ce * grad_loss if ctx.needs_input_grad[3] else None
        return grad_features, grad_weight, None, grad_group_weights, None, None, None, None


def weighted_group_cross_entropy(
    features: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    group_weights: torch.Tensor,
    labels: torch.Tensor,
    label_smoothing: float = 0.0,
    num_items_in_batch: int | torch.Tensor | None = None,
    chunk_tokens: int | None = None,
) -> torch.Tensor:
    """`sum_k group_weights[k] * CE(features[k] W^T + bias, labels)` with the reduction of `token_cross_entropy`.

    Args:
        features: `(groups, tokens, d)`, only the positions that carry a label (pads already removed).
        weight: the `(vocab, d)` output matrix; `bias`: a fixed `(vocab,)` logits bias (no gradient) or None.
        group_weights: `(groups,)` mixture weights (differentiable; their gradient is each group's loss).
        labels: `(tokens,)` target ids.
        num_items_in_batch: the Trainer's token count; the sums are divided by it (default: `tokens`).
        chunk_tokens: tokens projected at once (default: as many as fit `MAX_CHUNK_LOGITS` logits).
    """
    if features.dim() != 3 or labels.dim() != 1 or features.shape[1] != labels.shape[0]:
        raise ValueError(
            f"`features` must be (groups, tokens, d) and `labels` (tokens,), got {tuple(features.shape)} and "
            f"{tuple(labels.shape)}."
        )
    if group_weights.shape != (features.shape[0],):
        raise ValueError(f"`group_weights` must have one entry per group ({features.shape[0]}), got {tuple(group_weights.shape)}.")
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"`label_smoothing` must lie in [0, 1), got {label_smoothing}.")
    if chunk_tokens is not None and chunk_tokens < 1:
        raise ValueError(f"`chunk_tokens` must be positive, got {chunk_tokens}.")
    if labels.numel() == 0:  # nothing to predict: a zero that still connects the graph
        return features.sum() * 0.0 + weight.sum() * 0.0 + group_weights.sum() * 0.0
    if bias is not None and bias.requires_grad:
        raise ValueError("`bias` must be a fixed buffer: the fused loss returns no gradient for it.")
    normaliser = labels.numel() if num_items_in_batch is None else num_items_in_batch
    if torch.is_tensor(normaliser):
        normaliser = normaliser.to(features.device).float()
    chunk_tokens = chunk_tokens or max(1, MAX_CHUNK_LOGITS // weight.shape[0])
    return _WeightedGroupCrossEntropy.apply(
        features, weight, bias, group_weights, labels, float(label_smoothing), normaliser, chunk_tokens
    )
