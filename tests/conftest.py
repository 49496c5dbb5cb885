"""The suite's fixtures. Shared constants and functions are in tests/helpers.py (`from helpers import ...`)."""

import pytest
import torch
from helpers import EOS, FIRST_TOKEN_ID, MULTI30K_DIR, PAD, TINY_BACKBONE, instruction_sets_of_this_cpu, require_shared

from hf_layerfusion.inference.cpu_kernels import compiled_kernels, limit_instruction_set

# transformers' common-test harness: runs inside a copy of ../shared/hf-common-tests (tests/test_hf_common_tests.py),
# where the HF `tests` package it imports exists; collected here it would import this project's `tests` instead
collect_ignore = ["hf_common"]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    # tiny models run fastest single-threaded, and the CPU is shared with other test runs
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def kernels():
    """The compiled CPU kernels (hf_layerfusion/inference/kernels): a C++ compiler and ninja are test requirements."""
    compiled = compiled_kernels()
    assert compiled is not None, "the CPU kernels did not compile (a C++ compiler and ninja are test requirements)"
    return compiled


@pytest.fixture(params=instruction_sets_of_this_cpu())
def instruction_set(request, kernels) -> str:
    """Runs a test once per instruction set of the kernels this CPU has (`helpers.instruction_sets_of_this_cpu`),
    the kernels capped at it for the test's duration: every code path they ship, tested on this machine."""
    with limit_instruction_set(request.param):
        yield request.param


@pytest.fixture
def tiny_backbone() -> dict:
    """Backbone keys of a tiny config (d_model 16, 2+2 layers, no dropout); tests override what they need."""
    return dict(TINY_BACKBONE)


@pytest.fixture
def padded_batch():
    """A right-padded source batch of 3 sentences (lengths 7, 5, 3) and labels of lengths 5, 4, 2 padded with -100,
    every real sequence ending in EOS. Token ids lie in [FIRST_TOKEN_ID, TINY_BACKBONE['vocab_size'])."""
    generator = torch.Generator().manual_seed(1234)
    vocab = TINY_BACKBONE["vocab_size"]
    input_ids = torch.randint(FIRST_TOKEN_ID, vocab, (3, 7), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    labels = torch.randint(FIRST_TOKEN_ID, vocab, (3, 5), generator=generator)
    for row, (src_len, tgt_len) in enumerate([(7, 5), (5, 4), (3, 2)]):
        input_ids[row, src_len - 1] = EOS
        input_ids[row, src_len:] = PAD
        attention_mask[row, src_len:] = 0
        labels[row, tgt_len - 1] = EOS
        labels[row, tgt_len:] = -100
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


@pytest.fixture
def multi30k_dir():
    require_shared(MULTI30K_DIR / "train.en", "Multi30k data")
    return MULTI30K_DIR
