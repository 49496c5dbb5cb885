"""The search loops of the fast decoding loop (`hf_layerfusion.inference.fast_generation`): greedy search and beam
search as `generate()` runs them, over `DecoderSteps`, with rows that can no longer change the output leaving the
batch."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import MinLengthLogitsProcessor, MinNewTokensLengthLogitsProcessor

from ..compat import (
    beam_search_has_unfinished_sequences,
    check_early_stop_heuristic,
    flatten_beam_dim,
    get_running_beams_for_next_iteration,
    get_top_k_continuations,
    special_token_tensors,
    unflatten_beam_dim,
    update_finished_beams,
)
from .cpu_kernels import compiled_kernels
from .decoding import DecoderSteps

# rows that can no longer change the output leave the batch once they are this share of the rows still computed, where
# dropping them copies the caches (so it is batched); where it does not (`DecoderSteps.drops_rows_without_copies`), as
# soon as one row can leave
COMPACTION_SHARE = 0.25
# beam search's sequence tensors are this many positions wider than needed so far and grow by as many when full,
# instead of `max_length` wide from the start: transformers' helpers gather and concatenate whole rows at every step
SEQUENCE_WIDTH_STEP = 32


def compaction_share(steps: DecoderSteps) -> float:
    """The share of the rows still computed that must be able to leave the batch before they do."""
    return 0.0 if steps.drops_rows_without_copies() else COMPACTION_SHARE


def apply_logits_processors(processors, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """`processors(input_ids, scores)`, with the minimum-length processors done in place: the same values as their
    `torch.where(eos_mask, -inf, scores)` on a clone, without two passes over `(rows, vocab)` per step."""
    for processor in processors:
        if type(processor) is MinNewTokensLengthLogitsProcessor:
            if input_ids.shape[-1] - processor.prompt_length_to_skip < processor.min_new_tokens:
                scores[:, processor.eos_token_id] = -float("inf")
        elif type(processor) is MinLengthLogitsProcessor:
            if input_ids.shape[-1] < processor.min_length:
                scores[:, processor.eos_token_id] = -float("inf")
        else:
            scores = type(processors)([processor])(input_ids, scores)
    return scores


def first_argmax(scores: torch.Tensor) -> torch.Tensor:
    """`scores.argmax(dim=-1)` of `(rows, vocab)` scores (`generate()`'s choice: the first maximal index, the first NaN
    in a row that has one), through the compiled kernel for float32 CPU scores (a tenth of torch's time at 32 x 8000),
    else `max`, which returns the same index 2-3x faster than `argmax` on CPU."""
    kernels = compiled_kernels() if scores.device.type == "cpu" and scores.dtype == torch.float32 else None
    if kernels is None or scores.dim() != 2 or scores.shape[1] == 0 or scores.stride(1) != 1:
        return scores.max(dim=-1).indices
    return kernels.first_argmax(scores)


def top_k_continuations(
    model,
    log_probs: torch.Tensor,
    running_beam_scores: torch.Tensor,
    running_sequences: torch.Tensor,
    running_beam_indices: torch.Tensor,
    cur_len: int,
    decoder_prompt_len: int,
    beams_to_keep: int,
    num_beams: int,
    batch_size: int,
):
    """transformers' `_get_top_k_continuations` (without sampling) of the candidates' scores
    `log_probs + running_beam_scores` (`(batch * beams, vocab)` and `(batch, beams)`): the best `beams_to_keep` of each
    batch item, their sequences and beam indices. For float32 CPU scores the compiled `beam_top_k_continuations`
    computes it in one call: the candidates by `beam_top_k` (one pass over each item's scores instead of their sum as
    a new tensor and `torch.topk`, about 2 ms per step at 32 x 4 x 8000 on one core), then the helper's gathers and
    writes (about ten torch operations per step); else the helper itself runs. The same
    candidates and scores (bit for bit: the same float32 additions); equal scores rank by candidate index, lowest
    first (`torch.topk` leaves their order unspecified)."""
    kernels = (
        compiled_kernels()
        if log_probs.device.type == "cpu" and log_probs.dtype == running_beam_scores.dtype == torch.float32
        else None
    )
    if kernels is None or log_probs.dim() != 2 or log_probs.stride(1) != 1:
        log_probs = unflatten_beam_dim(log_probs, batch_size, num_beams).add_(running_beam_scores[:, :, None])
        return get_top_k_continuations(
            model,
            accumulated_log_probs=torch.reshape(log_probs, (batch_size, -1)),
            running_sequences=running_sequences,
            running_beam_indices=running_beam_indices,
            cur_len=cur_len,
            decoder_prompt_len=decoder_prompt_len,
            do_sample=False,
            beams_to_keep=beams_to_keep,
            num_beams=num_beams,
            batch_size=batch_size,
        )
    return kernels.beam_top_k_continuations(
        log_probs, running_beam_scores, beams_to_keep, running_sequences, running_beam_indices, cur_len,
        cur_len - decoder_prompt_len,
    )


def greedy_choice(
    scores: torch.Tensor,
    finished: torch.Tensor,
    sequences: torch.Tensor,
    rows: torch.Tensor | None,
    cur_len: int,
    pad_token: int | None,
    eos_tokens: torch.Tensor | None,
) -> tuple[torch.Tensor, int]:
    """The rest of a greedy step after the processed `scores` `(rows, vocab)`, as `GenerationMixin._sample` does it:
    each row's token (`first_argmax`), `pad_token` for rows already `finished`, written into `sequences` at `cur_len`
    (row `rows[r]` for row r; `rows` None: row r), `finished` updated in place with the end tokens `eos_tokens` (int64
    `(n,)`, as `greedy_search` makes them once); returns the tokens and how many rows are finished. For float32 CPU
    scores the compiled `greedy_choice` does it in one call, else torch operations (the same tokens and rows)."""
    kernels = compiled_kernels() if scores.device.type == "cpu" and scores.dtype == torch.float32 else None
    if (kernels is not None and scores.dim() == 2 and scores.shape[1] > 0 and scores.stride(1) == 1
            and sequences.device.type == "cpu" and sequences.dtype == torch.int64
            and (eos_tokens is None or pad_token is not None)):
        return kernels.greedy_choice(scores, finished, sequences, rows, cur_len, pad_token, eos_tokens)
    next_tokens = first_argmax(scores)
    if eos_tokens is not None:
        next_tokens = torch.where(finished, pad_token, next_tokens)
    if rows is None:
        sequences[:, cur_len] = next_tokens
    else:
        sequences[rows, cur_len] = next_tokens
    if eos_tokens is not None:
        # one end token (the usual case) is compared with `==`, a few operator calls less than `isin`
        finished |= next_tokens == eos_tokens if eos_tokens.numel() == 1 else torch.isin(next_tokens, eos_tokens)
    return next_tokens, int(finished.sum())


def greedy_search(steps: DecoderSteps, input_ids, logits_processor, generation_config, max_length: int, compact: bool):
    """`GenerationMixin._sample` without sampling: argmax of the processed scores; a finished row gets padding (and,
    with `compact`, leaves the batch once enough rows have finished)."""
    pad_token_id, eos_token_id = special_token_tensors(generation_config)
    # once, as every step's `greedy_choice` takes them
    pad_token = None if pad_token_id is None else int(pad_token_id)
    eos_tokens = None if eos_token_id is None else eos_token_id.reshape(-1).to(torch.int64).contiguous()
    batch_size, cur_len = input_ids.shape
    sequences = input_ids.new_full((batch_size, max_length), 0 if pad_token is None else pad_token)
    sequences[:, :cur_len] = input_ids
    rows = None  # the original row of each computed row (None: all rows, in order)
    finished = torch.zeros(batch_size, dtype=torch.bool, device=input_ids.device)
    tokens = input_ids[:, -1]
    while True:
        scores = steps.logits(tokens)
        if len(logits_processor):  # the tokens so far only where a processor reads them (a gather once compacted)
            context = sequences[:, :cur_len] if rows is None else sequences[rows, :cur_len]
            scores = apply_logits_processors(logits_processor, context, scores)
        next_tokens, done = greedy_choice(scores, finished, sequences, rows, cur_len, pad_token, eos_tokens)
        cur_len += 1
        if cur_len >= max_length or done == finished.shape[0]:
            return sequences[:, :cur_len]
        tokens = next_tokens
        if compact and done >= max(1, compaction_share(steps) * finished.shape[0]):
            keep = (~finished).nonzero().squeeze(1)
            steps.select(keep, rows_dropped=True)
            rows = keep if rows is None else rows[keep]
            finished, tokens = finished[keep], tokens[keep]


def widened(tensor: torch.Tensor, columns: int, fill_value: int) -> torch.Tensor:
    """`tensor` with `columns` more positions of `fill_value` at the end of its last dimension."""
    return torch.cat((tensor, tensor.new_full((*tensor.shape[:-1], columns), fill_value)), dim=-1)


def early_stopping_code(early_stopping) -> int:
    """`generate()`'s three behaviours of `early_stopping` as `beam_finish_step` takes them: 1 where it `is True`, 2
    where it is `"never"`, else 0 (the helpers test `is True` and `== "never"`)."""
    if early_stopping is True:
        return 1
    return 2 if early_stopping == "never" else 0


class BeamState:
    """A beam search's tensors between steps (the names of transformers' `_beam_search`), `(items, beams, ...)`: the
    running beams, the finished ones, and whether each item's finished beams can still improve. The sequences and beam
    indices are `width` positions wide (`SEQUENCE_WIDTH_STEP`)."""

    __slots__ = ("running_sequences", "running_beam_scores", "running_beam_indices", "sequences", "beam_scores",
                 "beam_indices", "is_sent_finished", "is_early_stop_heuristic_unsatisfied")

    def __init__(self, input_ids: torch.Tensor, batch_size: int, num_beams: int, width: int, fill_value: int):
        device, cur_len = input_ids.device, input_ids.shape[1]
        self.running_sequences = torch.full((batch_size, num_beams, width), fill_value, dtype=torch.int64,
                                            device=device)
        self.running_sequences[:, :, :cur_len] = unflatten_beam_dim(input_ids, batch_size, num_beams)
        self.sequences = self.running_sequences.detach().clone()
        self.running_beam_scores = torch.zeros((batch_size, num_beams), dtype=torch.float, device=device)
        self.running_beam_scores[:, 1:] = -1e9
        self.beam_scores = torch.full((batch_size, num_beams), fill_value=-1e9, dtype=torch.float, device=device)
        self.is_sent_finished = torch.zeros((batch_size, num_beams), dtype=torch.bool, device=device)
        self.is_early_stop_heuristic_unsatisfied = torch.ones((batch_size, 1), dtype=torch.bool, device=device)
        self.running_beam_indices = torch.full(
            (batch_size, num_beams, width - cur_len), fill_value=-1, dtype=torch.int32, device=device
        )
        self.beam_indices = self.running_beam_indices.detach().clone()

    def widen(self, columns: int, fill_value: int) -> None:
        """`columns` more positions for the sequences (`fill_value`) and the beam indices (-1)."""
        self.running_sequences, self.sequences = (
            widened(tensor, columns, fill_value) for tensor in (self.running_sequences, self.sequences)
        )
        self.running_beam_indices, self.beam_indices = (
            widened(tensor, columns, -1) for tensor in (self.running_beam_indices, self.beam_indices)
        )

    def keep(self, items: torch.Tensor) -> None:
        """Keep batch items `items`, in that order."""
        for name in self.__slots__:
            setattr(self, name, getattr(self, name)[items])


def finish_step(
    model,
    state: BeamState,
    topk_log_probs: torch.Tensor,
    topk_running_sequences: torch.Tensor,
    topk_running_beam_indices: torch.Tensor,
    eos_token_id: torch.Tensor | None,
    cur_len: int,
    decoder_prompt_len: int,
    max_length: int,
    generation_config,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """The rest of a beam-search step after the candidates (`top_k_continuations`): `state`'s running beams, finished
    beams and early-stop heuristic updated as `GenerationMixin._beam_search` updates them (the heuristic at
    `cur_len + 1`); returns each running row's source row (the cache's reorder, `(items * beams,)`), which items can no
    longer change their output (every candidate they could add scores -1e9 or less), and whether the search goes on.
    On CPU the compiled `beam_finish_step` does it in one call, in place (the helpers' numbers; see
    kernels/beam_finish_step.cpp); else transformers' helpers run."""
    num_beams, length_penalty = generation_config.num_beams, generation_config.length_penalty
    early_stopping = generation_config.early_stopping
    kernels = compiled_kernels() if topk_log_probs.device.type == "cpu" else None
    if kernels is not None:
        return kernels.beam_finish_step(
            topk_log_probs, topk_running_sequences, topk_running_beam_indices, state.running_sequences,
            state.running_beam_scores, state.running_beam_indices, state.sequences, state.beam_scores,
            state.beam_indices, state.is_sent_finished, state.is_early_stop_heuristic_unsatisfied, eos_token_id,
            cur_len, decoder_prompt_len, max_length, float(length_penalty), early_stopping_code(early_stopping),
        )
    # the stopping criteria of the fast loop (checked by `unsupported_reason`): the maximum length and EOS
    if cur_len + 1 >= max_length:
        next_token_hits_stopping_criteria = torch.ones_like(topk_log_probs, dtype=torch.bool)
    elif eos_token_id is not None:
        next_token_hits_stopping_criteria = torch.isin(topk_running_sequences[:, :, cur_len], eos_token_id)
    else:
        next_token_hits_stopping_criteria = torch.zeros_like(topk_log_probs, dtype=torch.bool)
    state.running_sequences, state.running_beam_scores, state.running_beam_indices = (
        get_running_beams_for_next_iteration(
            model, topk_log_probs, topk_running_sequences, topk_running_beam_indices,
            next_token_hits_stopping_criteria, num_beams,
        )
    )
    state.sequences, state.beam_scores, state.beam_indices, state.is_sent_finished = update_finished_beams(
        model,
        sequences=state.sequences,
        topk_running_sequences=topk_running_sequences,
        beam_scores=state.beam_scores,
        topk_log_probs=topk_log_probs,
        beam_indices=state.beam_indices,
        topk_running_beam_indices=topk_running_beam_indices,
        is_early_stop_heuristic_unsatisfied=state.is_early_stop_heuristic_unsatisfied,
        is_sent_finished=state.is_sent_finished,
        next_token_hits_stopping_criteria=next_token_hits_stopping_criteria,
        top_num_beam_mask=torch.arange(topk_log_probs.shape[1], device=topk_log_probs.device) < num_beams,
        num_beams=num_beams,
        cur_len=cur_len,
        decoder_prompt_len=decoder_prompt_len,
        length_penalty=length_penalty,
        early_stopping=early_stopping,
    )
    source_rows = flatten_beam_dim(state.running_beam_indices[..., cur_len - decoder_prompt_len])
    state.is_early_stop_heuristic_unsatisfied = check_early_stop_heuristic(
        is_early_stop_heuristic_unsatisfied=state.is_early_stop_heuristic_unsatisfied,
        running_beam_scores=state.running_beam_scores,
        beam_scores=state.beam_scores,
        is_sent_finished=state.is_sent_finished,
        cur_len=cur_len + 1,
        max_length=max_length,
        decoder_prompt_len=decoder_prompt_len,
        early_stopping=early_stopping,
        length_penalty=length_penalty,
    )
    goes_on = bool(beam_search_has_unfinished_sequences(
        state.is_early_stop_heuristic_unsatisfied, state.is_sent_finished, next_token_hits_stopping_criteria,
        early_stopping,
    ))
    frozen = ~state.is_early_stop_heuristic_unsatisfied[:, 0]
    if early_stopping is True:
        frozen |= state.is_sent_finished.all(dim=-1)
    return source_rows, frozen, goes_on


