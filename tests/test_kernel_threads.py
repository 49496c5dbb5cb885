"""The compiled CPU kernels run on torch's threads: built with OpenMP, `at::parallel_for` in them splits work across
`torch.set_num_threads` threads (without it, it silently ran everything on one thread), and splitting the work
changes no number: every output is computed by one thread, in the same order, whatever the thread count."""

import pytest
import torch

from hf_layerfusion.inference.inference_copies import Float32Linear, Int8Linear


@pytest.fixture
def thread_count():
    """Sets torch's thread count for the test and restores it afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_parallel_for_uses_torchs_threads(kernels, thread_count, threads):
    thread_count(threads)
    assert kernels.parallel_for_threads(64) == threads
    assert kernels.parallel_for_threads(1) == 1  # one task: one thread
    with pytest.raises(RuntimeError, match="tasks must be positive, got 0"):
        kernels.parallel_for_threads(0)


def kernel_calls(kernels):
    """Each kernel that splits its work with at::parallel_for, on inputs large enough to be split."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 200)
    float32_linear, int8_linear = (copy(linear.weight.data, linear.bias.data) for copy in (Float32Linear, Int8Linear))
    x = torch.randn(70, 96)
    # on a CPU with AMX, a product the tiles split too (whole blocks of 64 columns, 2^22 multiply-adds or more each)
    wide_int8_linear, wide_x = Int8Linear(torch.randn(1024, 256), torch.randn(1024)), torch.randn(128, 256)
    query, key, value = torch.randn(9, 4, 1, 32), torch.randn(9, 4, 50, 32), torch.randn(9, 4, 50, 32)
    group_logits, psi = torch.randn(3, 40, 300) * 4, torch.softmax(torch.randn(3), dim=0)
    a, b, weight, bias = torch.randn(300, 64), torch.randn(300, 64), torch.randn(64), torch.randn(64)
    scores = torch.randn(40, 3000)
    return {
        "float32_linear": lambda: float32_linear(x),
        "int8_linear": lambda: int8_linear(x),
        "int8_linear (128 x 256 -> 1024)": lambda: wide_int8_linear(wide_x),
        "decode_attention": lambda: kernels.decode_attention(query, key, value, None, 0.2),
        "mixture_log_probs": lambda: kernels.mixture_log_probs(group_logits, psi),
        "add_layer_norm": lambda: kernels.add_layer_norm(a, b, weight, bias, 1e-5),
        "first_argmax": lambda: kernels.first_argmax(scores),
        "beam_top_k": lambda: torch.cat(
            [part.float() for part in kernels.beam_top_k(scores, torch.linspace(-3, 0, 40).view(10, 4), 8)]
        ),
    }


def test_every_kernel_gives_the_same_numbers_on_one_and_on_several_threads(kernels, thread_count):
    calls = kernel_calls(kernels)
    with torch.no_grad():
        thread_count(1)
        one_thread = {name: call() for name, call in calls.items()}
        thread_count(3)
        for name, call in calls.items():
            assert torch.equal(call(), one_thread[name]), name
