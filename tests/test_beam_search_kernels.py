"""Beam search's compiled kernels against what `generate()` does: `beam_top_k` (kernels/beam_top_k.cpp) against the
sum of log-probabilities and beam scores followed by `torch.topk`, and, through `search.top_k_continuations`, against
transformers' `_get_top_k_continuations`; `move_rows` (kernels/move_rows.cpp), the cache reorder, against
`index_copy_` of an `index_select`; and the fast loop's beam search without the kernels (the torch path)."""

import pytest
import torch
from helpers import tiny_model, tiny_sources
from transformers import GenerationConfig
from transformers.generation import GenerationMixin

import hf_layerfusion
from hf_layerfusion.inference import decoding, fast_decoding_loop, search


def candidate_scores(log_probs: torch.Tensor, beam_scores: torch.Tensor) -> torch.Tensor:
    """`generate()`'s candidates: `(items, beams * vocab)` scores, the same float32 additions."""
    items, beams = beam_scores.shape
    return (log_probs.view(items, beams, -1) + beam_scores[:, :, None]).view(items, -1)


def brute_force_top_k(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best candidates of each item by score, equal scores by index (lowest first): a stable full sort."""
    values, indices = torch.sort(scores, dim=-1, descending=True, stable=True)
    return values[:, :k], indices[:, :k]


@pytest.mark.parametrize(
    ("items", "beams", "vocab", "k"),
    [(32, 4, 8000, 8), (3, 2, 5, 10), (5, 4, 37, 8), (1, 1, 1, 1), (2, 3, 17, 51), (4, 5, 16, 3)],
)
def test_beam_top_k_is_the_sum_and_topk_of_generate(kernels, instruction_set, items, beams, vocab, k):
    generator = torch.Generator().manual_seed(items * 1000 + vocab)
    log_probs = torch.log_softmax(torch.randn(items * beams, vocab, generator=generator) * 3, dim=-1)
    beam_scores = torch.randn(items, beams, generator=generator) * 5
    beam_scores[0, 1:] = -1e9  # the first step: only the first beam is live
    scores = candidate_scores(log_probs, beam_scores)
    values, indices = kernels.beam_top_k(log_probs, beam_scores, k)
    assert torch.equal(values, torch.topk(scores, k).values)  # the same float32 sums, bit for bit
    # the candidates of torch.topk; those of the first item's dead beams tie at -1e9 (float32 rounds the log-probs
    # away): they rank by index
    assert torch.equal(indices, brute_force_top_k(scores, k)[1])
    if k <= vocab:
        assert torch.equal(indices, torch.topk(scores, k).indices)
    # rows further apart than the vocabulary (a view of wider logits)
    wide = torch.randn(items * beams, vocab + 9, generator=generator)
    values, indices = kernels.beam_top_k(wide[:, 4 : vocab + 4], beam_scores, k)
    assert torch.equal(values, torch.topk(candidate_scores(wide[:, 4 : vocab + 4].contiguous(), beam_scores), k)[0])


@pytest.mark.parametrize("vocab", [3, 16, 40, 1000])
def test_beam_top_k_ranks_equal_scores_by_index(kernels, instruction_set, vocab):
    """Equal scores (four levels; -inf rows, minimum-length EOS masking) rank lowest candidate index first, what a
    stable sort gives (`torch.topk` leaves the order of ties unspecified)."""
    generator = torch.Generator().manual_seed(vocab)
    items, beams = 6, 4
    log_probs = -torch.randint(0, 4, (items * beams, vocab), generator=generator).float()
    beam_scores = -torch.randint(0, 2, (items, beams), generator=generator).float()
    log_probs[0:beams] = -float("inf")  # an item whose every candidate is -inf
    log_probs[beams : 2 * beams, 1 : vocab] = -float("inf")  # fewer finite candidates than k
    log_probs[2 * beams :, 0] = -float("inf")  # EOS masked
    for k in (1, 5, 8, min(2 * vocab, beams * vocab)):
        values, indices = kernels.beam_top_k(log_probs, beam_scores, k)
        expected_values, expected_indices = brute_force_top_k(candidate_scores(log_probs, beam_scores), k)
        assert torch.equal(values, expected_values) and torch.equal(indices, expected_indices), k


def test_beam_top_k_hands_nan_items_to_torch(kernels):
    log_probs = torch.log_softmax(torch.randn(12, 50), dim=-1)
    beam_scores = torch.randn(3, 4)
    log_probs[5, 7] = float("nan")  # item 1
    beam_scores[2, 3] = float("nan")  # item 2
    values, indices = kernels.beam_top_k(log_probs, beam_scores, 8)
    expected_values, expected_indices = torch.topk(candidate_scores(log_probs, beam_scores), 8)
    torch.testing.assert_close(values, expected_values, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(indices, expected_indices)
    assert values[1, 0].isnan() and indices[1, 0] == 50 + 7


def test_beam_top_k_names_bad_inputs(kernels):
    log_probs, beam_scores = torch.zeros(8, 5), torch.zeros(2, 4)
    with pytest.raises(RuntimeError, match=r"float32 CPU \(items \* beams, vocab\) .* got Double"):
        kernels.beam_top_k(log_probs.double(), beam_scores, 2)
    with pytest.raises(RuntimeError, match=r"got Float \[5, 8\]"):
        kernels.beam_top_k(log_probs.t(), beam_scores, 2)
    with pytest.raises(RuntimeError, match=r"one score per row of the log-probabilities \(8 rows\), got Float \[3, 4\]"):
        kernels.beam_top_k(log_probs, torch.zeros(3, 4), 2)
    for k in (0, 21):
        with pytest.raises(RuntimeError, match=rf"k must be in \[1, beams \* vocab = 20\], got {k}"):
            kernels.beam_top_k(log_probs, beam_scores, k)


@pytest.mark.parametrize("strided", [False, True])
def test_top_k_continuations_are_those_of_transformers(kernels, monkeypatch, strided):
    """`search.top_k_continuations` (the kernel) and its torch path give what transformers' helper gives: scores,
    sequences with the new token, beam indices with the batch offset; for sequences and beam indices of any layout
    (strided: slices of wider tensors, as the search's widened ones can be)."""
    generator = torch.Generator().manual_seed(0)
    batch_size, num_beams, vocab, max_length, cur_len = 5, 3, 30, 12, 4
    log_probs = torch.log_softmax(torch.randn(batch_size * num_beams, vocab, generator=generator), dim=-1)
    beam_scores = torch.randn(batch_size, num_beams, generator=generator)
    step = 2 if strided else 1
    sequences = torch.randint(0, vocab, (batch_size, num_beams, step * max_length), generator=generator)[:, :, ::step]
    beam_indices = torch.randint(0, batch_size * num_beams, (batch_size, num_beams, step * (max_length - 1)),
                                 generator=generator).to(torch.int32)[:, :, ::step]
    assert sequences.is_contiguous() != strided and beam_indices.is_contiguous() != strided
    arguments = dict(cur_len=cur_len, decoder_prompt_len=1, beams_to_keep=2 * num_beams, num_beams=num_beams,
                     batch_size=batch_size)
    expected = GenerationMixin._get_top_k_continuations(
        GenerationMixin(), accumulated_log_probs=candidate_scores(log_probs, beam_scores),
        running_sequences=sequences.clone(), running_beam_indices=beam_indices.clone(), do_sample=False, **arguments
    )
    for available in (True, False):
        if not available:
            monkeypatch.setattr(search, "compiled_kernels", lambda: None)
        actual = search.top_k_continuations(
            GenerationMixin(), log_probs.clone(), beam_scores, sequences.clone(), beam_indices.clone(), **arguments
        )
        for got, want in zip(actual, expected):
            assert got.dtype == want.dtype and torch.equal(got, want), available


def test_top_k_continuations_name_bad_inputs(kernels):
    log_probs = torch.log_softmax(torch.randn(6, 11), dim=-1)
    beam_scores = torch.randn(3, 2)
    sequences = torch.randint(0, 11, (3, 2, 8))
    beam_indices = torch.randint(0, 6, (3, 2, 7)).to(torch.int32)
    call = kernels.beam_top_k_continuations
    with pytest.raises(RuntimeError, match="running sequences must be int64 \\(3, 2, width\\), got Int"):
        call(log_probs, beam_scores, 4, sequences.int(), beam_indices, 5, 3)
    with pytest.raises(RuntimeError, match="running beam indices must be int32 \\(3, 2, width\\), got Long"):
        call(log_probs, beam_scores, 4, sequences, beam_indices.long(), 5, 3)
    with pytest.raises(RuntimeError, match="cur_len 8 is outside the sequences' 8 positions"):
        call(log_probs, beam_scores, 4, sequences, beam_indices, 8, 3)
    with pytest.raises(RuntimeError, match="beam_index_column -1 is outside the beam indices' 7 columns"):
        call(log_probs, beam_scores, 4, sequences, beam_indices, 5, -1)


def moves_of(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A beam reorder's moves, as `_SelfAttentionCache.select` makes them: the rows whose beam changed."""
    targets = torch.nonzero(index != torch.arange(index.shape[0])).squeeze(1)
    return targets, index[targets]


def test_move_rows_is_index_copy_of_index_select(kernels):
    generator = torch.Generator().manual_seed(0)
    for trial in range(300):
        rows = int(torch.randint(1, 13, (), generator=generator))
        if trial % 3 == 0:  # a permutation: cycles (beams trading places)
            targets, sources = torch.arange(rows), torch.randperm(rows, generator=generator)
        else:  # a beam reorder: some rows copied into several
            targets, sources = moves_of(torch.randint(0, rows, (rows,), generator=generator))
        buffers = [
            torch.randn(rows, 5, 2, 3, generator=generator),
            torch.randn(rows, 9, 4, generator=generator)[:, 2:6],  # rows further apart than their filled part
            torch.randint(0, 100, (rows, 7), generator=generator),  # any element type
        ]
        expected = [buffer.clone() for buffer in buffers]
        for buffer in expected:
            buffer.index_copy_(0, targets, buffer.index_select(0, sources))
        kernels.move_rows(buffers, targets.to(torch.int32) if trial % 2 else targets, sources)
        for buffer, want in zip(buffers, expected):
            assert torch.equal(buffer, want), (trial, targets, sources)


def test_move_rows_names_bad_inputs(kernels):
    buffer = torch.zeros(4, 3)
    with pytest.raises(RuntimeError, match="row 2 is the target of two moves"):
        kernels.move_rows([buffer], torch.tensor([2, 2]), torch.tensor([0, 1]))
    with pytest.raises(RuntimeError, match=r"move 1 \(row 4 into row 0\) is outside the 4 rows"):
        kernels.move_rows([buffer], torch.tensor([1, 0]), torch.tensor([0, 4]))
    with pytest.raises(RuntimeError, match="int64 or int32 CPU vectors of one length, got Float"):
        kernels.move_rows([buffer], torch.tensor([1.0]), torch.tensor([0]))
    with pytest.raises(RuntimeError, match=r"every buffer must be a CPU tensor of 4 rows .* buffer 1 has sizes \[3, 3\]"):
        kernels.move_rows([buffer, torch.zeros(3, 3)], torch.tensor([1]), torch.tensor([0]))
    with pytest.raises(RuntimeError, match="each row of a buffer must be contiguous, buffer 0 has strides"):
        kernels.move_rows([torch.zeros(4, 6)[:, ::2]], torch.tensor([1]), torch.tensor([0]))


def test_a_reorder_through_key_rows_reads_what_moving_the_rows_holds(kernels):
    """`_SelfAttentionCache` with `reorders_key_rows` (beam reorders and rows leaving change `key_rows`) against one
    that moves the rows (`move_rows`, new buffers of the rows kept): after random steps, reorders and rows leaving the
    batch, each row's keys/values at each position, and `decode_attention` through `key_rows`, are the moved cache's
    bit for bit; reading the slots any other way (`update`) first gives each row its own."""
    generator = torch.Generator().manual_seed(0)
    for trial in range(20):
        rows, heads, head_dim, capacity = 12, 2, 16, 24
        by_index, moved = decoding._SelfAttentionCache(capacity), decoding._SelfAttentionCache(capacity)
        by_index.reorders_key_rows = True
        for cache in (by_index, moved):
            for slot in range(3):
                cache.open_slot(slot, torch.empty(rows, heads, 0, head_dim))
        for step in range(int(torch.randint(2, capacity, (), generator=generator))):
            # a step writes each row's position into its own buffer row, as the compiled step does
            for slot in range(3):
                keys, values = (torch.randn(rows, heads, head_dim, generator=generator) for _ in range(2))
                for cache in (by_index, moved):  # rows that left keep their buffer rows in `by_index`
                    cache.slots[slot].keys[:rows, step], cache.slots[slot].values[:rows, step] = keys, values
                    cache.slots[slot].length += 1
            if rows > 1 and int(torch.randint(0, 6, (), generator=generator)) == 0:  # rows leave the batch
                index = torch.randperm(rows, generator=generator)[: max(1, rows - 1 - step % 2)].sort().values
                rows = index.shape[0]
                dropped = True
            else:
                index, dropped = torch.randint(0, rows, (rows,), generator=generator), False
            for cache in (by_index, moved):
                cache.select(index, rows_dropped=dropped)
            assert by_index.key_rows.shape[0] == rows and by_index.slots[0].keys.shape[0] == 12, trial
            assert moved.key_rows is None and moved.slots[0].keys.shape[0] == rows, trial
            length = step + 1
            query = torch.randn(rows, heads, 1, head_dim, generator=generator)
            for slot in range(3):
                got, want = by_index.slots[slot], moved.slots[slot]
                key_rows = by_index.key_rows[:, :length]
                positions = torch.arange(length)
                assert torch.equal(got.keys[key_rows, positions], want.keys[:, :length]), (trial, step, slot)
                assert torch.equal(got.values[key_rows, positions], want.values[:, :length]), (trial, step, slot)
                attention = kernels.decode_attention(
                    query, got.keys[:, :length].transpose(1, 2), got.values[:, :length].transpose(1, 2), None, 0.25,
                    key_rows,
                )
                expected = kernels.decode_attention(
                    query, want.keys[:, :length].transpose(1, 2), want.values[:, :length].transpose(1, 2), None, 0.25
                )
                assert torch.equal(attention, expected), (trial, step, slot)
        # the Python path's `update` reads the slots as views: each row's own keys/values first
        keys, values = torch.randn(rows, heads, 1, head_dim), torch.randn(rows, heads, 1, head_dim)
        for got, want in zip(by_index.update(keys, values, 0), moved.update(keys, values, 0)):
            assert torch.equal(got, want), trial
        assert by_index.key_rows is None


@pytest.mark.parametrize("model_type", sorted(hf_layerfusion.FAMILIES))
def test_beam_search_without_the_kernels_gives_the_tokens_of_generate(model_type, monkeypatch):
    """The torch path of the loop's beam search (transformers' helper for the candidates, `index_copy_` for the
    cache reorder), where the kernels are not compiled, gives `generate()`'s tokens."""
    model, source = tiny_model(model_type), tiny_sources()
    settings = dict(num_beams=3, max_new_tokens=10)
    with torch.no_grad():
        expected = model.generate(**source, **settings)
        for module in (search, decoding):
            monkeypatch.setattr(module, "compiled_kernels", lambda: None)
        actual = model.generate(**source, custom_generate=fast_decoding_loop(fallback=False), **settings)
    assert torch.equal(actual, expected)


def clone_state(state: search.BeamState) -> search.BeamState:
    copy = object.__new__(search.BeamState)
    for name in search.BeamState.__slots__:
        setattr(copy, name, getattr(state, name).clone())
    return copy


@pytest.mark.parametrize(
    "settings",
    [dict(num_beams=3), dict(num_beams=4, early_stopping=True), dict(num_beams=3, early_stopping="never",
     length_penalty=0.3), dict(num_beams=2, length_penalty=-0.5), dict(num_beams=3, length_penalty=2),
     dict(num_beams=1, length_penalty=0.0), dict(num_beams=3, eos=(2, 5))],
)
def test_finish_step_is_that_of_transformers_helpers(kernels, monkeypatch, settings):
    """`search.finish_step` through the compiled `beam_finish_step` against transformers' helpers
    (`_get_running_beams_for_next_iteration`, `_update_finished_beams`, `_check_early_stop_heuristic`,
    `_beam_search_has_unfinished_sequences`), step by step along searches over random log-probabilities (the states
    a search reaches; both continue from the kernel's state): the running beams, the reorder, the finished scores and
    flags, the heuristic, which items are frozen and whether the search goes on, bit for bit. The finished slots still
    at -1e9 hold whichever unfinished candidate tied there (torch.topk leaves the order of equal scores unspecified):
    their sequences are compared where the slot holds a finished beam."""
    eos = settings.pop("eos", (2,))
    config = GenerationConfig(**{"early_stopping": False, "length_penalty": 1.0, **settings})
    eos_tokens = torch.tensor(eos)
    batch_size, vocab, max_length, num_beams = 6, 12, 11, config.num_beams
    beams_to_keep = max(2, 1 + len(eos)) * num_beams
    generator = torch.Generator().manual_seed(num_beams * 7 + len(eos))
    for trial in range(12):
        prompt = torch.zeros(batch_size * num_beams, 1, dtype=torch.int64)
        state = search.BeamState(prompt, batch_size, num_beams, max_length, fill_value=0)
        cur_len, goes_on = 1, True
        while goes_on:
            logits = torch.randn(batch_size * num_beams, vocab, generator=generator) * 2
            logits[:, list(eos)] += float(torch.rand((), generator=generator)) * 3  # end tokens often chosen
            log_probs = torch.log_softmax(logits, dim=-1)
            candidates = search.top_k_continuations(
                GenerationMixin(), log_probs, state.running_beam_scores, state.running_sequences,
                state.running_beam_indices, cur_len, 1, beams_to_keep, num_beams, batch_size,
            )
            by_helpers = clone_state(state)
            source_rows, frozen, goes_on = search.finish_step(
                GenerationMixin(), state, *candidates, eos_tokens, cur_len, 1, max_length, config
            )
            with monkeypatch.context() as patched:
                patched.setattr(search, "compiled_kernels", lambda: None)
                want_rows, want_frozen, want_goes_on = search.finish_step(
                    GenerationMixin(), by_helpers, *candidates, eos_tokens, cur_len, 1, max_length, config
                )
            where = (trial, cur_len)
            assert goes_on == want_goes_on and torch.equal(frozen, want_frozen), where
            for name in ("beam_scores", "is_sent_finished", "is_early_stop_heuristic_unsatisfied"):
                got, want = getattr(state, name), getattr(by_helpers, name)
                assert got.dtype == want.dtype and torch.equal(got, want), (where, name)
            finished = state.is_sent_finished
            assert torch.equal(state.sequences[finished], by_helpers.sequences[finished]), where
            assert torch.equal(state.beam_indices[finished], by_helpers.beam_indices[finished]), where
            if goes_on:  # after the last step the running beams are never read
                assert source_rows.dtype == want_rows.dtype and torch.equal(source_rows, want_rows), where
                for name in ("running_sequences", "running_beam_scores", "running_beam_indices"):
                    got, want = getattr(state, name), getattr(by_helpers, name)
                    assert got.dtype == want.dtype and torch.equal(got, want), (where, name)
            cur_len += 1


def test_beam_finish_step_names_bad_inputs(kernels):
    items, beams, k, width = 2, 3, 6, 5
    state = search.BeamState(torch.zeros(items * beams, 1, dtype=torch.int64), items, beams, width, fill_value=0)
    candidates = (torch.randn(items, k), torch.zeros(items, k, width, dtype=torch.int64),
                  torch.zeros(items, k, width - 1, dtype=torch.int32))
    tensors = [state.running_sequences, state.running_beam_scores, state.running_beam_indices, state.sequences,
               state.beam_scores, state.beam_indices, state.is_sent_finished, state.is_early_stop_heuristic_unsatisfied]

    def call(*replaced, early_stopping=0, cur_len=1):
        arguments = list(candidates) + tensors
        for position, tensor in replaced:
            arguments[position] = tensor
        return kernels.beam_finish_step(*arguments, torch.tensor([2]), cur_len, 1, 10, 1.0, early_stopping)

    with pytest.raises(RuntimeError, match=r"the finished scores must be contiguous Float CPU \(2, 3\), got Double"):
        call((7, state.beam_scores.double()))
    with pytest.raises(RuntimeError, match=r"the candidates' sequences must be .* \(not contiguous\)"):
        call((1, torch.zeros(items, k, 2 * width, dtype=torch.int64)[:, :, ::2]))
    with pytest.raises(RuntimeError, match=r"early_stopping must be 0 \(False\), 1 \(True\) or 2 .* got 3"):
        call(early_stopping=3)
    with pytest.raises(RuntimeError, match="cur_len 5 .* outside the sequences' 5 positions"):
        call(cur_len=5)
    with pytest.raises(RuntimeError, match=r"candidates \(items, k >= beams\), got \[2, 3\] and \[2, 2\]"):
        call((0, torch.randn(items, 2)))