def beam_search(model, steps: DecoderSteps, input_ids, logits_processor, generation_config, max_length: int, compact: bool):
    """`GenerationMixin._beam_search` (deterministic) around the fast decoder steps: the same candidates, scores,
    length penalty, early stopping and output, its bookkeeping either transformers' own helpers or compiled kernels
    that compute their numbers (`top_k_continuations`, `finish_step`). Batch items that can no longer change the output
    (no improvement possible, or all beams finished with `early_stopping=True`) leave the batch, with `compact`, once
    they are `COMPACTION_SHARE` of it."""
    pad_token_id, eos_token_id = special_token_tensors(generation_config)
    num_beams = generation_config.num_beams
    num_return_sequences = generation_config.num_return_sequences
    batch_size, cur_len = input_ids.shape[0] // num_beams, input_ids.shape[1]
    decoder_prompt_len = cur_len
    n_eos_tokens = eos_token_id.shape[0] if eos_token_id is not None else 0
    beams_to_keep = max(2, 1 + n_eos_tokens) * num_beams
    # transformers' own expression (a pad id of 0 counts as unset)
    output_fill_value = pad_token_id or eos_token_id[0] if eos_token_id is not None else -1

    # the sequences and beam indices are `width` positions wide (`SEQUENCE_WIDTH_STEP`), widened with their fill
    # values when a step would write past them: the positions after `cur_len` hold only fill values in either case
    width = min(max_length, cur_len + SEQUENCE_WIDTH_STEP)
    state = BeamState(input_ids, batch_size, num_beams, width, output_fill_value)
    # the final sequences of every batch item, written when an item leaves the batch and at the end
    final_sequences, final_beam_indices = state.sequences.clone(), state.beam_indices.clone()
    items = torch.arange(batch_size, device=input_ids.device)  # original batch item of each item still searched

    while True:
        if cur_len == width:  # this step writes position `cur_len` (< max_length, else the search has ended)
            columns = min(max_length, width + SEQUENCE_WIDTH_STEP) - width
            state.widen(columns, output_fill_value)
            final_sequences = widened(final_sequences, columns, output_fill_value)
            final_beam_indices = widened(final_beam_indices, columns, -1)
            width += columns
        flat_running_sequences = flatten_beam_dim(state.running_sequences[:, :, :cur_len])
        tokens = flat_running_sequences[:, -1]
        # the first step's beams are equal: computed once per sentence where the steps can (`logits_of_equal_groups`)
        logits = steps.logits_of_equal_groups(tokens) if cur_len == decoder_prompt_len else None
        if logits is None:
            logits = steps.logits(tokens)
        # in place (the logits are a fresh tensor): the same values as `generate()`'s out-of-place operations, without
        # two new (rows, vocab) tensors per step
        log_probs = torch.log_softmax(logits, dim=-1, out=logits)
        log_probs = apply_logits_processors(logits_processor, flat_running_sequences, log_probs)
        topk_log_probs, topk_running_sequences, topk_running_beam_indices = top_k_continuations(
            model,
            log_probs,
            state.running_beam_scores,
            running_sequences=state.running_sequences,
            running_beam_indices=state.running_beam_indices,
            cur_len=cur_len,
            decoder_prompt_len=decoder_prompt_len,
            beams_to_keep=beams_to_keep,
            num_beams=num_beams,
            batch_size=batch_size,
        )
        source_rows, frozen, goes_on = finish_step(
            model, state, topk_log_probs, topk_running_sequences, topk_running_beam_indices, eos_token_id, cur_len,
            decoder_prompt_len, max_length, generation_config,
        )
        cur_len += 1
        if not goes_on:
            break
        if not compact or int(frozen.sum()) < max(1, compaction_share(steps) * batch_size):
            steps.select(source_rows, rows_dropped=False)
            continue
        final_sequences[items[frozen]] = state.sequences[frozen]
        final_beam_indices[items[frozen]] = state.beam_indices[frozen]
        keep = (~frozen).nonzero().squeeze(1)
        steps.select(source_rows.view(batch_size, num_beams)[keep].reshape(-1), rows_dropped=True)
        items, batch_size = items[keep], keep.shape[0]
        state.keep(keep)

    final_sequences[items] = state.sequences
    final_beam_indices[items] = state.beam_indices
    sequences = flatten_beam_dim(final_sequences[:, :num_return_sequences, :])
    beam_indices = flatten_beam_dim(final_beam_indices[:, :num_return_sequences, :])
    max_generated_length = ((beam_indices + 1).bool()).sum(dim=1).max()
    return sequences[:, : decoder_prompt_len + max_generated_length]
