"""The compiled CPU kernels split their work across `torch.set_num_threads` threads (kernels/parallel.h): the calling
thread's pool, whose threads spin briefly between calls and then park, or OpenMP's own where its idle threads spin
(`OMP_WAIT_POLICY=ACTIVE`); an error on any thread reaches the caller, a forked child makes its own pool, and splitting
the work changes no number: every output is computed by one thread, in the same order, whatever the thread count and
the backend."""

import textwrap
import time

import pytest
import torch
from helpers import decoder_logits, run_python, tiny_model
from transformers import LogitsProcessor, LogitsProcessorList

from hf_layerfusion.inference import (
    fast_generate,
    inference_copies,
    prepare_for_inference,
)
from hf_layerfusion.inference.cpu_kernels import torch_operators_on_one_thread
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


def python_output(code: str, tmp_path, **environment) -> str:
    """The output of `code` in a fresh interpreter (`helpers.run_python`) with `environment` (None: unset)."""
    return run_python(["-c", textwrap.dedent(code)], environment, tmp_path).stdout


@pytest.mark.parametrize("policy, expected", [("Active", "openmp"), ("PASSIVE", "pool"), (None, "pool")])
def test_openmps_threads_serve_where_they_spin_else_the_pool(kernels, policy, expected, tmp_path):
    code = """
        from hf_layerfusion.inference.cpu_kernels import compiled_kernels
        print(compiled_kernels().parallel_backend())
    """
    assert python_output(code, tmp_path, OMP_WAIT_POLICY=policy).split() == [expected]


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


def test_torchs_operators_run_on_one_thread_beside_the_pool_and_get_their_threads_back(kernels, thread_count,
                                                                                        backend):
    thread_count(2)
    with torch_operators_on_one_thread():
        inside = torch.get_num_threads(), kernels.kernel_threads(), kernels.parallel_for_threads(64, rounds=10)
    # on OpenMP's threads the kernels share torch's count: nothing changes
    assert inside == ((1, 2, 2) if backend == "pool" else (2, 2, 2))
    assert (torch.get_num_threads(), kernels.kernel_threads()) == (2, 2)
    with pytest.raises(KeyError), torch_operators_on_one_thread():
        raise KeyError("inside")
    assert (torch.get_num_threads(), kernels.kernel_threads()) == (2, 2)
    with pytest.raises(RuntimeError, match="threads is 0 .torch's count. to 1024, got -1"):
        kernels.set_kernel_threads(-1)


class ThreadCounts(LogitsProcessor):
    """Records torch's and the kernels' thread counts at each decoding step, changing no score."""

    def __init__(self, kernels):
        self.kernels, self.seen = kernels, set()

    def __call__(self, input_ids, scores):
        self.seen.add((torch.get_num_threads(), self.kernels.kernel_threads()))
        return scores


def test_fast_generate_decodes_with_torchs_operators_on_one_thread_beside_the_pool(kernels, thread_count, backend):
    thread_count(2)
    model = tiny_model("gtrans", d_model=64)
    counts = ThreadCounts(kernels)
    input_ids = torch.randint(4, model.config.vocab_size, (3, 7), generator=torch.Generator().manual_seed(0))
    fast_generate(model, input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=5, num_beams=2,
                  logits_processor=LogitsProcessorList([counts]), fallback=False)
    assert counts.seen == ({(1, 2)} if backend == "pool" else {(2, 2)})
    assert torch.get_num_threads() == 2


def test_a_forked_child_makes_its_own_pool_and_exits(kernels, tmp_path):
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
    assert python_output(code, tmp_path, OMP_WAIT_POLICY="PASSIVE").split() == ["0", "2"]


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
