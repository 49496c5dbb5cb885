"""The decoding-attention kernel of the inference copies (kernels/decode_attention.cpp) against softmax attention written out
in numpy (float64), in the layouts the decoding loop gives it; the attention implementation that dispatches to it or
to SDPA; the in-place beam reorder of the decoding cache against a plain gather."""

import numpy as np
import pytest
import torch
from helpers import CountingKernels, tiny_model, tiny_sources
from transformers.integrations.sdpa_attention import sdpa_attention_forward

import hf_layerfusion
from hf_layerfusion.inference import decoding_attention, fast_generate
from hf_layerfusion.inference.decoding import _SelfAttentionCache
from hf_layerfusion.inference.decoding_attention import (
    DECODING_ATTENTION,
    decode_attention_applies,
    decoding_attention_forward,
)
from hf_layerfusion.inference.inference_copies import KernelResidualSublayer, prepare_for_inference


def brute_force_attention(query, key, value, mask, scaling) -> np.ndarray:
    """softmax(q k^T * scaling, masked keys excluded) v per row, head and query, in float64; zeros where every key
    is masked. (rows, heads, queries, d) -> (rows, queries, heads, d)."""
    q, k, v = (t.double().numpy() for t in (query, key, value))
    rows, heads, queries, _ = q.shape
    keep = np.ones((rows, 1, queries, k.shape[2]), bool) if mask is None else np.broadcast_to(
        mask.numpy(), (rows, 1, queries, k.shape[2]))
    out = np.zeros((rows, queries, heads, v.shape[-1]))
    for r in range(rows):
        for h in range(heads):
            for i in range(queries):
                allowed = keep[r, 0, i]
                if not allowed.any():
                    continue
                scores = (k[r, h] @ q[r, h, i]) * scaling
                weights = np.where(allowed, np.exp(scores - scores[allowed].max()), 0.0)
                out[r, i, h] = weights @ v[r, h] / weights.sum()
    return out


def position_major(rows, heads, keys, head_dim, capacity=40):
    """keys/values as the decoding cache holds them: (capacity, rows, heads, d) buffers, read as permuted views."""
    buffers = [torch.randn(capacity, rows, heads, head_dim) for _ in range(2)]
    return [buffer[:keys].permute(1, 2, 0, 3) for buffer in buffers]


@pytest.mark.parametrize("head_dim", [16, 32, 48, 64, 128])
@pytest.mark.parametrize("queries", [1, 4])
def test_kernel_is_softmax_attention(kernels, instruction_set, head_dim, queries):
    torch.manual_seed(head_dim + queries)
    rows, heads, keys = 5, 3, 37  # keys: two 16-float blocks and a partial one
    query = torch.randn(rows, heads, queries, head_dim)
    key, value = torch.randn(rows, heads, keys, head_dim) * 2, torch.randn(rows, heads, keys, head_dim)
    per_row = torch.rand(rows, 1, 1, keys) > 0.4  # a padding mask, shared by the query positions
    per_query = torch.rand(rows, 1, queries, keys) > 0.4
    per_row[1] = False  # every key masked: zeros, as SDPA gives
    for mask in (None, per_row, per_query, per_row[:1]):
        expected = brute_force_attention(query, key, value, mask, 0.3)
        output = kernels.decode_attention(query, key, value, mask, 0.3)
        assert output.shape == (rows, queries, heads, head_dim) and output.is_contiguous()
        np.testing.assert_allclose(output.numpy(), expected, rtol=1e-5, atol=1e-5)
    fully_masked = kernels.decode_attention(query, key, value, per_row, 0.3)[1]
    assert torch.equal(fully_masked, torch.zeros(queries, heads, head_dim))
    # masked keys are not read: what they hold (here NaN) does not reach the output
    poisoned_key, poisoned_value = key.clone(), value.clone()
    poisoned_key.masked_fill_(~per_row.transpose(2, 3), float("nan"))
    poisoned_value.masked_fill_(~per_row.transpose(2, 3), float("nan"))
    assert torch.equal(kernels.decode_attention(query, poisoned_key, poisoned_value, per_row, 0.3),
                       kernels.decode_attention(query, key, value, per_row, 0.3))


