"""Fast generation for every hf_layerfusion family: the tokens of `generate()`, with less work per step.

`fast_generate(model, **inputs_and_generate_kwargs)` returns what `model.generate(...)` returns for greedy search and
beam search. It runs `generate()`'s own preparation (generation config, special tokens, encoder, beam expansion,
logits processors, stopping criteria) and replaces only the decoding loop (transformers' `custom_generate` hook):

- the decoder runs through the model's own stack (`LayerStack.run_layers`: the family's layers, connection, readout
  and `output_head`), one position per step, without `forward()`'s per-step work (output-capture hooks, mask
  building, input checks, output dataclasses);
- keys/values live in `DecodingCache`: self-attention slots preallocated position-major (a step writes one block in
  place instead of concatenating the whole cache), cross-attention keys/values computed once per input, kept
  contiguous and, in beam search, once per sentence instead of once per beam (the backbone's attention folds a
  sentence's beams into query positions: `MultiHeadAttention.accepts_key_groups`); a beam reorder copies the filled
  self-attention positions only (`generate()` also reorders every cross-attention slot, whose rows are equal);
- sentences (greedy) and batch items (beam search) that can no longer change the output leave the batch, so their
  rows are no longer computed (`generate()` keeps computing them until the last one finishes); with logits
  processors that are not known to act row by row, every row is kept, as `generate()` does;
- beam search keeps transformers' own bookkeeping (`_get_top_k_continuations`, `_update_finished_beams`, ...), so
  scoring, length penalty and early stopping are those of `generate()` by construction.

In float32 the numbers are `generate()`'s except for the order of some sums (beam search attends a sentence's beams
together), so the tokens are the same unless two candidates tie to the last bits; tests/test_fast_generation.py checks
the tokens against `generate()` for every family, greedy and beam, and `benchmarks/bench_inference.py` on every run.

`prepare_for_inference(model, quantization=...)` gives the model `fast_generate` runs: the model itself, or with
`quantization="int8"` an inference copy whose linear layers are int8 (see `Int8Linear`). Anything the loop does not
cover (sampling, `return_dict_in_generate`, streamers, assistant models, custom stopping criteria, a prompt for the
decoder, attention implementations other than eager and SDPA, ...) runs `generate()` itself, with one warning naming
the reason; `fast_generate(..., fallback=False)` raises `UnsupportedFastGeneration` instead.
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.generation.configuration_utils import GenerationMode
from transformers.generation.logits_process import (
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    InfNanRemoveLogitsProcessor,
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
    SuppressTokensLogitsProcessor,
)
from transformers.generation.stopping_criteria import EosTokenCriteria, MaxLengthCriteria
from transformers.masking_utils import create_bidirectional_mask
from transformers.utils import logging

from .modeling_backbone import MultiHeadAttention
from .validation import check_decoder_groups

fast_generation_logger = logging.get_logger(__name__)

FAST_ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager")
# logits processors whose output row depends only on that row's scores and tokens (and the step): rows that can no
# longer change the output may leave the batch without changing what the processors do to the other rows
ROW_WISE_PROCESSORS = (
    MinLengthLogitsProcessor,
    MinNewTokensLengthLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    RepetitionPenaltyLogitsProcessor,
    SequenceBiasLogitsProcessor,
    NoBadWordsLogitsProcessor,
    ForcedBOSTokenLogitsProcessor,
    ForcedEOSTokenLogitsProcessor,
    InfNanRemoveLogitsProcessor,
    SuppressTokensLogitsProcessor,
    SuppressTokensAtBeginLogitsProcessor,
)
# the parts of transformers' beam search the fast loop calls (private methods of the pinned transformers version; the
# Hub copy of this module checks them and falls back to generate() without them)
BEAM_SEARCH_HELPERS = (
    "_get_top_k_continuations",
    "_get_running_beams_for_next_iteration",
    "_update_finished_beams",
    "_check_early_stop_heuristic",
    "_beam_search_has_unfinished_sequences",
    "_flatten_beam_dim",
    "_unflatten_beam_dim",
)
# rows that can no longer change the output leave the batch once they are this share of the rows still computed
# (dropping them costs a copy of the cache, so it is batched)
COMPACTION_SHARE = 0.25


class UnsupportedFastGeneration(ValueError):
    """A generation setting the fast loop does not cover; `fast_generate(..., fallback=True)` runs `generate()`."""


# --------------------------------------------------------------------------------------------------- cache
class _KeyValueSlot:
    """Keys/values of one decoder attention slot, stored position-major, `(capacity, rows, heads, head_dim)`, filled
    up to `length`: a step writes one contiguous block, attention reads the `(rows, heads, length, head_dim)` view
    (the same numbers as a row-major cache), and a beam reorder copies the filled positions, contiguous, into a spare
    buffer that then takes the place of the current one."""

    __slots__ = ("keys", "values", "spare_keys", "spare_values", "length")

    def __init__(self, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int):
        rows, heads, _, head_dim = key_states.shape
        self.keys = key_states.new_empty((capacity, rows, heads, head_dim))
        self.values = value_states.new_empty((capacity, rows, heads, value_states.shape[-1]))
        self.spare_keys = self.spare_values = None
        self.length = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.length, self.length + key_states.shape[2]
        if end > self.keys.shape[0]:
            raise RuntimeError(f"DecodingCache: {end} positions exceed the capacity of {self.keys.shape[0]}.")
        self.keys[start:end] = key_states.permute(2, 0, 1, 3)
        self.values[start:end] = value_states.permute(2, 0, 1, 3)
        self.length = end
        return self.keys[:end].permute(1, 2, 0, 3), self.values[:end].permute(1, 2, 0, 3)

    def select(self, index: torch.Tensor) -> None:
        """Keep rows `index` (in that order): beam reordering, or dropping rows (then the buffers shrink)."""
        if index.shape[0] != self.keys.shape[1]:
            self.spare_keys = self.keys.new_empty((self.keys.shape[0], index.shape[0], *self.keys.shape[2:]))
            self.spare_values = self.values.new_empty((self.values.shape[0], index.shape[0], *self.values.shape[2:]))
        elif self.spare_keys is None:
            self.spare_keys, self.spare_values = torch.empty_like(self.keys), torch.empty_like(self.values)
        filled = slice(0, self.length)
        torch.index_select(self.keys[filled], 1, index, out=self.spare_keys[filled])
        torch.index_select(self.values[filled], 1, index, out=self.spare_values[filled])
        self.keys, self.spare_keys = self.spare_keys, self.keys
        self.values, self.spare_values = self.spare_values, self.values
        if index.shape[0] != self.spare_keys.shape[1]:  # the old buffers have the old row count: not reusable
            self.spare_keys = self.spare_values = None


class _SelfAttentionCache:
    """The `Cache.update(key_states, value_states, layer_idx)` interface over preallocated slots."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.slots: dict[int, _KeyValueSlot] = {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        slot = self.slots.get(layer_idx)
        if slot is None:
            slot = self.slots[layer_idx] = _KeyValueSlot(key_states, value_states, self.capacity)
        return slot.update(key_states, value_states)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        slot = self.slots.get(layer_idx)
        return 0 if slot is None else slot.length

    def select(self, index: torch.Tensor) -> None:
        for slot in self.slots.values():
            slot.select(index)


