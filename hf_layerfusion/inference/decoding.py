"""The decoder side of the fast decoding loop (`hf_layerfusion.inference.fast_generation`): `DecodingCache`, the
keys/values of every decoder attention in preallocated, row-major slots, and `DecoderSteps`, one decoder position
at a time through the model's own modules."""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Sequence

import torch
from transformers.cache_utils import EncoderDecoderCache
from transformers.masking_utils import create_bidirectional_mask

from ..modeling.attention import MultiHeadAttention
from ..modeling.input_checks import check_decoder_groups
from .cpu_kernels import compiled_kernels


# --------------------------------------------------------------------------------------------------- cache
class SlotMemory:
    """The memory of one thread's self-attention slots on CPU, kept from one generation to the next. A slot's buffers
    are large (a beam search of 32 sentences: 128 rows x 128 positions x d_model floats, two per layer), so the C
    library maps them fresh at every allocation and unmaps them when freed: each generation paid a page fault for
    every 4 KiB it wrote (study/fast_cpu_translation_log.md measures what that cost). A generation takes its buffers
    here (`empty`) and gives them back when it ends (`DecodingCache.release`); the next one reuses them. What is kept
    is at most what one generation of the thread used at once; `release_decoding_buffers()` frees it. Other devices
    allocate as usual (their allocators cache memory themselves)."""

    def __init__(self):
        self.free: list[torch.Tensor] = []  # flat buffers no generation holds

    def empty(self, shape: tuple[int, ...], like: torch.Tensor, taken: list[torch.Tensor]) -> torch.Tensor:
        """An uninitialised tensor of `shape`, `like`'s dtype and device: on CPU a view of the smallest free buffer
        large enough (else a new one), whose base is appended to `taken` (the generation's, given back by
        `give_back`)."""
        if like.device.type != "cpu":
            return like.new_empty(shape)
        numel = math.prod(shape)
        fits = [i for i, buffer in enumerate(self.free) if buffer.dtype == like.dtype and buffer.numel() >= numel]
        if fits:
            buffer = self.free.pop(min(fits, key=lambda i: self.free[i].numel()))
        else:
            # a normal tensor even when made under `torch.inference_mode()`: a later generation may run outside it
            with torch.inference_mode(False):
                buffer = torch.empty(numel, dtype=like.dtype, device=like.device)
        taken.append(buffer)
        return buffer[:numel].view(shape)

    def give_back(self, taken: list[torch.Tensor]) -> None:
        self.free.extend(taken)
        taken.clear()


_thread_memory = threading.local()


def thread_slot_memory() -> SlotMemory:
    """The calling thread's `SlotMemory` (generations in other threads take their own)."""
    memory = getattr(_thread_memory, "slots", None)
    if memory is None:
        memory = _thread_memory.slots = SlotMemory()
    return memory


def thread_scratch(numel: int) -> torch.Tensor:
    """A flat float32 CPU buffer of at least `numel` elements kept for the calling thread (grown as needed), for a
    result its caller reads before the thread's next call (`OutputGroupsProjection`): a tensor of megabytes made at
    every step is mapped fresh by the C library (as `SlotMemory`'s buffers were). `release_decoding_buffers()` frees
    it."""
    scratch = getattr(_thread_memory, "scratch", None)
    if scratch is None or scratch.numel() < numel:
        # a normal tensor even when made under `torch.inference_mode()`: a later call may run outside it
        with torch.inference_mode(False):
            scratch = _thread_memory.scratch = torch.empty(numel, dtype=torch.float32)
    return scratch


def release_decoding_buffers() -> None:
    """Free the self-attention buffers the calling thread's generations kept for the next one (`SlotMemory`) and its
    scratch (`thread_scratch`)."""
    _thread_memory.slots = None
    _thread_memory.scratch = None


