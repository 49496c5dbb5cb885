"""The compiled CPU kernels run on torch's threads: built with OpenMP, `at::parallel_for` in them splits work across
`torch.set_num_threads` threads (without it, it silently ran everything on one thread), a decoding step's layers run
as one team of those threads (kernels/parallel.h: one parallel region per step, not per kernel call), and splitting
the work changes no number: every output is computed by one thread, in the same order, whatever the thread count."""

import pytest
import torch
from helpers import decoder_logits, tiny_model

from hf_layerfusion.inference import inference_copies, prepare_for_inference
from hf_layerfusion.inference.inference_copies import Float32Linear, Int8Linear, float32_kernel_available


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


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_a_team_splits_its_kernels_across_torchs_threads(kernels, thread_count, threads):
    thread_count(threads)
    # many rounds: each waits for the last one's chunks, as a step's kernel calls do
    assert kernels.team_threads(64, rounds=200) == threads
    assert kernels.team_threads(1, rounds=3) == 1  # one task: the team's first thread alone


def test_an_error_inside_a_team_reaches_the_caller_and_the_team_runs_again(kernels, thread_count):
    thread_count(2)
    for failing_task in (0, 63):  # on the team's first thread, and on another
        with pytest.raises(RuntimeError, match=f"task {failing_task} failed, as asked"):
            kernels.team_threads(64, rounds=5, failing_task=failing_task)
    assert kernels.team_threads(64, rounds=5) == 2


@pytest.mark.skipif(not float32_kernel_available(), reason="the compiled decoding steps need AVX-512 or AVX2 with FMA")
@pytest.mark.parametrize("quantization", [None, "int8"])
def test_the_layers_in_one_call_give_the_same_logits_on_one_and_on_several_threads(quantization, thread_count):
    """A step's layers as one team (`DecoderLayerSteps`): the same logits bit for bit at 1, 2 and 3 threads, with
    rows enough (5 sentences x 5 beams: 25) for the int8 product of a CPU with VNNI to run oneDNN's, split by rows
    across the team."""
    engine = prepare_for_inference(tiny_model("gtrans", d_model=64), quantization)
    tokens = torch.randint(4, engine.config.vocab_size, (5, 5 * 5), generator=torch.Generator().manual_seed(0))
    tokens[0] = engine.config.decoder_start_token_id
    logits = {}
    for threads in (1, 2, 3):
        thread_count(threads)
        logits[threads] = decoder_logits(engine, 5, tokens, inference_copies.compiled_decoder_layers)
    for threads in (2, 3):
        for step, (actual, expected) in enumerate(zip(logits[threads], logits[1])):
            assert torch.equal(actual, expected), (quantization, threads, step, (actual - expected).abs().max())
