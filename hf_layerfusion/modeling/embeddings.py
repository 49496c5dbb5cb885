"""Token and position embeddings of both stacks: `scale * E[x] + P[pos]` (+ optional LayerNorm), with Marian's
sinusoidal table or RoBERTa-style learned positions."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils.import_utils import is_torchdynamo_compiling

from .configuration import LayerFusionConfig


class SinusoidalPositionalEmbedding(nn.Module):
    """Fixed sin/cos table as Marian builds it: sin features in the first half, cos in the second, from 0.

    The table is a buffer, not a frozen parameter: a parameter would come back trainable from `from_pretrained`
    and show up as unused in DDP. It is saved with the model, filled at construction and again by `_init_weights`
    (models built on the meta device get it there)."""

    def __init__(self, num_positions: int, embedding_dim: int):
        super().__init__()
        # in the default dtype, as parameters are: `from_pretrained(dtype=...)` builds the model under that default
        self.weight = nn.Buffer(self.create_weight(num_positions, embedding_dim, dtype=torch.get_default_dtype()))

    def forward(self, position_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(position_ids, self.weight)

    @staticmethod
    def create_weight(n_pos: int, dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        position = torch.arange(n_pos, dtype=torch.float64)[:, None]
        # column j uses exponent 2*(j//2)/dim; even columns feed sin, odd columns feed cos (Marian's layout)
        exponent = 2 * (torch.arange(dim, dtype=torch.float64) // 2) / dim
        angle = position / torch.pow(torch.tensor(10000.0, dtype=torch.float64), exponent)
        sentinel = (dim + 1) // 2
        table = torch.empty(n_pos, dim, dtype=torch.float64)
        table[:, :sentinel] = torch.sin(angle[:, 0::2])
        table[:, sentinel:] = torch.cos(angle[:, 1::2])
        return table.to(dtype)


class TokenAndPositionEmbedding(nn.Module):
    """`scale * E[x] + P[pos]` (+ optional LayerNorm), then dropout. Positions come from the cache length; a config
    without position embeddings (`config.uses_position_embeddings`) adds none, and the length limit still holds."""

    def __init__(self, config: LayerFusionConfig):
        super().__init__()
        self.config = config
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.offset = config.position_offset
        if not config.uses_position_embeddings:
            self.embed_positions = None
        elif config.position_embedding_type == "sinusoidal":
            self.embed_positions = SinusoidalPositionalEmbedding(config.max_position_embeddings, config.d_model)
        else:
            self.embed_positions = nn.Embedding(
                config.max_position_embeddings + self.offset, config.d_model, padding_idx=config.pad_token_id
            )
        self.layernorm_embedding = (
            nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.layernorm_embedding else None
        )
        self.dropout = config.dropout

    def position_ids(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor, past_length: int
    ) -> torch.Tensor:
        seq_length = inputs_embeds.shape[1]
        # a data-dependent check cannot be traced by torch.compile(fullgraph=True); compiled generation sizes its
        # static cache (and so the longest position) before the first step, where this check has already run
        if not is_torchdynamo_compiling():
            self.check_length(past_length + seq_length)
        if self.config.position_embedding_type == "learned" and input_ids is not None:
            # RoBERTa: pads keep the padding position, real tokens count from pad_token_id + 1
            not_pad = input_ids.ne(self.config.pad_token_id).long()
            return (torch.cumsum(not_pad, dim=1) + past_length) * not_pad + self.config.pad_token_id
        # arange of the static length, then shifted: with a static cache under torch.compile `past_length` is a
        # traced value, and `arange(past_length, past_length + seq_length)` would have a data-dependent size
        positions = torch.arange(seq_length, device=inputs_embeds.device) + past_length
        return (positions + self.offset).unsqueeze(0)

    def check_length(self, length: int) -> None:
        if length > self.config.max_position_embeddings:
            raise ValueError(
                f"Sequence of length {length} exceeds the position table "
                f"(max_position_embeddings={self.config.max_position_embeddings}); truncate the input or "
                "lower the generation max_length."
            )

    def combine(self, inputs_embeds: torch.Tensor, position_embeddings: torch.Tensor | None) -> torch.Tensor:
        """`scale * E[x] + P[pos]` (+ the LayerNorm): the arithmetic of `forward` and `decoding_step`, one place."""
        hidden_states = inputs_embeds * self.embed_scale
        if position_embeddings is not None:
            hidden_states = hidden_states + position_embeddings
        if self.layernorm_embedding is not None:
            hidden_states = self.layernorm_embedding(hidden_states)
        return hidden_states

    def decoding_step(self, inputs_embeds: torch.Tensor, past_length: int) -> torch.Tensor | None:
        """`forward(input_ids, inputs_embeds, past_length)` for one new position per row (`inputs_embeds`
        `(rows, 1, d_model)`, the tokens' embeddings) in eval mode, bit for bit (`combine`), with the position's row
        of the table read directly (the fast decoding loop's steps, where the position ids, the table lookup and the
        dropout call cost more than the arithmetic). None where the positions depend on the tokens (learned
        RoBERTa-style positions count from the padding) or dropout applies (training): the caller runs `forward`
        there."""
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[1] != 1:
            raise ValueError(
                f"decoding_step embeds one position per row, (rows, 1, d_model); got inputs_embeds of shape "
                f"{tuple(inputs_embeds.shape)}: run forward() for several positions."
            )
        if isinstance(past_length, bool) or not isinstance(past_length, int) or past_length < 0:
            raise ValueError(f"past_length must be an int >= 0 (the positions already decoded), got {past_length!r}.")
        if self.training or (self.embed_positions is not None and self.config.position_embedding_type == "learned"):
            return None
        self.check_length(past_length + 1)
        position = None if self.embed_positions is None else self.embed_positions.weight[past_length + self.offset]
        return self.combine(inputs_embeds, position)

    def forward(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor, past_length: int = 0
    ) -> torch.Tensor:
        positions = self.position_ids(input_ids, inputs_embeds, past_length)
        position_embeddings = None if self.embed_positions is None else self.embed_positions(positions)
        hidden_states = self.combine(inputs_embeds, position_embeddings)
        return F.dropout(hidden_states, p=self.dropout, training=self.training)