class _StaticLayer:
    __slots__ = ("keys", "values")

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values = keys, values


class _CrossAttentionCache:
    """Keys/values computed once per input (they depend on the encoder output only), as `layers[slot].keys`."""

    def __init__(self):
        self.layers: dict[int, _StaticLayer] = {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        # stored contiguous (the projections' transposed views are not): attention reads them at every step
        layer = self.layers[layer_idx] = _StaticLayer(key_states.contiguous(), value_states.contiguous())
        return layer.keys, layer.values

    def select(self, index: torch.Tensor) -> None:
        for layer in self.layers.values():
            layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)


class DecodingCache(EncoderDecoderCache):
    """The cache of the fast loop, read and written by the families' attention modules exactly like the
    `EncoderDecoderCache` of `generate()` (`self_attention_cache.update`, `cross_attention_cache.layers[slot]`,
    `is_updated`). Self-attention slots are preallocated for `capacity` positions; their `select(index)` keeps rows
    `index` (reordering beams, dropping rows), as does the cross-attention part's when rows leave the batch (a
    sentence's beams share their cross-attention keys/values: reordering beams leaves them in place)."""

    def __init__(self, capacity: int):  # no super().__init__(): the two caches are not transformers `Cache`s
        self.self_attention_cache = _SelfAttentionCache(capacity)
        self.cross_attention_cache = _CrossAttentionCache()
        self.is_updated: dict[int, bool] = {}

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.self_attention_cache.get_seq_length(layer_idx)


