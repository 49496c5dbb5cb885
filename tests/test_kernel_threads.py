"""The compiled CPU kernels split their work across `torch.set_num_threads` threads (kernels/parallel.h): the calling
thread's pool, whose threads spin briefly between calls and then park, or OpenMP's own where its idle threads spin
(`OMP_WAIT_POLICY=ACTIVE`); an error on any thread reaches the caller, a forked child makes its own pool, and splitting
the work changes no number: every output is computed by one thread, in the same order, whatever the thread count and
the backend."""

import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch
from helpers import decoder_logits, tiny_model

from hf_layerfusion.inference import inference_copies, prepare_for_inference
from hf_layerfusion.inference.inference_copies import (
    Float32Linear,
    Int8Linear,
    float32_kernel_available,
)


@pytest.fixture
def thread_count():
    """Sets torch's thread count for the test and restores it afterwards."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


BACKENDS = ["pool", "openmp"]


@pytest.fixture(params=BACKENDS)
def backend(request, kernels):
    """Runs the test on each parallel backend of the kernels and restores the one in use afterwards."""
    before = kernels.parallel_backend()
    kernels.set_parallel_backend(request.param)
    yield request.param
    kernels.set_parallel_backend(before)


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_parallel_for_uses_torchs_threads(kernels, thread_count, backend, threads):
    thread_count(threads)
    # many rounds: each waits for the last one's chunks, as a step's kernel calls do
    assert kernels.parallel_for_threads(64, rounds=20) == threads
    assert kernels.parallel_for_threads(1, rounds=3) == 1  # one task: the calling thread alone
    with pytest.raises(RuntimeError, match="tasks and rounds must be positive, got 0 and 1"):
        kernels.parallel_for_threads(0)


def test_an_error_on_any_thread_reaches_the_caller_and_the_threads_run_again(kernels, thread_count, backend):
    thread_count(2)
    for failing_task in (0, 63):  # on the calling thread's chunk, and on the other's
        with pytest.raises(RuntimeError, match=f"task {failing_task} failed, as asked"):
            kernels.parallel_for_threads(64, rounds=5, failing_task=failing_task)
    assert kernels.parallel_for_threads(64, rounds=5) == 2


def test_the_backend_is_named_and_a_bad_one_refused(kernels):
    assert kernels.parallel_backend() in BACKENDS
    with pytest.raises(RuntimeError, match='the backend is "pool" or "openmp", got "tbb"'):
        kernels.set_parallel_backend("tbb")


def run_python(code: str, **environment) -> str:
    """The output of `code` in a fresh interpreter with `environment` over this one's (None: unset)."""
    env = {**os.environ, **{k: v for k, v in environment.items() if v is not None}}
    for name in [k for k, v in environment.items() if v is None]:
        env.pop(name, None)
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                            check=False,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


@pytest.mark.parametrize("policy, expected", [("Active", "openmp"), ("PASSIVE", "pool"), (None, "pool")])
def test_openmps_threads_serve_where_they_spin_else_the_pool(kernels, policy, expected):
    code = """
        from hf_layerfusion.inference.cpu_kernels import compiled_kernels
        print(compiled_kernels().parallel_backend())
    """
    assert run_python(code, OMP_WAIT_POLICY=policy).split() == [expected]


def test_the_pool_parks_when_idle(kernels, thread_count):
    """After a call, the pool's threads spin for a fraction of a millisecond, then sleep: an idle process burns no
    core."""
    before = kernels.parallel_backend()
    kernels.set_parallel_backend("pool")
    try:
        thread_count(2)
        assert kernels.parallel_for_threads(64, rounds=20) == 2
        cpu_before, wall_before = time.process_time(), time.perf_counter()
        time.sleep(0.3)
        cpu, wall = time.process_time() - cpu_before, time.perf_counter() - wall_before
    finally:
        kernels.set_parallel_backend(before)
    assert cpu < 0.25 * wall, f"{cpu:.3f} s of CPU in {wall:.3f} s idle"


def test_a_forked_child_makes_its_own_pool_and_exits(kernels):
    """The child of a fork has none of its parent's pool threads: it runs on a pool of its own, and exits normally
    (joining the parent's threads there would hang)."""
    code = """
        import os, sys, torch
        from hf_layerfusion.inference.cpu_kernels import compiled_kernels
        kernels = compiled_kernels()
        torch.set_num_threads(2)
        assert kernels.parallel_for_threads(64, rounds=10) == 2
        child = os.fork()
        if child == 0:
            threads = kernels.parallel_for_threads(64, rounds=10)
            sys.exit(0 if threads == 2 else 3)
        _, status = os.waitpid(child, 0)
        print(os.waitstatus_to_exitcode(status), kernels.parallel_for_threads(64, rounds=10))
    """
    assert run_python(code, OMP_WAIT_POLICY="PASSIVE").split() == ["0", "2"]


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


def test_every_kernel_gives_the_same_numbers_on_one_and_on_several_threads(kernels, thread_count, backend):
    calls = kernel_calls(kernels)
    with torch.no_grad():
        thread_count(1)
        one_thread = {name: call() for name, call in calls.items()}
        thread_count(3)
        for name, call in calls.items():
            assert torch.equal(call(), one_thread[name]), name


@pytest.mark.skipif(not float32_kernel_available(), reason="the compiled decoding steps need AVX-512 or AVX2 with FMA")
@pytest.mark.parametrize("quantization", [None, "int8"])
def test_the_layers_in_one_call_give_the_same_logits_on_one_and_on_several_threads(quantization, thread_count,
                                                                                   backend):
    """A step's layers in one call (`DecoderLayerSteps`): the same logits bit for bit at 1, 2 and 3 threads, with
    rows enough (5 sentences x 5 beams: 25) for the int8 product of a CPU with VNNI to run oneDNN's, split by rows
    across the threads."""
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
