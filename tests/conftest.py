"""Shared tiny fixtures. Every test builds its models from these sizes so that the suite runs in seconds on CPU."""

import os
from pathlib import Path

import pytest
import torch

import hf_layerfusion  # noqa: F401  (registers the families with the Auto classes)

# Special ids of every hf_layerfusion config (fairseq convention); ordinary tokens start at FIRST_TOKEN_ID.
BOS, PAD, EOS, UNK = 0, 1, 2, 3
FIRST_TOKEN_ID = 4

TINY_BACKBONE = dict(
    vocab_size=24,
    d_model=16,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    max_position_embeddings=32,
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
)

# transformers' common-test harness: runs inside a copy of ../shared/hf-common-tests (tests/test_hf_common_tests.py),
# where the HF `tests` package it imports exists; collected here it would import this project's `tests` instead
collect_ignore = ["hf_common"]

SHARED_DIR = Path(__file__).resolve().parents[2] / "shared"
MULTI30K_DIR = SHARED_DIR / "data" / "multi30k"


def require_shared(path: Path, what: str) -> None:
    """Skip a test whose data from ../shared is missing, except in CI (`CI=true`), where a missing dataset is a
    failure: there the skip would silently hide the tests that need it."""
    if path.exists():
        return
    message = f"{what} not found at {path}"
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail(f"{message}; CI=true: the tests that need ../shared must run, not skip", pytrace=False)
    pytest.skip(message)


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
def multi30k_dir() -> Path:
    require_shared(MULTI30K_DIR / "train.en", "Multi30k data")
    return MULTI30K_DIR


def assert_incremental_decoding_matches_full_forward(model, source, decoder_input_ids, atol=1e-5, **forward_kwargs):
    """Feeds the target one token at a time through the KV cache (the encoder run once) and checks every step's
    logits against the full forward pass over the whole target, and that the cache grew by one position per step.
    Returns the final cache."""
    with torch.no_grad():
        full = model(**source, decoder_input_ids=decoder_input_ids, **forward_kwargs).logits
        encoder_outputs = model.get_encoder()(**source)
        past_key_values = None
        for step in range(decoder_input_ids.shape[1]):
            out = model(
                encoder_outputs=encoder_outputs,
                attention_mask=source["attention_mask"],
                decoder_input_ids=decoder_input_ids[:, step : step + 1],
                past_key_values=past_key_values,
                use_cache=True,
                **forward_kwargs,
            )
            past_key_values = out.past_key_values
            assert past_key_values.get_seq_length() == step + 1
            torch.testing.assert_close(out.logits[:, 0], full[:, step], atol=atol, rtol=0, msg=f"step {step}")
    return past_key_values
