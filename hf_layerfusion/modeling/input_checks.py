"""Checks of what the models and their generation helpers are called with: token ids, embeddings and attention masks
of each stack, training labels, decoder groups, switches, positive integer and finite number arguments, search settings.

Every check raises an error that names the bad value, before any computation: a wrong argument must never give a
silent wrong answer. They are plain functions so that every family's backbone calls the same code.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import torch


def check_positive_int(value, name: str, *, allow_none: bool = False):
    """`value` if it is a positive integer (bools and floats refused), else a `ValueError` naming it."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
    return int(value)


def check_finite_number(value, name: str, *, allow_none: bool = False):
    """`value` if it is a finite real number (bools refused), else a `ValueError` naming it: NaN or infinity compares
    false with everything, so a search would order its candidates by nothing."""
    if value is None and allow_none:
        return None
    finite = isinstance(value, numbers.Integral) or (isinstance(value, numbers.Real) and math.isfinite(value))
    if isinstance(value, bool) or not finite:
        raise ValueError(f"`{name}` must be a finite number, got {value!r}.")
    return value


def check_switch(value, name: str, *, allow_none: bool = False):
    """`value` if it is `True` or `False`, else a `TypeError` naming it: `"false"`, `"no"` and `1` are truthy, and a
    switch given one would be silently on."""
    if value is None and allow_none:
        return None
    if value is not True and value is not False:
        raise TypeError(f"`{name}` must be True or False, got {value!r} ({type(value).__name__}).")
    return value


def check_generation_arguments(arguments: dict, generation_config=None) -> None:
    """The search settings of a `generate()` call: its keyword `arguments`, else the generation config it runs (its
    `generation_config` keyword, else `generation_config`). `num_beams`, `max_new_tokens`, `max_length` and
    `num_return_sequences` positive integers, `length_penalty` a finite number, `do_sample` a switch and
    `early_stopping` a switch or `"never"` (each may be unset): `num_beams=0` fails deep inside generation (a
    division by zero), `max_new_tokens=2.5`, `max_length=2.5` and `length_penalty=nan` give an answer nobody asked
    for (and the fast loop's and `generate()`'s disagree), and `do_sample=1` samples in `generate()`'s loop (which
    tests its truth) but picks the greedy mode (`get_generation_mode` tests `is True`), which the fast loop runs."""
    config = arguments.get("generation_config") or generation_config

    def setting(name: str):
        return arguments[name] if name in arguments else getattr(config, name, None)

    for name in ("num_beams", "max_new_tokens", "max_length", "num_return_sequences"):
        check_positive_int(setting(name), name, allow_none=True)
    check_finite_number(setting("length_penalty"), "length_penalty", allow_none=True)
    check_switch(setting("do_sample"), "do_sample", allow_none=True)
    early_stopping = setting("early_stopping")
    if early_stopping is not None and early_stopping is not True and early_stopping is not False:
        if not (isinstance(early_stopping, str) and early_stopping == "never"):
            raise ValueError(f'`early_stopping` must be True, False or "never", got {early_stopping!r}.')