# --------------------------------------------------------------------------------------------------- decoder steps
class DecoderSteps:
    """Runs the decoder one position at a time for the rows still in the batch, through the model's own modules:
    the stack's embeddings and `run_layers`, the family's readout and `output_head` (what `forward()` computes for
    one new position, without its per-call work).

    With `group > 1` (beam search: `group` consecutive rows are the beams of one sentence) and attention modules that
    accept key groups (`MultiHeadAttention.accepts_key_groups`), the encoder memory and hence the cross-attention
    keys/values are kept once per sentence instead of once per beam: `group` times less to compute at the first step
    and to read at every step."""

    def __init__(
        self,
        model,
        encoder_outputs,
        attention_mask,
        capacity: int,
        decoder_groups: Sequence[int] | None,
        group: int = 1,
    ):
        self.model = model
        self.decoder = model.get_decoder()
        self.groups = check_decoder_groups(decoder_groups, self.decoder.readout.num_groups)
        needed = self.decoder.readout.num_layers_needed(self.groups) or len(self.decoder.layers)
        self.layers = self.decoder.layers[:needed]
        attention = [module for module in self.layers.modules() if isinstance(module, MultiHeadAttention)]
        self.group = group if all(module.accepts_key_groups for module in attention) else 1
        # `generate()` expands the encoder outputs to one row per beam (consecutive copies): keep one per group
        self.memory = encoder_outputs.last_hidden_state[:: self.group]
        self.layer_memories = getattr(encoder_outputs, "layer_memories", None)
        if self.layer_memories is not None:
            self.layer_memories = self.layer_memories[:: self.group]
        self.attention_mask = None if attention_mask is None else attention_mask[:: self.group]
        self.memory_mask = self.build_memory_mask()
        self.cache = DecodingCache(capacity)
        self.position = 0

    def build_memory_mask(self) -> torch.Tensor | None:
        """The cross-attention mask `forward()` builds for one query position (None where nothing is masked)."""
        return create_bidirectional_mask(
            config=self.decoder.config,
            inputs_embeds=self.memory[:, :1],
            attention_mask=self.attention_mask,
            encoder_hidden_states=self.memory,
        )

    def memory_for_layer(self, layer_idx: int) -> torch.Tensor:
        return self.memory if self.layer_memories is None else self.layer_memories[:, layer_idx]

    @torch.no_grad()
    def logits(self, tokens: torch.Tensor) -> torch.Tensor:
        """float32 logits `(rows, vocab)` of the next position after `tokens` `(rows,)`, as `generate()` reads them."""
        input_ids = tokens[:, None]
        embeddings = self.decoder.embeddings(input_ids, self.decoder.input_embeddings(input_ids, None), self.position)
        states = self.decoder.run_layers(
            embeddings,
            self.layers,
            self.memory_for_layer,
            # one query per step attends to every cached position: no self-attention mask, as `forward()` builds none
            {"attention_mask": None, "memory_mask": self.memory_mask, "past_key_values": self.cache},
        )
        features = self.decoder.readout(states, self.groups)
        logits = self.model.output_head(features, self.groups, None, None, False)[1]
        self.position += 1
        return logits[:, -1].float()  # a fresh tensor: the loop may change it in place

    def select(self, index: torch.Tensor, rows_dropped: bool) -> None:
        """Keep rows `index`: a beam reorder (`rows_dropped=False`) or rows leaving the batch (whole groups)."""
        self.cache.self_attention_cache.select(index)
        if rows_dropped:
            kept = index[:: self.group] // self.group  # the groups (sentences) kept
            self.cache.cross_attention_cache.select(kept)
            self.memory = self.memory.index_select(0, kept)
            if self.layer_memories is not None:
                self.layer_memories = self.layer_memories.index_select(0, kept)
            if self.attention_mask is not None:
                self.attention_mask = self.attention_mask.index_select(0, kept)
            self.memory_mask = self.build_memory_mask()