def test_kernel_reads_the_decoding_caches_layouts(kernels, instruction_set):
    """Self-attention keys as position-major views (strided positions), queries folded from beams (a transposed
    view), and a few keys only (fewer than one 16-float block)."""
    torch.manual_seed(0)
    for keys in (1, 5, 33):
        key, value = position_major(6, 4, keys, 32)
        query = torch.randn(6, 2, 4, 32).transpose(1, 2)  # (rows, heads, queries, d), not contiguous
        expected = brute_force_attention(query, key, value, None, 32**-0.5)
        np.testing.assert_allclose(kernels.decode_attention(query, key, value, None, 32**-0.5).numpy(), expected,
                                   rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask_kind", ["none", "per_row", "shared"])
def test_buffer_rows_read_the_rows_they_name(kernels, instruction_set, mask_kind):
    """`buffer_rows` (the cross-attention keys once rows left the batch): each row reads the keys, values and mask row
    it names, exactly as the kernel on those rows gathered; rows nobody names are not read (NaN there changes
    nothing); queries folded from beams (several per key row) and repeated names included."""
    torch.manual_seed(1)
    buffer, heads, keys, head_dim = 7, 2, 21, 32
    key, value = torch.randn(buffer, heads, keys, head_dim), torch.randn(buffer, heads, keys, head_dim)
    mask = {"none": None, "per_row": torch.rand(buffer, 1, 1, keys) > 0.3,
            "shared": torch.rand(1, 1, 1, keys) > 0.3}[mask_kind]
    for rows in ([6, 2, 3], [4, 4], [0]):
        buffer_rows = torch.tensor(rows)
        poisoned_key, poisoned_value = key.clone(), value.clone()
        unnamed = [row for row in range(buffer) if row not in rows]
        poisoned_key[unnamed], poisoned_value[unnamed] = float("nan"), float("nan")
        query = torch.randn(len(rows), heads, 3, head_dim)
        gathered_mask = mask if mask is None or mask.shape[0] == 1 else mask[buffer_rows]
        expected = kernels.decode_attention(query, key[buffer_rows], value[buffer_rows], gathered_mask, 0.3)
        output = kernels.decode_attention(query, poisoned_key, poisoned_value, mask, 0.3, buffer_rows=buffer_rows)
        assert torch.equal(output, expected), rows
        np.testing.assert_allclose(output.numpy(), brute_force_attention(
            query, key[buffer_rows], value[buffer_rows], gathered_mask, 0.3), rtol=1e-5, atol=1e-5)


def test_buffer_rows_name_bad_inputs(kernels):
    query, key = torch.randn(2, 2, 1, 16), torch.randn(4, 2, 5, 16)
    with pytest.raises(RuntimeError, match=r"buffer_rows\[1\] = 4 is outside the 4 rows of the keys"):
        kernels.decode_attention(query, key, key, None, 1.0, buffer_rows=torch.tensor([0, 4]))
    with pytest.raises(RuntimeError, match=r"buffer_rows\[0\] = -1 is outside"):
        kernels.decode_attention(query, key, key, None, 1.0, buffer_rows=torch.tensor([-1, 0]))
    with pytest.raises(RuntimeError, match=r"buffer_rows must be contiguous int64 \(2,\), got Int"):
        kernels.decode_attention(query, key, key, None, 1.0, buffer_rows=torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(RuntimeError, match=r"buffer_rows must be contiguous int64 \(2,\)"):
        kernels.decode_attention(query, key, key, None, 1.0, buffer_rows=torch.tensor([0, 1, 2]))
    with pytest.raises(RuntimeError, match="give key_rows or buffer_rows, not both"):
        kernels.decode_attention(query, key, key, None, 1.0, key_rows=torch.zeros(2, 5, dtype=torch.int64),
                                 buffer_rows=torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match=r"the mask must be bool \(4 or 1, 1, 1 or 1, 5\)"):  # the buffer's rows
        kernels.decode_attention(query, key, key, torch.ones(2, 1, 1, 5, dtype=torch.bool), 1.0,
                                 buffer_rows=torch.tensor([0, 1]))


def test_kernel_weighs_far_lower_scores_exactly_zero(kernels, instruction_set):
    """Scores more than 87 below the maximum underflow to weight 0 (no subnormal arithmetic): the output is then the
    top key's value, exactly as in float arithmetic."""
    key = torch.zeros(1, 1, 3, 16)
    key[0, 0, 0, 0], key[0, 0, 1, 0], key[0, 0, 2, 0] = 100.0, 0.0, -100.0
    value = torch.randn(1, 1, 3, 16)
    output = kernels.decode_attention(torch.ones(1, 1, 1, 16), key, value, None, 1.0)
    assert torch.equal(output[0, 0, 0], value[0, 0, 0])


def test_kernel_names_bad_inputs(kernels):
    query, key = torch.randn(2, 2, 1, 16), torch.randn(2, 2, 5, 16)
    with pytest.raises(RuntimeError, match="head_dim must be a multiple of 16 up to 128, got 8"):
        kernels.decode_attention(torch.randn(2, 2, 1, 8), torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8), None, 1.0)
    with pytest.raises(RuntimeError, match="query must be a 4-D float32 CPU tensor, got 4-D Double"):
        kernels.decode_attention(query.double(), key, key, None, 1.0)
    with pytest.raises(RuntimeError, match="key .* and value .* must be"):
        kernels.decode_attention(query, key, torch.randn(2, 2, 4, 16), None, 1.0)
    with pytest.raises(RuntimeError, match="the mask must be bool"):
        kernels.decode_attention(query, key, key, torch.ones(2, 1, 1, 4, dtype=torch.bool), 1.0)
    with pytest.raises(RuntimeError, match="the mask must be bool"):
        kernels.decode_attention(query, key, key, torch.zeros(2, 1, 1, 5), 1.0)


class _Attention(torch.nn.Module):
    def __init__(self, is_causal: bool):
        super().__init__()
        self.is_causal = is_causal


def test_the_attention_implementation_runs_the_kernel_at_decoding_steps_only(kernels):
    torch.manual_seed(0)
    query, key, value = torch.randn(3, 2, 1, 32), torch.randn(3, 2, 9, 32), torch.randn(3, 2, 9, 32)
    mask = torch.rand(3, 1, 1, 9) > 0.3
    mask[:, :, :, 0] = True
    output, weights = decoding_attention_forward(_Attention(True), query, key, value, mask, scaling=0.2)
    assert weights is None and torch.equal(output, kernels.decode_attention(query, key, value, mask, 0.2))
    output, _ = decoding_attention_forward(_Attention(False), query, key, value, None)  # default scaling d^-0.5
    assert torch.equal(output, kernels.decode_attention(query, key, value, None, 32**-0.5))

    def applies(module=_Attention(False), query=query, key=key, value=value, mask=mask, dropout=0.0, **kwargs):
        return decode_attention_applies(module, query, key, value, mask, dropout, kwargs)

    many = torch.randn(3, 2, 17, 32)
    assert applies() and applies(query=torch.randn(3, 2, 16, 32)) and applies(_Attention(True), mask=None)
    assert not applies(query=many)  # more queries than a decoding step has: SDPA
    assert not applies(_Attention(True), query=torch.randn(3, 2, 4, 32), mask=None)  # causal among the queries
    assert applies(_Attention(True), query=torch.randn(3, 2, 4, 32), mask=None, is_causal=False)
    assert not applies(dropout=0.1)
    assert not applies(query=query.double(), key=key.double(), value=value.double())
    assert not applies(query=query[..., :8], key=key[..., :8], value=value[..., :8])
    assert not applies(key=key[:, :1], value=value[:, :1])  # grouped key heads
    assert not applies(mask=torch.zeros(3, 1, 1, 9))  # an additive float mask
    assert not applies(mask=mask.expand(3, 2, 1, 9))  # a mask per head
    assert not applies(mask=mask[:, :, :, :1].expand(3, 1, 1, 9))  # keys not contiguous
    assert not applies(mask=mask[:2])  # rows that do not match
    assert not applies(query=torch.randn(3, 2, 1, 64)[..., ::2])  # head_dim not contiguous
    assert not applies(position_bias=torch.zeros(1, 2, 1, 9))
    assert not applies(output_attentions=True)
    # where it does not apply, it is SDPA itself
    for kwargs in ({"query": many}, {"dropout": 0.0, "mask": torch.zeros(3, 1, 1, 9)}):
        q, m = kwargs.get("query", query), kwargs.get("mask", mask)
        expected, _ = sdpa_attention_forward(_Attention(False), q, key, value, m, scaling=0.2)
        assert torch.equal(decoding_attention_forward(_Attention(False), q, key, value, m, scaling=0.2)[0], expected)


def test_without_the_kernels_the_attention_implementation_is_sdpa(monkeypatch):
    query, key, value = torch.randn(3, 2, 1, 32), torch.randn(3, 2, 9, 32), torch.randn(3, 2, 9, 32)
    monkeypatch.setattr(decoding_attention, "compiled_kernels", lambda: None)
    expected, _ = sdpa_attention_forward(_Attention(False), query, key, value, None, scaling=0.2)
    assert torch.equal(decoding_attention_forward(_Attention(False), query, key, value, None, scaling=0.2)[0], expected)


def test_the_int8_copy_attends_with_it_and_the_model_keeps_its_own(kernels):
    model = tiny_model("plain_transformer").eval()
    engine = prepare_for_inference(model, "int8")
    assert engine.config._attn_implementation == DECODING_ATTENTION
    assert model.config._attn_implementation == "sdpa"


def test_a_beam_reorder_in_place_is_a_gather_of_the_rows():
    """`_SelfAttentionCache.select` moves only the rows whose beam changed, in place: what attention reads after it
    must be the gather `cache[index]` for any index (cycles, rows copied twice, rows kept)."""
    torch.manual_seed(0)
    cache = _SelfAttentionCache(capacity=6)
    for _ in range(4):
        cache.update(torch.randn(5, 2, 1, 4), torch.randn(5, 2, 1, 4), layer_idx=0)
    slot = cache.slots[0]
    for index in ([1, 2, 0, 3, 4], [0, 0, 2, 2, 4], [4, 3, 2, 1, 0], [0, 1, 2, 3, 4]):
        index = torch.tensor(index)
        keys, values = cache.update(torch.empty(5, 2, 0, 4), torch.empty(5, 2, 0, 4), layer_idx=0)  # the views read
        keys, values = keys.clone(), values.clone()
        cache.select(index, rows_dropped=False)
        assert torch.equal(slot.keys[:, :4].transpose(1, 2), keys[index])
        assert torch.equal(slot.values[:, :4].transpose(1, 2), values[index])
    cache.select(torch.tensor([3, 1]), rows_dropped=True)
    assert slot.keys.shape[0] == 2 and torch.equal(slot.keys[:, :4].transpose(1, 2), keys[index][[3, 1]])


@pytest.mark.parametrize("model_type", sorted(hf_layerfusion.FAMILIES))
def test_int8_translations_with_the_kernel_are_those_with_sdpa(kernels, model_type, monkeypatch):
    """Every family's int8 copy, with head_dim 16 (the kernel's smallest), translates through the kernel at every
    decoding step, greedy and beam search, to the tokens its attention gives through SDPA. Its sub-layers run their
    Python path here (the attention interface picks the kernel or SDPA there); the compiled sub-layer steps, which call
    the kernel from C++, give that path's numbers bit for bit (tests/test_decoding_step_kernels.py)."""
    model = tiny_model(model_type, d_model=32)
    source = tiny_sources()
    engine = prepare_for_inference(model, "int8")
    for block in engine.modules():
        if isinstance(block, KernelResidualSublayer):
            monkeypatch.setattr(block, "decoding_step", None)
    counting = CountingKernels(kernels)
    monkeypatch.setattr(decoding_attention, "compiled_kernels", lambda: counting)
    for settings in ({"num_beams": 1}, {"num_beams": 3}):
        engine.set_attn_implementation(DECODING_ATTENTION)
        calls = counting.calls["decode_attention"]
        with_kernel = fast_generate(model, **source, max_new_tokens=8, quantization="int8", fallback=False, **settings)
        assert counting.calls["decode_attention"] - calls >= 8, settings  # at least one attention per decoding step
        engine.set_attn_implementation("sdpa")
        with_sdpa = fast_generate(model, **source, max_new_tokens=8, quantization="int8", fallback=False, **settings)
        assert torch.equal(with_kernel, with_sdpa), settings


def test_keys_after_a_prefix_are_the_concatenation_and_a_reorder_keeps_the_prefix():
    """`update_with_prefix` (layer-wise coordination's source keys before the target keys) returns what concatenating
    at every step returns, counts only the cached positions, and a beam reorder moves the cached part only."""
    torch.manual_seed(0)
    cache = _SelfAttentionCache(capacity=4)
    prefix = torch.randn(4, 2, 3, 8), torch.randn(4, 2, 3, 8)
    steps = [(torch.randn(4, 2, 1, 8), torch.randn(4, 2, 1, 8)) for _ in range(3)]
    for length, (keys, values) in enumerate(steps, start=1):
        got_keys, got_values = cache.update_with_prefix(keys, values, 0, *prefix)
        expected_keys = torch.cat([prefix[0], *(k for k, _ in steps[:length])], dim=2)
        expected_values = torch.cat([prefix[1], *(v for _, v in steps[:length])], dim=2)
        assert torch.equal(got_keys, expected_keys) and torch.equal(got_values, expected_values)
        assert cache.get_seq_length(0) == length
    cache.select(torch.tensor([1, 1, 3, 2]), rows_dropped=False)  # beams of two sentences of 2 beams
    got_keys, _ = cache.update_with_prefix(torch.zeros(4, 2, 0, 8), torch.zeros(4, 2, 0, 8), 0, *prefix)
    assert torch.equal(got_keys[:, :, 3:], expected_keys[[1, 1, 3, 2], :, 3:])
    assert torch.equal(got_keys[:, :, :3], prefix[0])  # the prefix stays (equal across a sentence's beams)
    with pytest.raises(RuntimeError, match="holds a prefix of 3 positions, not 2"):
        cache.update_with_prefix(steps[0][0], steps[0][1], 0, prefix[0][:, :, :2], prefix[1][:, :, :2])
    with pytest.raises(RuntimeError, match="5 positions exceed the capacity of 4"):
        for _ in range(2):
            cache.update_with_prefix(steps[0][0], steps[0][1], 0, *prefix)
