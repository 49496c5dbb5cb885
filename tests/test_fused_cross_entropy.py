"""The fused multi-group loss (GTrans Eq. 7 in training) against plain autograd on the unfused computation;
tests/test_gtrans.py checks it inside the model."""

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from hf_layerfusion.modeling.fused_cross_entropy import weighted_group_cross_entropy


def reference_loss(features, weight, bias, psi, labels, label_smoothing, num_items_in_batch):
    """sum_k psi_k * sum_t CE_t / normaliser, each group's logits kept by autograd."""
    normaliser = len(labels) if num_items_in_batch is None else num_items_in_batch
    group_ce = torch.stack(
        [
            F.cross_entropy(F.linear(f, weight, bias), labels, label_smoothing=label_smoothing, reduction="sum")
            for f in features
        ]
    )
    return (psi * group_ce).sum() / normaliser


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
@pytest.mark.parametrize("num_items_in_batch", [None, torch.tensor(91)])
@pytest.mark.parametrize("chunk_tokens", [None, 5])  # one chunk, and chunks that do not divide the 37 tokens
def test_loss_and_gradients_equal_autograd(label_smoothing, num_items_in_batch, chunk_tokens):
    generator = torch.Generator().manual_seed(0)
    groups, tokens, d_model, vocab = 3, 37, 16, 50
    features = torch.randn(groups, tokens, d_model, generator=generator, requires_grad=True)
    weight = torch.randn(vocab, d_model, generator=generator, requires_grad=True)
    bias = torch.randn(vocab, generator=generator)
    group_logits = torch.randn(groups, generator=generator, requires_grad=True)
    labels = torch.randint(vocab, (tokens,), generator=generator)

    def run(loss_fn, **kwargs):
        for tensor in (features, weight, group_logits):
            tensor.grad = None
        loss = loss_fn(features, weight, bias, group_logits.softmax(0), labels, label_smoothing, num_items_in_batch, **kwargs)
        (2.5 * loss).backward()  # a non-unit upstream gradient, as under gradient accumulation or loss scaling
        return loss.detach(), features.grad.clone(), weight.grad.clone(), group_logits.grad.clone()

    expected = run(reference_loss)
    fused = run(weighted_group_cross_entropy, chunk_tokens=chunk_tokens)
    for name, ours, reference in zip(("loss", "features", "weight", "group weights"), fused, expected):
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5, msg=lambda m: f"{name}: {m}")
    assert expected[3].abs().min() > 0  # psi really gets a gradient


class RecordTorchCalls(TorchFunctionMode):
    """Names of the torch functions and tensor methods called inside the block."""

    def __init__(self):
        super().__init__()
        self.names = set()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.add(getattr(func, "__name__", str(func)))
        return func(*args, **(kwargs or {}))


# the fused forward accumulates the output matrix's gradient with `addmm_` and the features' with `matmul`
GRADIENT_WORK = {"weight": "addmm_", "features": "matmul"}


@pytest.mark.parametrize("frozen", ["weight", "features"])
def test_frozen_input_gets_no_gradient_and_costs_no_gradient_work(frozen):
    """With the output matrix (or the features) frozen, the other input still gets the autograd gradient, and the
    fused forward skips the frozen input's vocabulary-sized gradient product (which it runs when that input trains)."""
    generator = torch.Generator().manual_seed(1)
    inputs = dict(features=torch.randn(2, 6, 8, generator=generator), weight=torch.randn(10, 8, generator=generator))
    psi, labels = torch.tensor([0.3, 0.7]), torch.randint(10, (6,), generator=generator)
    trainable = "features" if frozen == "weight" else "weight"

    def run(loss_fn, requires_grad):
        leaves = {name: t.clone().requires_grad_(name in requires_grad) for name, t in inputs.items()}
        with RecordTorchCalls() as calls:
            loss = loss_fn(leaves["features"], leaves["weight"], None, psi, labels, 0.1, None)
        loss.backward()
        return leaves, calls.names

    expected, _ = run(reference_loss, {trainable})
    leaves, names = run(weighted_group_cross_entropy, {trainable})
    assert leaves[frozen].grad is None
    torch.testing.assert_close(leaves[trainable].grad, expected[trainable].grad, atol=1e-5, rtol=1e-5)
    assert GRADIENT_WORK[frozen] not in names and GRADIENT_WORK[trainable] in names
    _, names = run(weighted_group_cross_entropy, {"features", "weight"})
    assert {GRADIENT_WORK["weight"], GRADIENT_WORK["features"]} <= names  # the recording sees both products


def test_trainable_bias_is_refused():
    with pytest.raises(ValueError, match="bias"):
        weighted_group_cross_entropy(
            torch.randn(1, 2, 4), torch.randn(5, 4), torch.zeros(5, requires_grad=True), torch.ones(1), torch.tensor([0, 1])
        )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(labels=torch.tensor([0, 1, 2])), r"\(1, 2, 4\) and \(3,\)"),
        (dict(group_weights=torch.ones(2)), r"one entry per group \(1\), got \(2,\)"),
        (dict(label_smoothing=1.5), "1.5"),
        (dict(chunk_tokens=0), "got 0"),
    ],
)
def test_bad_inputs_are_named(kwargs, message):
    inputs = dict(features=torch.randn(1, 2, 4), weight=torch.randn(5, 4), bias=None, group_weights=torch.ones(1),
                  labels=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=message):
        weighted_group_cross_entropy(**{**inputs, **kwargs})