def _as_int(value, name: str) -> int:
    """An integer element (Python, NumPy or 0-d integer tensor); bools, floats and strings are refused."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 0 or value.is_floating_point() or value.dtype == torch.bool:
            raise ValueError(f"`{name}` must hold integers, got the tensor {value!r}.")
        return int(value)
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"`{name}` must hold integers, got {value!r} ({type(value).__name__}).")
    return int(value)


def check_decoder_groups(groups, num_groups: int, name: str = "decoder_groups") -> list[int]:
    """Sorted 1-based decoder group numbers; `None` means every group. A string (`"12"` is not `[1, 2]`), a float
    (`[1.7]` is not `[1]`), a bool, a repeated, out-of-range or empty selection is refused naming the value."""
    if groups is None:
        return list(range(1, num_groups + 1))
    if isinstance(groups, torch.Tensor):
        groups = groups.reshape(-1).tolist() if not groups.is_floating_point() else [groups]
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Sequence):
        raise ValueError(f"`{name}` must be a list of 1-based group numbers, got {groups!r} ({type(groups).__name__}).")
    values = [_as_int(group, name) for group in groups]
    if not values:
        raise ValueError(f"`{name}` is empty; give at least one group in [1, {num_groups}] or None for all.")
    repeated = sorted({value for value in values if values.count(value) > 1})
    if repeated:
        raise ValueError(f"`{name}` repeats group(s) {repeated}: {list(groups)!r}.")
    outside = [value for value in values if not 1 <= value <= num_groups]
    if outside:
        raise ValueError(f"`{name}` must be 1-based group numbers in [1, {num_groups}], got {outside} in {values}.")
    return sorted(values)


def check_labels(config, labels, decoder_inputs=None) -> None:
    """Training targets: a 2-D integer batch of token ids in [0, vocab_size), or -100 (positions the loss ignores),
    of the (batch, length) of the decoder's inputs where they are given (`decoder_inputs`: `decoder_input_ids` or
    `decoder_inputs_embeds`). An id outside the vocabulary would fail deep in the loss with a bare index error (or, at
    the last position, never reach the decoder's input check), and other shapes in torch's loss naming neither
    tensor, so they are named here. Value checks are skipped while compiling."""
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"`labels` must be a torch.Tensor, got {type(labels).__name__}.")
    if labels.is_floating_point() or labels.dtype == torch.bool or labels.is_complex():
        raise TypeError(f"`labels` must hold integer token ids, got dtype {labels.dtype}.")
    if labels.dim() != 2:
        raise ValueError(f"`labels` must be 2-D (batch, length), got shape {tuple(labels.shape)}.")
    if decoder_inputs is not None and tuple(decoder_inputs.shape[:2]) != tuple(labels.shape):
        raise ValueError(
            f"`labels` has shape {tuple(labels.shape)} but the decoder's inputs have (batch, length) "
            f"{tuple(decoder_inputs.shape[:2])}: each label is the token that follows the decoder input at its "
            "position (leave out decoder_input_ids to have them made from the labels)."
        )
    if torch.compiler.is_compiling() or not labels.numel():
        return
    outside = labels[(labels != -100) & ((labels < 0) | (labels >= config.vocab_size))]
    if outside.numel():
        raise ValueError(
            f"`labels` holds token id {int(outside[0])}, outside the vocabulary [0, {config.vocab_size}) and not "
            "-100 (the ignored position): a tokenizer that does not match the model, or padding not replaced by -100?"
        )


def check_model_inputs(
    config,
    input_ids=None,
    attention_mask=None,
    inputs_embeds=None,
    name: str = "input_ids",
    past_length: int = 0,
):
    """Shapes and values of one stack's inputs (`name` = "input_ids" or "decoder_input_ids"): a 2-D integer batch
    with at least one row and one position, token ids in [0, vocab_size), `inputs_embeds` of width d_model, and an
    attention mask (2-D of length `past_length` + the new positions, or 4-D) of the same batch size. Value checks
    are skipped while compiling (they need the data)."""
    embeds_name = "inputs_embeds" if name == "input_ids" else name.replace("input_ids", "inputs_embeds")
    mask_name = "attention_mask" if name == "input_ids" else name.replace("input_ids", "attention_mask")
    if input_ids is not None and inputs_embeds is not None:
        raise ValueError(f"Give `{name}` or `{embeds_name}`, not both.")
    if input_ids is not None:
        if not isinstance(input_ids, torch.Tensor):
            raise TypeError(f"`{name}` must be a torch.Tensor, got {type(input_ids).__name__}.")
        if input_ids.is_floating_point() or input_ids.dtype == torch.bool or input_ids.is_complex():
            raise TypeError(f"`{name}` must hold integer token ids, got dtype {input_ids.dtype}.")
        if input_ids.dim() != 2:
            raise ValueError(
                f"`{name}` must be 2-D (batch, length), got shape {tuple(input_ids.shape)}"
                + ("; add a batch dimension with `.unsqueeze(0)`." if input_ids.dim() == 1 else ".")
            )
        batch_shape = tuple(input_ids.shape)
        if not torch.compiler.is_compiling() and input_ids.numel():
            low, high = int(input_ids.min()), int(input_ids.max())
            if low < 0 or high >= config.vocab_size:
                bad = low if low < 0 else high
                raise ValueError(
                    f"`{name}` holds token id {bad}, outside the vocabulary [0, {config.vocab_size}) "
                    "(a tokenizer that does not match the model?)."
                )
    elif inputs_embeds is not None:
        if not isinstance(inputs_embeds, torch.Tensor) or inputs_embeds.dim() != 3:
            shape = tuple(inputs_embeds.shape) if isinstance(inputs_embeds, torch.Tensor) else type(inputs_embeds)
            raise ValueError(f"`{embeds_name}` must be a 3-D tensor (batch, length, d_model), got {shape}.")
        if inputs_embeds.shape[-1] != config.d_model:
            raise ValueError(
                f"`{embeds_name}` has width {inputs_embeds.shape[-1]}, the model's d_model is {config.d_model}."
            )
        batch_shape = tuple(inputs_embeds.shape[:2])
    else:
        return
    if batch_shape[0] == 0 or batch_shape[1] == 0:
        raise ValueError(f"`{name}` is an empty batch (shape {batch_shape}); give at least one token of one sentence.")
    if attention_mask is None:
        return
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"`{mask_name}` must be a torch.Tensor, got {type(attention_mask).__name__}.")
    if attention_mask.dim() == 2:
        expected = (batch_shape[0], past_length + batch_shape[1])
        if tuple(attention_mask.shape) != expected:
            raise ValueError(
                f"`{mask_name}` has shape {tuple(attention_mask.shape)} but `{name}` has (batch, length) {batch_shape}"
                + (f" after {past_length} cached positions; expected {expected}." if past_length else ".")
            )
    elif attention_mask.dim() == 4:
        if attention_mask.shape[0] != batch_shape[0]:
            raise ValueError(
                f"`{mask_name}` has batch size {attention_mask.shape[0]} but `{name}` has {batch_shape[0]}."
            )
    else:
        raise ValueError(f"`{mask_name}` must be 2-D or 4-D, got shape {tuple(attention_mask.shape)}.")