class _KeyValueSlot:
    """Keys/values of one decoder attention slot in buffers preallocated for `capacity` positions,
    `(rows, prefix + capacity, heads, head_dim)`, filled up to `length`: attention reads the
    `(rows, heads, length, head_dim)` view, and each row's filled positions are one contiguous block, so that a beam
    reorder copies whole blocks. The first `prefix` positions hold keys/values given once per input
    (`update_with_prefix`), the same for the beams of a sentence."""

    __slots__ = ("keys", "values", "length", "prefix")

    def __init__(self, key_states: torch.Tensor, value_states: torch.Tensor, capacity: int, empty, prefix=None):
        rows, heads, _, head_dim = key_states.shape
        self.prefix = 0 if prefix is None else prefix[0].shape[2]
        self.keys = empty((rows, self.prefix + capacity, heads, head_dim), key_states)
        self.values = empty((rows, self.prefix + capacity, heads, value_states.shape[-1]), value_states)
        if prefix is not None:
            self.keys[:, : self.prefix] = prefix[0].transpose(1, 2)
            self.values[:, : self.prefix] = prefix[1].transpose(1, 2)
        self.length = self.prefix

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        start, end = self.length, self.length + key_states.shape[2]
        if end > self.keys.shape[1]:
            capacity = self.keys.shape[1] - self.prefix
            raise RuntimeError(f"DecodingCache: {end - self.prefix} positions exceed the capacity of {capacity}.")
        self.keys[:, start:end] = key_states.transpose(1, 2)
        self.values[:, start:end] = value_states.transpose(1, 2)
        self.length = end
        return self.keys[:, :end].transpose(1, 2), self.values[:, :end].transpose(1, 2)

    def filled(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values of the positions decoded so far (after the prefix), `(rows, positions, heads, dim)`."""
        return self.keys[:, self.prefix : self.length], self.values[:, self.prefix : self.length]

    def move_rows(self, targets: torch.Tensor, sources: torch.Tensor) -> None:
        """Row `targets[i]` takes the filled positions of row `sources[i]` (all read before any is written), a beam
        reorder: the rows are beams of one sentence, so their prefixes are equal and stay."""
        for buffer in self.filled():
            buffer.index_copy_(0, targets, buffer.index_select(0, sources))

    def keep_rows(self, index: torch.Tensor, empty) -> None:
        """Keep rows `index`, in that order, in new buffers of `len(index)` rows (rows leaving the batch)."""
        filled = slice(0, self.length)
        keys = empty((index.shape[0], *self.keys.shape[1:]), self.keys)
        values = empty((index.shape[0], *self.values.shape[1:]), self.values)
        torch.index_select(self.keys[:, filled], 0, index, out=keys[:, filled])
        torch.index_select(self.values[:, filled], 0, index, out=values[:, filled])
        self.keys, self.values = keys, values


class _SelfAttentionCache:
    """The `Cache.update(key_states, value_states, layer_idx)` interface over preallocated slots, and
    `update_with_prefix` (see `MultiHeadAttention.project_keys_values`)."""

    def __init__(self, capacity: int, memory: SlotMemory | None = None):
        self.capacity = capacity
        self.slots: dict[int, _KeyValueSlot] = {}
        # the slots' buffers come from `memory` (default: the calling thread's) and go back to it at `release`
        self.memory = thread_slot_memory() if memory is None else memory
        self.taken: list[torch.Tensor] = []
        # where every step reads the slots through the compiled kernels (`DecoderSteps` with compiled layers), beam
        # reorders and rows leaving the batch change `key_rows` instead of moving keys/values: `key_rows[r, p]` is the
        # buffer row that holds row r's keys/values at position p (None: row r itself), a view of the first rows of
        # `key_row_buffer` `(buffer rows, positions)`. A buffer row's position p is written once, at step p, by the
        # row then computed in it (row r writes buffer row r), so it stays valid for every beam that descends from
        # it, and buffer rows past the rows still computed keep what those rows descend from. A reorder then copies
        # rows x positions indices instead of rows x positions x d_model floats per slot (most of beam search's
        # copies). Reading the slots any other way (`update`) first moves each row's keys/values into its own row
        # (`gather_key_rows`).
        self.reorders_key_rows = False
        self.key_rows: torch.Tensor | None = None
        self.key_row_buffer: torch.Tensor | None = None

    def empty(self, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
        """A buffer for a slot (`SlotMemory.empty`), held until `release`."""
        return self.memory.empty(shape, like, self.taken)

    def release(self) -> None:
        """Give the slots' buffers back to `memory` for the next generation; the cache is empty afterwards."""
        self.slots.clear()
        self.key_rows = self.key_row_buffer = None
        self.memory.give_back(self.taken)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        self.gather_key_rows()
        slot = self.slots.get(layer_idx)
        if slot is None:
            slot = self.slots[layer_idx] = _KeyValueSlot(key_states, value_states, self.capacity, self.empty)
        return slot.update(key_states, value_states)

    def update_with_prefix(
        self, key_states, value_states, layer_idx, prefix_keys, prefix_values
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`[prefix ; cached keys/values]` along positions, the prefix (the same at every step of an input) written
        into the slot once, at its first step, instead of concatenated at every step."""
        self.gather_key_rows()
        slot = self.slots.get(layer_idx)
        if slot is None:
            prefix = (prefix_keys, prefix_values)
            slot = self.slots[layer_idx] = _KeyValueSlot(key_states, value_states, self.capacity, self.empty, prefix)
        elif slot.prefix != prefix_keys.shape[2]:
            raise RuntimeError(
                f"DecodingCache: slot {layer_idx} holds a prefix of {slot.prefix} positions, not "
                f"{prefix_keys.shape[2]}."
            )
        return slot.update(key_states, value_states)

    def open_slot(self, layer_idx: int, keys_like: torch.Tensor) -> None:
        """Make slot `layer_idx`, empty, before its first update: keys and values shaped like `keys_like`
        `(rows, heads, 0, head_dim)` (the first step of `CompiledDecoderLayers`, whose kernel writes into the slots)."""
        self.gather_key_rows()
        self.slots[layer_idx] = _KeyValueSlot(keys_like, keys_like, self.capacity, self.empty)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        slot = self.slots.get(layer_idx)
        return 0 if slot is None else slot.length - slot.prefix

    def gather_key_rows(self, index: torch.Tensor | None = None) -> None:
        """Give each of rows `index` (all rows, in order: None) its own keys/values in buffers of as many rows, those
        of the buffer rows its `key_rows` name, and forget `key_rows`; with `index` None and no `key_rows`, nothing to
        do."""
        if self.key_rows is None:
            if index is not None:
                for slot in self.slots.values():
                    slot.keep_rows(index, self.empty)
            return
        key_rows = self.key_rows if index is None else self.key_rows.index_select(0, index)
        for slot in self.slots.values():
            # buffer row key_rows[r, p] position p, as rows of the flattened (buffer rows x positions) buffers
            width = slot.keys.shape[1]
            sources = (key_rows[:, : slot.length] * width + torch.arange(slot.length, device=key_rows.device)).view(-1)
            keys = self.empty((key_rows.shape[0], *slot.keys.shape[1:]), slot.keys)
            values = self.empty((key_rows.shape[0], *slot.values.shape[1:]), slot.values)
            keys[:, : slot.length] = slot.keys.flatten(0, 1).index_select(0, sources).unflatten(0, (-1, slot.length))
            values[:, : slot.length] = slot.values.flatten(0, 1).index_select(0, sources).unflatten(
                0, (-1, slot.length)
            )
            slot.keys, slot.values = keys, values
        self.key_rows = self.key_row_buffer = None

    def select_key_rows(self, index: torch.Tensor) -> bool:
        """Keep rows `index` through `key_rows` (see `__init__`), where the slots allow it: every slot as long and as
        wide and with as many buffer rows, at least `len(index)`; False (nothing done) where they do not."""
        if not self.reorders_key_rows or not self.slots:
            return False
        slots = list(self.slots.values())
        length, shape = slots[0].length, slots[0].keys.shape[:2]
        if index.shape[0] > shape[0] or any(slot.length != length or slot.keys.shape[:2] != shape for slot in slots):
            return False
        if self.key_row_buffer is None:
            rows = torch.arange(shape[0], device=index.device)
            self.key_row_buffer = rows[:, None].expand(shape).contiguous()
            self.key_rows = self.key_row_buffer
        # the filled positions of the rows kept; from `length` on each row keeps its own buffer row (the next steps
        # write it there)
        self.key_row_buffer[: index.shape[0], :length] = self.key_rows[index, :length]
        self.key_rows = self.key_row_buffer[: index.shape[0]]
        return True

    def select(self, index: torch.Tensor, rows_dropped: bool) -> None:
        """Keep rows `index` (in that order): through `key_rows` where it can (`select_key_rows`); else rows leaving
        the batch (`rows_dropped`) copy the rows kept into new buffers, and a beam reorder (as many rows as before)
        copies in place only the rows whose beam changed: most beams continue their own row, so this moves a fraction
        of the cache instead of all of it."""
        if self.select_key_rows(index):
            return
        if rows_dropped:
            self.gather_key_rows(index)
            return
        self.gather_key_rows()
        targets = torch.nonzero(index != torch.arange(index.shape[0], device=index.device)).squeeze(1)
        if targets.numel() == 0:
            return
        sources = index[targets]
        kernels = compiled_kernels() if index.device.type == "cpu" else None
        if kernels is None:
            for slot in self.slots.values():
                slot.move_rows(targets, sources)
            return
        # every slot's rows in one call, each moved row copied once (torch's pair copies it twice)
        filled = [slot.filled() for slot in self.slots.values()]
        kernels.move_rows([buffer for pair in filled for buffer in pair], targets, sources)


class _StaticLayer:
    __slots__ = ("keys", "values")

    def __init__(self, keys: torch.Tensor, values: torch.Tensor):
        self.keys, self.values = keys, values


class _CrossAttentionCache:
    """Keys/values computed once per input (they depend on the encoder output only), as `layers[slot].keys`."""

    def __init__(self):
        self.layers: dict[int, _StaticLayer] = {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        # kept as the projections' transposed views: a contiguous copy would cost a pass over (rows, source, d_model)
        # per slot, and neither the attention kernel nor SDPA reads it faster
        layer = self.layers[layer_idx] = _StaticLayer(key_states, value_states)
        return layer.keys, layer.values

    def select(self, index: torch.Tensor) -> None:
        for layer in self.layers.values():
            layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)


class DecodingCache(EncoderDecoderCache):
    """The cache of the fast loop, read and written by the families' attention modules exactly like the
    `EncoderDecoderCache` of `generate()` (`self_attention_cache.update`, `cross_attention_cache.layers[slot]`,
    `is_updated`). Self-attention slots are preallocated for `capacity` positions; their `select(index, rows_dropped)`
    keeps rows `index` (reordering beams, dropping rows), as does the cross-attention part's when rows leave the batch
    (a sentence's beams share their cross-attention keys/values: reordering beams leaves them in place)."""

    def __init__(self, capacity: int, memory: SlotMemory | None = None):
        # no super().__init__(): the two caches are not transformers `Cache`s
        self.self_attention_cache = _SelfAttentionCache(capacity, memory)
        self.cross_attention_cache = _CrossAttentionCache()
        self.is_updated: dict[int, bool] = {}

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.self_attention_cache.get_seq_length(layer_idx)

    def release(self) -> None:
        """Empty the cache, its self-attention buffers kept for the thread's next generation (`SlotMemory`)."""
        self.self_attention_cache.release()
        self.cross_attention_cache.layers.clear()
        self.is_updated.clear()


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
        compile_layers: Callable | None = None,
        rows_computed_alone: bool = False,
    ):
        self.model = model
        self.decoder = model.get_decoder()
        self.groups = check_decoder_groups(decoder_groups, self.decoder.readout.num_groups)
        needed = self.decoder.readout.num_layers_needed(self.groups, len(self.decoder.layers))
        self.layers = self.decoder.layers[:needed]
        # the layers of a step in one compiled call, where `compile_layers(decoder, layers)` gives one
        # (inference_copies.compiled_decoder_layers for the inference copies)
        self.compiled_layers = None if compile_layers is None else compile_layers(self.decoder, self.layers)
        if self.compiled_layers is not None:
            accepts_key_groups = self.compiled_layers.accepts_key_groups
        else:
            accepts_key_groups = all(
                module.accepts_key_groups for module in self.layers.modules() if isinstance(module, MultiHeadAttention)
            )
        # `beams`: the consecutive rows of one sentence, as `generate()` expanded them; `group`: those that share one
        # row of the memory (1 where an attention cannot take a sentence's beams over one key row)
        self.beams = group
        self.group = group if accepts_key_groups else 1
        # `generate()` expands the encoder outputs to one row per beam (consecutive copies): keep one per group
        # contiguous once here: each cross-attention layer's key and value projections read it at the first step, and
        # a product copies a strided input (every group-th row) at every call (12 copies of a 6-layer decoder)
        self.memory = encoder_outputs.last_hidden_state[:: self.group].contiguous()
        self.layer_memories = getattr(encoder_outputs, "layer_memories", None)
        if self.layer_memories is not None:
            self.layer_memories = self.layer_memories[:: self.group].contiguous()
        self.attention_mask = None if attention_mask is None else attention_mask[:: self.group]
        self.memory_mask = self.build_memory_mask()
        # where the compiled layers run the steps, groups leaving the batch change `memory_rows` instead of copying the
        # memory, its mask and every cross-attention layer's keys/values into fewer rows: `memory_rows[g]` is the row
        # of those (kept as they were) that group g reads, None: row g itself (`select`, `gather_memory_rows`)
        self.memory_rows: torch.Tensor | None = None
        self.cache = DecodingCache(capacity)
        self.position = 0
        # the compiled layers read the self-attention slots through `key_rows`: a beam reorder need not move them
        self.cache.self_attention_cache.reorders_key_rows = self.compiled_layers is not None
        # whether a row's numbers are the same whatever rows are computed beside it (`logits_of_equal_groups`)
        self.rows_computed_alone = rows_computed_alone

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
        token_embeddings = self.decoder.input_embeddings(input_ids, None)
        embeddings = self.decoder.embeddings.decoding_step(token_embeddings, self.position)
        if embeddings is None:
            embeddings = self.decoder.embeddings(input_ids, token_embeddings, self.position)
        compiled = self.compiled_layers
        states = None if compiled is None else compiled.states(embeddings, self.cache, self.memory_mask,
                                                               self.memory_for_layer, self.memory_rows)
        if states is None:
            self.gather_memory_rows()  # the modules read the memory and cross-attention keys/values row by row
            states = self.decoder.run_layers(
                embeddings,
                self.layers,
                self.memory_for_layer,
                # one query per step attends to every cached position: no self-attention mask, as `forward()` builds
                # none
                {"attention_mask": None, "memory_mask": self.memory_mask, "cache": self.cache},
            )
        else:
            states = self.decoder.readout_states(states)
        features = self.decoder.readout.group_features(states, self.groups)
        logits = self.model.output_head(features, self.groups, None, None, False).logits
        self.position += 1
        return logits[:, -1].float()  # a fresh tensor: the loop may change it in place

    def logits_of_equal_groups(self, tokens: torch.Tensor) -> torch.Tensor | None:
        """`logits(tokens)` at a step where the rows of each sentence are equal (beam search's first step: each
        sentence's beams start from the same token with empty caches), computed for one row per sentence and repeated,
        the cache then holding `beams` copies of each row: the numbers of computing every row (each row's are its
        own), a `beams`-th of the work (layer-wise coordination's first step projects every layer's source keys).
        Where the memory is kept per beam (`group == 1`: mixed attention), that step reads one row of it per sentence,
        and the next steps read that row through `memory_rows` (the compiled layers) or copies of it. None (nothing
        computed) unless the rows are computed alone (`rows_computed_alone`: the inference copies, whose kernels
        compute each row by itself; torch's products on the model itself choose their kernels by the row count, so one
        row of a group differs from three in the last bits), this is the first step, there are beams and the tokens
        are equal within each sentence."""
        if not self.rows_computed_alone or self.position != 0 or self.beams == 1:
            return None
        firsts = tokens[:: self.beams]
        if not bool((tokens.view(-1, self.beams) == firsts[:, None]).all()):
            return None
        memory_per_beam = self.group == 1
        if memory_per_beam:
            self.keep_memory_rows(torch.arange(0, tokens.shape[0], self.beams, device=tokens.device))
        logits = self.logits(firsts)
        copies = torch.arange(firsts.shape[0], device=tokens.device).repeat_interleave(self.beams)
        self.cache.self_attention_cache.select(copies, rows_dropped=True)
        if memory_per_beam:
            if self.reads_memory_rows():
                self.memory_rows = copies
            else:
                self.keep_memory_rows(copies)
        return logits.repeat_interleave(self.beams, dim=0)

    def select(self, index: torch.Tensor, rows_dropped: bool) -> None:
        """Keep rows `index`: a beam reorder (`rows_dropped=False`) or rows leaving the batch (whole groups)."""
        self.cache.self_attention_cache.select(index, rows_dropped)
        if not rows_dropped:
            return
        kept = (index[:: self.group] // self.group).long()  # the groups (sentences) kept (beam indices are int32)
        if self.reads_memory_rows():
            self.memory_rows = kept if self.memory_rows is None else self.memory_rows.index_select(0, kept)
        else:
            self.keep_memory_rows(kept)

    def drops_rows_without_copies(self) -> bool:
        """Whether rows leave the batch without copying the caches: the self-attention slots through `key_rows` and
        the memory through `memory_rows` (the compiled layers); the search loops then drop finished rows at once."""
        return self.cache.self_attention_cache.reorders_key_rows and self.reads_memory_rows()

    def reads_memory_rows(self) -> bool:
        """Whether the steps read the memory through `memory_rows`: the compiled layers, once the first step computed
        the cross-attention keys/values (and any self-attention slot's prefix, layer-wise coordination's source part,
        whose mask they then read through `memory_rows` too)."""
        return self.compiled_layers is not None and bool(self.cache.is_updated)

    def gather_memory_rows(self) -> None:
        """Give each group its own row of the memory, its mask and the cross-attention keys/values again (those of
        `memory_rows`), for the modules' Python path; nothing to do without `memory_rows`."""
        if self.memory_rows is not None:
            memory_rows, self.memory_rows = self.memory_rows, None
            self.keep_memory_rows(memory_rows)

    def keep_memory_rows(self, kept: torch.Tensor) -> None:
        """Keep rows `kept` of the memory, its mask and the cross-attention keys/values, in new tensors."""
        self.cache.cross_attention_cache.select(kept)
        self.memory = self.memory.index_select(0, kept)
        if self.layer_memories is not None:
            self.layer_memories = self.layer_memories.index_select(0, kept)
        if self.attention_mask is not None:
            self.attention_mask = self.attention_mask.index_select(0, kept)
        self.memory_mask = self.build_memory_mask()