# --------------------------------------------------------------------------------------------------- search loops
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


def greedy_search(steps: DecoderSteps, input_ids, logits_processor, generation_config, max_length: int, compact: bool):
    """`GenerationMixin._sample` without sampling: argmax of the processed scores; a finished row gets padding (and,
    with `compact`, leaves the batch once enough rows have finished)."""
    pad_token_id = generation_config._pad_token_tensor
    eos_token_id = generation_config._eos_token_tensor
    batch_size, cur_len = input_ids.shape
    sequences = input_ids.new_full((batch_size, max_length), 0 if pad_token_id is None else int(pad_token_id))
    sequences[:, :cur_len] = input_ids
    rows = None  # the original row of each computed row (None: all rows, in order)
    finished = torch.zeros(batch_size, dtype=torch.bool, device=input_ids.device)
    tokens = input_ids[:, -1]
    while True:
        scores = steps.logits(tokens)
        context = sequences[:, :cur_len] if rows is None else sequences[rows, :cur_len]
        # `max` returns the first maximal index like `argmax` (in `generate()`), 2-3x faster on CPU
        next_tokens = apply_logits_processors(logits_processor, context, scores).max(dim=-1).indices
        if eos_token_id is not None:
            next_tokens = torch.where(finished, pad_token_id, next_tokens)
        if rows is None:
            sequences[:, cur_len] = next_tokens
        else:
            sequences[rows, cur_len] = next_tokens
        cur_len += 1
        if eos_token_id is not None:
            finished |= torch.isin(next_tokens, eos_token_id)
        if cur_len >= max_length or bool(finished.all()):
            return sequences[:, :cur_len]
        tokens = next_tokens
        done = int(finished.sum())
        if compact and done >= max(1, COMPACTION_SHARE * finished.shape[0]):
            keep = (~finished).nonzero().squeeze(1)
            steps.select(keep, rows_dropped=True)
            rows = keep if rows is None else rows[keep]
            finished, tokens = finished[keep], tokens[keep]


