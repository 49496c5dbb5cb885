"""The encoder side of the fast path (`hf_layerfusion.inference.fast_generation`): a padded batch encoded in groups
of sentences of similar length, each group cut to its longest sentence, so that the encoder's products skip most of
the padding (`encode_by_length`).

A sentence's encoder output does not depend on the other sentences of its batch nor on the padding after it (every
family's encoder mixes positions only by attention, where padding keys are masked), so each sentence gets the same
output up to float rounding (attention sums over fewer masked keys). Padding positions of the assembled output are
zeros: the decoder's cross-attention masks them."""

from __future__ import annotations

from collections import Counter

import torch

# an encoder call's fixed cost (Python, per-layer dispatch), in source positions of work at the Multi30k preset's size
# (d_model 256; a throwaway probe: about 1 ms per call against about 75 µs per position on one thread); it only
# decides where groups are cut, never what they compute
CALL_COST_POSITIONS = 16


def length_groups(lengths: list[int], call_cost: int) -> list[list[int]]:
    """Rows grouped by length: the partition of the rows, sorted by length, into runs of consecutive lengths that
    minimises `sum(rows in group * longest length in group) + call_cost * groups` (a dynamic programme over the
    distinct lengths). Each group lists its rows in ascending row order."""
    rows_per_length = Counter(lengths)
    distinct = sorted(rows_per_length)
    counts = [rows_per_length[length] for length in distinct]
    # best[j]: the cheapest grouping of the first j distinct lengths; cut[j]: where its last group starts
    best, cut = [0] + [None] * len(distinct), [0] * (len(distinct) + 1)
    for end in range(1, len(distinct) + 1):
        rows = 0
        for start in range(end, 0, -1):
            rows += counts[start - 1]
            cost = best[start - 1] + rows * distinct[end - 1] + call_cost
            if best[end] is None or cost < best[end]:
                best[end], cut[end] = cost, start - 1
    groups, end = [], len(distinct)
    while end > 0:
        members = set(distinct[cut[end] : end])
        groups.append([row for row, length in enumerate(lengths) if length in members])
        end = cut[end]
    return groups[::-1]


def right_padded_lengths(attention_mask: torch.Tensor) -> list[int] | None:
    """Each row's length where every row of the 2-D mask is ones then zeros (right padding) with at least one token;
    else None (left padding, holes, empty rows: then the batch is encoded as it is)."""
    if attention_mask.dim() != 2 or attention_mask.shape[1] == 0:
        return None
    mask = attention_mask.bool()
    lengths = mask.sum(dim=1)
    positions = torch.arange(mask.shape[1], device=mask.device)
    if bool((lengths == 0).any()) or not torch.equal(mask, positions < lengths[:, None]):
        return None
    return lengths.tolist()


def encode_by_length(encoder, input_ids: torch.Tensor, attention_mask: torch.Tensor):
    """`encoder(input_ids=input_ids, attention_mask=attention_mask)` (no attentions, no hidden states), computed in
    groups of similar length (`length_groups`) where the batch is right-padded, and assembled into the batch's shape:
    `last_hidden_state` `(batch, source, d_model)` and, for families that give each decoder layer its own memory,
    `layer_memories` `(batch, decoder_layers, source, d_model)`, zeros at padding positions. Batches that one group
    covers best, or that are not right-padded, are encoded as they are."""

    def encode(ids, mask):
        return encoder(input_ids=ids, attention_mask=mask, output_attentions=False, output_hidden_states=False,
                       return_dict=True)

    lengths = right_padded_lengths(attention_mask)
    groups = None if lengths is None else length_groups(lengths, CALL_COST_POSITIONS)
    if groups is None or len(groups) == 1:
        return encode(input_ids, attention_mask)
    batch, source = input_ids.shape
    parts = []
    for rows in groups:
        index = torch.tensor(rows, device=input_ids.device)
        longest = max(lengths[row] for row in rows)
        parts.append((index, longest, encode(input_ids[index, :longest], attention_mask[index, :longest])))
    first = parts[0][2]
    memory = first.last_hidden_state.new_zeros((batch, source, first.last_hidden_state.shape[-1]))
    layer_memories = getattr(first, "layer_memories", None)
    if layer_memories is not None:
        layer_memories = layer_memories.new_zeros((batch, layer_memories.shape[1], source, layer_memories.shape[-1]))
    for index, longest, part in parts:
        memory[index, :longest] = part.last_hidden_state
        if layer_memories is not None:
            layer_memories[index, :, :longest] = part.layer_memories
    if layer_memories is None:
        return type(first)(last_hidden_state=memory)
    return type(first)(last_hidden_state=memory, layer_memories=layer_memories)
