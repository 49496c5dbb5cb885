"""Incremental decoding with the KV cache equals the full forward for GTrans's group subsets and the backbone's modes
(pre-norm, learned positions; every family's default is in tests/test_family_contract.py); beam search on the GTrans
mixture is exact, and leaves the cross-attention keys/values in place."""

import itertools

import pytest
import torch
from helpers import (
    assert_cached_search_is_uncached_search,
    assert_incremental_decoding_matches_full_forward,
    source_of,
    tiny_model,
)

from hf_layerfusion import GTransConfig, GTransForConditionalGeneration, LayerFusionForConditionalGeneration

GTRANS_SIZES = dict(encoder_layers=3, decoder_layers=5, encoder_group_size=2, decoder_group_size=2)

# config overrides and the decoder groups mixed
CACHE_CASES = {
    "gtrans_all_groups": (GTRANS_SIZES, None),
    "gtrans_group_subset": (GTRANS_SIZES, [1, 2]),
    "gtrans_pre_norm": (dict(GTRANS_SIZES, normalize_before=True), None),
    "gtrans_learned_positions": (dict(GTRANS_SIZES, position_embedding_type="learned", layernorm_embedding=True), None),
}


def randomize_fusion(model, scale=1.0):
    """Non-zero fusion weights (the paper's zero start would make every gate and psi equal)."""
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("readout.weight", "layer_weight", "group_weight")):
                param.copy_(torch.randn(param.shape, generator=generator) * scale)


@pytest.mark.parametrize("case", sorted(CACHE_CASES))
def test_incremental_decoding_matches_full_forward(case, tiny_backbone, padded_batch):
    overrides, groups = CACHE_CASES[case]
    config = GTransConfig(**{**tiny_backbone, "init_std": 0.3, **overrides})
    model = GTransForConditionalGeneration(config).eval()
    randomize_fusion(model)
    source = source_of(padded_batch)
    decoder_input_ids = torch.randint(4, config.vocab_size, (3, 6))
    decoder_input_ids[:, 0] = config.decoder_start_token_id

    assert_incremental_decoding_matches_full_forward(model, source, decoder_input_ids, decoder_groups=groups)

    # generate() reorders the cache between beams: with and without it the search must agree
    group_kwargs = {} if groups is None else {"decoder_groups": groups}
    assert_cached_search_is_uncached_search(model, source, num_beams=3, **group_kwargs)


# ------------------------------------------------------------------------------------------- exhaustive beam
VOCAB = 5  # <s> <pad> </s> <unk> and one word
MAX_NEW_TOKENS = 4


def all_hypotheses(eos: int):
    """Every complete output: a prefix of non-EOS tokens closed by EOS, or MAX_NEW_TOKENS tokens (any last one)."""
    others = [t for t in range(VOCAB) if t != eos]
    for length in range(1, MAX_NEW_TOKENS + 1):
        for prefix in itertools.product(others, repeat=length - 1):
            lasts = range(VOCAB) if length == MAX_NEW_TOKENS else [eos]
            for last in lasts:
                yield (*prefix, last)


def mixture_scores(model, source, hypotheses):
    """Sum over each hypothesis of log sum_k psi_k P_k(y_t | y_<t, x), from one teacher-forced forward."""
    config = model.config
    start = config.decoder_start_token_id
    decoder_input_ids = torch.full((len(hypotheses), MAX_NEW_TOKENS), config.pad_token_id)
    targets = torch.full((len(hypotheses), MAX_NEW_TOKENS), -1)
    for row, hypothesis in enumerate(hypotheses):
        decoder_input_ids[row, : len(hypothesis)] = torch.tensor((start, *hypothesis[:-1]))
        targets[row, : len(hypothesis)] = torch.tensor(hypothesis)
    with torch.no_grad():
        out = model(
            input_ids=source["input_ids"].expand(len(hypotheses), -1),
            attention_mask=source["attention_mask"].expand(len(hypotheses), -1),
            decoder_input_ids=decoder_input_ids,
            return_group_log_probs=True,
        )
    psi = out.group_weights.double()
    log_mixture = torch.log((psi[:, None, None, None] * out.group_log_probs.double().exp()).sum(0))
    token_scores = log_mixture.gather(-1, targets.clamp(min=0)[..., None])[..., 0]
    return torch.where(targets >= 0, token_scores, 0.0).sum(-1)