def beam_search(model, steps: DecoderSteps, input_ids, logits_processor, generation_config, max_length: int, compact: bool):
    """`GenerationMixin._beam_search` (deterministic) around the fast decoder steps, with transformers' own helpers for
    the bookkeeping: the same candidates, scores, length penalty, early stopping and output. Batch items that can no
    longer change the output (no improvement possible, or all beams finished with `early_stopping=True`) leave the
    batch, with `compact`, once they are `COMPACTION_SHARE` of it."""
    pad_token_id = generation_config._pad_token_tensor
    eos_token_id = generation_config._eos_token_tensor
    early_stopping = generation_config.early_stopping
    length_penalty = generation_config.length_penalty
    num_beams = generation_config.num_beams
    num_return_sequences = generation_config.num_return_sequences
    device = input_ids.device
    batch_size, cur_len = input_ids.shape[0] // num_beams, input_ids.shape[1]
    decoder_prompt_len = cur_len
    n_eos_tokens = eos_token_id.shape[0] if eos_token_id is not None else 0
    beams_to_keep = max(2, 1 + n_eos_tokens) * num_beams
    top_num_beam_mask = torch.arange(beams_to_keep, device=device) < num_beams
    # transformers' own expression (a pad id of 0 counts as unset)
    output_fill_value = pad_token_id or eos_token_id[0] if eos_token_id is not None else -1

    running_sequences = torch.full((batch_size, num_beams, max_length), output_fill_value, dtype=torch.int64, device=device)
    running_sequences[:, :, :cur_len] = model._unflatten_beam_dim(input_ids, batch_size, num_beams)
    sequences = running_sequences.detach().clone()
    running_beam_scores = torch.zeros((batch_size, num_beams), dtype=torch.float, device=device)
    running_beam_scores[:, 1:] = -1e9
    beam_scores = torch.full((batch_size, num_beams), fill_value=-1e9, dtype=torch.float, device=device)
    is_sent_finished = torch.zeros((batch_size, num_beams), dtype=torch.bool, device=device)
    is_early_stop_heuristic_unsatisfied = torch.ones((batch_size, 1), dtype=torch.bool, device=device)
    running_beam_indices = torch.full(
        (batch_size, num_beams, max_length - cur_len), fill_value=-1, dtype=torch.int32, device=device
    )
    beam_indices = running_beam_indices.detach().clone()
    # the final sequences of every batch item, written when an item leaves the batch and at the end
    final_sequences, final_beam_indices = sequences.clone(), beam_indices.clone()
    items = torch.arange(batch_size, device=device)  # original batch item of each item still searched

    while True:
        flat_running_sequences = model._flatten_beam_dim(running_sequences[:, :, :cur_len])
        log_probs = F.log_softmax(steps.logits(flat_running_sequences[:, -1]), dim=-1)
        log_probs = apply_logits_processors(logits_processor, flat_running_sequences, log_probs)
        log_probs = model._unflatten_beam_dim(log_probs, batch_size, num_beams) + running_beam_scores[:, :, None]
        log_probs = torch.reshape(log_probs, (batch_size, -1))
        topk_log_probs, topk_running_sequences, topk_running_beam_indices = model._get_top_k_continuations(
            accumulated_log_probs=log_probs,
            running_sequences=running_sequences,
            running_beam_indices=running_beam_indices,
            cur_len=cur_len,
            decoder_prompt_len=decoder_prompt_len,
            do_sample=False,
            beams_to_keep=beams_to_keep,
            num_beams=num_beams,
            batch_size=batch_size,
        )
        # the stopping criteria of the fast loop (checked by `unsupported_reason`): the maximum length and EOS
        if cur_len + 1 >= max_length:
            next_token_hits_stopping_criteria = torch.ones_like(topk_log_probs, dtype=torch.bool)
        elif eos_token_id is not None:
            next_token_hits_stopping_criteria = torch.isin(topk_running_sequences[:, :, cur_len], eos_token_id)
        else:
            next_token_hits_stopping_criteria = torch.zeros_like(topk_log_probs, dtype=torch.bool)
        running_sequences, running_beam_scores, running_beam_indices = model._get_running_beams_for_next_iteration(
            topk_log_probs, topk_running_sequences, topk_running_beam_indices, next_token_hits_stopping_criteria, num_beams
        )
        sequences, beam_scores, beam_indices, is_sent_finished = model._update_finished_beams(
            sequences=sequences,
            topk_running_sequences=topk_running_sequences,
            beam_scores=beam_scores,
            topk_log_probs=topk_log_probs,
            beam_indices=beam_indices,
            topk_running_beam_indices=topk_running_beam_indices,
            is_early_stop_heuristic_unsatisfied=is_early_stop_heuristic_unsatisfied,
            is_sent_finished=is_sent_finished,
            next_token_hits_stopping_criteria=next_token_hits_stopping_criteria,
            top_num_beam_mask=top_num_beam_mask,
            num_beams=num_beams,
            cur_len=cur_len,
            decoder_prompt_len=decoder_prompt_len,
            length_penalty=length_penalty,
            early_stopping=early_stopping,
        )
        beam_idx = model._flatten_beam_dim(running_beam_indices[..., cur_len - decoder_prompt_len])
        cur_len += 1
        is_early_stop_heuristic_unsatisfied = model._check_early_stop_heuristic(
            is_early_stop_heuristic_unsatisfied=is_early_stop_heuristic_unsatisfied,
            running_beam_scores=running_beam_scores,
            beam_scores=beam_scores,
            is_sent_finished=is_sent_finished,
            cur_len=cur_len,
            max_length=max_length,
            decoder_prompt_len=decoder_prompt_len,
            early_stopping=early_stopping,
            length_penalty=length_penalty,
        )
        if not model._beam_search_has_unfinished_sequences(
            is_early_stop_heuristic_unsatisfied, is_sent_finished, next_token_hits_stopping_criteria, early_stopping
        ):
            break
        # an item whose finished beams can no longer change: every candidate it could add scores -1e9 or less
        frozen = ~is_early_stop_heuristic_unsatisfied[:, 0]
        if early_stopping is True:
            frozen |= is_sent_finished.all(dim=-1)
        if not compact or int(frozen.sum()) < max(1, COMPACTION_SHARE * batch_size):
            steps.select(beam_idx, rows_dropped=False)
            continue
        final_sequences[items[frozen]] = sequences[frozen]
        final_beam_indices[items[frozen]] = beam_indices[frozen]
        keep = (~frozen).nonzero().squeeze(1)
        steps.select(beam_idx.view(batch_size, num_beams)[keep].reshape(-1), rows_dropped=True)
        items, batch_size = items[keep], keep.shape[0]
        running_sequences, running_beam_scores, running_beam_indices = (
            running_sequences[keep], running_beam_scores[keep], running_beam_indices[keep]
        )
        sequences, beam_scores, beam_indices = sequences[keep], beam_scores[keep], beam_indices[keep]
        is_sent_finished = is_sent_finished[keep]
        is_early_stop_heuristic_unsatisfied = is_early_stop_heuristic_unsatisfied[keep]

    final_sequences[items] = sequences
    final_beam_indices[items] = beam_indices
    sequences = model._flatten_beam_dim(final_sequences[:, :num_return_sequences, :])
    beam_indices = model._flatten_beam_dim(final_beam_indices[:, :num_return_sequences, :])
    max_generated_length = ((beam_indices + 1).bool()).sum(dim=1).max()
    return sequences[:, : decoder_prompt_len + max_generated_length]


# --------------------------------------------------------------------------------------------------- entry points
# keyword arguments of generate() that the fast loop does not receive through transformers' `custom_generate` hook
CALL_KEYWORDS_NOT_COVERED = ("streamer", "assistant_model", "synced_gpus", "custom_generate", "stopping_criteria")


def unsupported_reason(model, input_ids, stopping_criteria, generation_config, model_kwargs) -> str | None:
    """Why the fast loop cannot run this generation (as `generate()` prepared it), or None."""
    mode = generation_config.get_generation_mode()
    if mode not in (GenerationMode.GREEDY_SEARCH, GenerationMode.BEAM_SEARCH):
        return f"generation mode {mode.value}"
    if generation_config.return_dict_in_generate:
        return "return_dict_in_generate=True"
    if not generation_config.use_cache:
        return "use_cache=False"
    if model.training:
        return "the model is in training mode (dropout)"
    implementation = model.config._attn_implementation
    if implementation not in FAST_ATTENTION_IMPLEMENTATIONS:
        return f"attn_implementation={implementation!r}"
    if input_ids.shape[1] != 1:
        return "a decoder prompt (decoder_input_ids)"
    if model_kwargs.get("decoder_attention_mask") is not None or model_kwargs.get("decoder_inputs_embeds") is not None:
        return "decoder_attention_mask / decoder_inputs_embeds"
    cache = model_kwargs.get("past_key_values")
    if cache is not None and cache.get_seq_length() > 0:
        return "a filled past_key_values"
    criteria = {type(criterion) for criterion in stopping_criteria}
    if MaxLengthCriteria not in criteria or not criteria <= {MaxLengthCriteria, EosTokenCriteria}:
        return f"stopping criteria {sorted(c.__name__ for c in criteria)}"
    if mode == GenerationMode.BEAM_SEARCH:
        missing = [name for name in BEAM_SEARCH_HELPERS if not hasattr(model, name)]
        if missing:
            return f"this transformers version lacks the beam search helpers {missing}"
    return None