def test_beam_search_on_mixture_is_exhaustive_search(tiny_backbone):
    config = GTransConfig(
        **{
            **tiny_backbone,
            "vocab_size": VOCAB,
            "decoder_layers": 4,
            "decoder_group_size": 1,  # 4 output groups
            "encoder_group_size": 1,
            "init_std": 0.5,
        }
    )
    model = GTransForConditionalGeneration(config).eval()
    randomize_fusion(model, scale=2.0)
    with torch.no_grad():
        model.final_logits_bias.normal_(generator=torch.Generator().manual_seed(5))
    assert model.config.num_decoder_groups == 4

    hypotheses = list(all_hypotheses(config.eos_token_id))
    assert len(hypotheses) == 1 + 4 + 16 + 64 * VOCAB
    source_batch = {
        "input_ids": torch.tensor([[4, 3, 4, 4, 2], [3, 2, 1, 1, 1]]),
        "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]),
    }
    top_n = 10
    # K = number of complete hypotheses: every step's candidates fit in the beam, so nothing is ever pruned
    generated = model.generate(
        **source_batch,
        num_beams=len(hypotheses),
        num_return_sequences=top_n,
        max_new_tokens=MAX_NEW_TOKENS,
        length_penalty=0.0,
        do_sample=False,
        output_scores=True,
        return_dict_in_generate=True,
    )
    start = [config.decoder_start_token_id]
    for row in range(2):
        source = {key: value[row : row + 1] for key, value in source_batch.items()}
        scores = mixture_scores(model, source, hypotheses)
        ranked = scores.topk(top_n)
        # HF: sequences_scores = sum of log-probs / length ** length_penalty; length_penalty = 0 -> the raw sum
        returned_scores = generated.sequences_scores[row * top_n : (row + 1) * top_n].double()
        torch.testing.assert_close(returned_scores, ranked.values, atol=1e-4, rtol=0)
        best = hypotheses[int(ranked.indices[0])]
        assert ranked.values[0] - ranked.values[1] > 1e-3, "near tie for the best: pick another seed"
        for rank in range(top_n):
            sequence = generated.sequences[row * top_n + rank].tolist()
            hypothesis = tuple(sequence[1 : 1 + MAX_NEW_TOKENS])
            if config.eos_token_id in hypothesis:  # finished early: the rest is batch padding
                hypothesis = hypothesis[: hypothesis.index(config.eos_token_id) + 1]
                assert all(token == config.pad_token_id for token in sequence[1 + len(hypothesis) :])
            assert sequence[:1] == start
            assert abs(float(scores[hypotheses.index(hypothesis)]) - float(returned_scores[rank])) < 1e-4
            if rank == 0:
                assert hypothesis == best


def test_beam_search_of_generate_reorders_only_self_attention(padded_batch, monkeypatch):
    """`generate()`'s beam search leaves the cross-attention keys/values in place (a sentence's beams share them):
    the same sequences and scores as reordering every cache slot."""
    source = source_of(padded_batch)
    # layer-wise coordination's mixed attention keeps the source keys in the cross-attention slots
    models = [tiny_model(model_type) for model_type in ("gtrans", "layerwise_coordination")]
    kwargs = dict(num_beams=3, max_new_tokens=8, output_scores=True, return_dict_in_generate=True)
    with torch.no_grad():
        partial = [model.generate(**source, **kwargs) for model in models]
        monkeypatch.delattr(LayerFusionForConditionalGeneration, "_reorder_cache")
        full = [model.generate(**source, **kwargs) for model in models]
    for reordered_self_only, reordered_all in zip(partial, full):
        assert torch.equal(reordered_self_only.sequences, reordered_all.sequences)
        assert torch.equal(reordered_self_only.sequences_scores, reordered_all.sequences_scores)