def report_fallback(reason: str) -> None:
    fast_generation_logger.warning_once(
        f"hf_layerfusion fast generation does not cover {reason}: running generate() instead."
    )


def fast_decoding_loop(fallback: bool = True):
    """The decoding loop of `fast_generate` as a `generate(custom_generate=...)` callable, for callers that run
    `generate()` themselves (`LayerFusionSeq2SeqTrainer`'s evaluation): greedy and beam search as `generate()` would
    run them, token for token. A generation it does not cover runs transformers' own loop (a warning names the
    reason once), or raises `UnsupportedFastGeneration` with `fallback=False`. `generate()` drops `synced_gpus` and
    `streamer` when `custom_generate` is a callable, so callers that need them must not pass this loop."""

    def decode(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
        reason = unsupported_reason(model, input_ids, stopping_criteria, generation_config, model_kwargs)
        if reason is not None:
            mode = generation_config.get_generation_mode()
            method = getattr(GenerationMixin, {GenerationMode.BEAM_SEARCH: "_beam_search"}.get(mode, "_sample"))
            if not fallback or mode not in (
                GenerationMode.GREEDY_SEARCH, GenerationMode.SAMPLE, GenerationMode.BEAM_SEARCH, GenerationMode.BEAM_SAMPLE
            ):
                raise UnsupportedFastGeneration(reason)
            report_fallback(reason)
            return method(
                model,
                input_ids,
                logits_processor=logits_processor,
                stopping_criteria=stopping_criteria,
                generation_config=generation_config,
                **model_kwargs,
            )
        max_length = stopping_criteria.max_length
        compact = all(isinstance(processor, ROW_WISE_PROCESSORS) for processor in logits_processor)
        steps = DecoderSteps(
            model,
            model_kwargs["encoder_outputs"],
            model_kwargs.get("attention_mask"),
            capacity=max_length - 1,
            decoder_groups=model_kwargs.get("decoder_groups"),
            group=generation_config.num_beams,
        )
        if generation_config.num_beams > 1:
            return beam_search(model, steps, input_ids, logits_processor, generation_config, max_length, compact)
        return greedy_search(steps, input_ids, logits_processor, generation_config, max_length, compact)

    return decode


def fast_generate(model, inputs: torch.Tensor | None = None, *, quantization: str | None = None, fallback: bool = True, **kwargs):
    """`model.generate(inputs, **kwargs)` with the fast decoding loop (see the module docstring): the same output for
    greedy and beam search. `quantization="int8"` runs the int8 inference copy of the model
    (`prepare_for_inference`; not token-exact, see there). Settings the loop does not cover run `generate()` itself
    (a warning names the reason once), or raise `UnsupportedFastGeneration` with `fallback=False`."""
    engine = prepare_for_inference(model, quantization)
    if inputs is not None:
        kwargs["inputs"] = inputs
    covered = [name for name in CALL_KEYWORDS_NOT_COVERED if kwargs.get(name) is not None]
    reason = f"the generate() argument(s) {covered}" if covered else None
    if not (hasattr(engine, "output_head") and hasattr(engine, "get_decoder")):
        reason = f"{type(engine).__name__}, which is not an hf_layerfusion model"
    if reason is not None:
        if not fallback:
            raise UnsupportedFastGeneration(reason)
        report_fallback(reason)
        return engine.generate(**kwargs)

    decode = fast_decoding_loop(fallback)
    try:
        with torch.inference_mode():
            return engine.generate(custom_generate=decode, **kwargs)
    except UnsupportedFastGeneration as error:
        if not fallback:
            raise
        report_fallback(str(error))
        return engine.generate(**kwargs)


# --------------------------------------------------------------------------------------------------- int8
QUANTIZATIONS = (None, "int8")


class Int8Linear(nn.Module):
    """A linear layer with int8 weights (symmetric, one scale per output feature) and int8 activations quantized on
    the fly, through torch's dynamically quantized linear kernel (`quantized::linear_dynamic`).

    That kernel quantizes its whole input with one scale. Each row (token) is therefore first divided by its largest
    magnitude, so that every row spans about [-1, 1] and is quantized with its own resolution (the result is
    multiplied back and the bias added in float): one row with large activations (an outlier token, or another
    sentence of the batch) would otherwise coarsen every other row's quantization, which measurably cost BLEU. The
    weights are packed for oneDNN where torch has it (int8 AMX/VNNI matrix multiplication accumulating in int32, so
    the activations keep all 8 bits), else for torch's current quantized engine (fbgemm accumulates pairs in int16
    and needs 7-bit activations, `reduce_range`)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        weight = weight.detach().float()
        scales = weight.abs().amax(dim=1).clamp_min(torch.finfo(torch.float32).tiny) / 127
        with warnings.catch_warnings():  # torch 2.13 flags quantized tensors as deprecated (they still work)
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(
                weight, scales.double(), torch.zeros_like(scales, dtype=torch.int64), axis=0, dtype=torch.qint8
            )
        engines = torch.backends.quantized.supported_engines
        engine = "onednn" if "onednn" in engines else torch.backends.quantized.engine
        previous = torch.backends.quantized.engine
        torch.backends.quantized.engine = engine
        try:
            self.packed = torch.ops.quantized.linear_prepack(qweight, None)
        finally:
            torch.backends.quantized.engine = previous
        self.reduce_range = engine != "onednn"
        self.bias = None if bias is None else bias.detach().float()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        row_scale = hidden_states.abs().amax(dim=-1, keepdim=True).clamp_min_(torch.finfo(hidden_states.dtype).tiny)
        output = torch.ops.quantized.linear_dynamic(hidden_states / row_scale, self.packed, self.reduce_range)
        return output.mul_(row_scale) if self.bias is None else torch.addcmul(self.bias, output, row_scale)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}"


def int8_copy(model):
    """An inference copy of `model` whose every `nn.Linear` of the encoder-decoder, and the output projection
    (`project`, with Marian's `final_logits_bias`), is an `Int8Linear`; every other tensor (embeddings, LayerNorms,
    fusion weights) is shared with `model`, not copied."""
    shared = {id(tensor): tensor for tensor in [*model.parameters(), *model.buffers()]}
    engine = copy.deepcopy(model, memo=shared).eval()
    for module in list(engine.model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, Int8Linear(child.weight, child.bias))
    engine.int8_output_projection = Int8Linear(engine.lm_head.weight, engine.final_logits_bias[0])
    # `output_head` reads the logits through `project`: the copy's own projection replaces the float one
    engine.__dict__["project"] = engine.int8_output_projection
    return engine


_prepared: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def weights_fingerprint(model) -> tuple | None:
    """Where every weight lives and how often it was changed in place (None if unknown): a prepared copy is rebuilt
    when the model's weights changed after it was made (training, `load_state_dict`)."""
    try:
        return tuple((tensor.data_ptr(), tensor._version) for tensor in [*model.parameters(), *model.buffers()])
    except RuntimeError:  # inference tensors keep no version counter
        return None


def prepare_for_inference(model, quantization: str | None = None):
    """The model `fast_generate` runs: `model` itself for `quantization=None` (float, token-exact), or for
    `quantization="int8"` its int8 copy (`int8_copy`, made once and kept while `model` and its weights are
    unchanged). int8 changes the numbers, hence possibly tokens: its BLEU cost is measured in the README."""
    if quantization not in QUANTIZATIONS:
        raise ValueError(f"Unknown quantization {quantization!r}; choose one of {QUANTIZATIONS}.")
    if quantization is None:
        return model
    if any(parameter.device.type != "cpu" for parameter in model.parameters()):
        raise ValueError(f"quantization={quantization!r} runs on the CPU; move the model there (`model.to('cpu')`).")
    fingerprint = weights_fingerprint(model)
    cached = _prepared.get(model, {}).get(quantization)
    if cached is not None and fingerprint is not None and cached[0] == fingerprint:
        return cached[1]
    engine = int8_copy(model)
    _prepared.setdefault(model, {})[quantization] = (fingerprint, engine)
    return engine
