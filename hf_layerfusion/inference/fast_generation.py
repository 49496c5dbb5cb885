"""Fast generation for every hf_layerfusion family: the tokens of `generate()`, with less work per step.

`fast_generate(model, **inputs_and_generate_kwargs)` returns what `model.generate(...)` returns for greedy search and
beam search. It runs `generate()`'s own preparation (generation config, special tokens, beam expansion, logits
processors, stopping criteria) and replaces only the encoder call and the decoding loop (transformers' `custom_generate`
hook):

- a padded batch is encoded in groups of sentences of similar length, each cut to its longest sentence
  (`encoding.encode_by_length`), so that the encoder's products skip most of the padding;
- the decoder runs through the model's own stack (`LayerStack.run_layers`: the family's layers, connection, readout
  and `output_head`), one position per step, without `forward()`'s per-step work (output-capture hooks, mask
  building, input checks, output dataclasses);
- keys/values live in `DecodingCache`: self-attention slots preallocated row-major (a step writes its position in
  place instead of concatenating the whole cache), cross-attention keys/values computed once per input and, in
  beam search, once per sentence instead of once per beam (the backbone's attention folds a
  sentence's beams into query positions: `MultiHeadAttention.accepts_key_groups`); where the compiled layers run every
  step, a beam reorder (and rows leaving the batch) changes only which buffer row holds each row's keys/values at each
  position (`key_rows`, read by the attention kernel), and rows leaving the batch change only which row of the
  cross-attention keys/values and of the memory mask each sentence reads (`memory_rows`); beam search's first step,
  whose beams are equal, is computed once per sentence (`DecoderSteps.logits_of_equal_groups`: layer-wise
  coordination's per-layer source keys too); elsewhere it moves, in place, the rows whose beam
  changed, every slot's in one compiled call (`move_rows`) that copies each row once (`generate()` reorders every
  slot, cross-attention ones included, whose rows are equal);
- sentences (greedy) and batch items (beam search) that can no longer change the output leave the batch, so their
  rows are no longer computed (`generate()` keeps computing them until the last one finishes): at once where that
  copies nothing (`key_rows`, `memory_rows`), else once they are a quarter of the rows; with logits processors that
  are not known to act row by row, every row is kept, as `generate()` does;
- beam search's bookkeeping is transformers' own helpers (`_get_top_k_continuations`, `_update_finished_beams`, ...)
  or, on CPU, two compiled kernels that compute their numbers bit for bit (tests/test_beam_search_kernels.py holds
  them to the helpers on every supported transformers release): `beam_top_k_continuations` chooses each item's best
  candidates in one pass over the log-probabilities (instead of their sum with the beam scores as a new tensor and
  `torch.topk`; equal scores ranked by index), `beam_finish_step` does the rest of the step (running and finished
  beams, length penalty, early stopping) in one call instead of about forty torch operations;
- the self-attention buffers of a generation serve the next one in the same thread (`decoding.SlotMemory`), so that
  a batch does not fault in tens of megabytes of fresh pages.

`prepare_for_inference(model, quantization=...)` gives the model `fast_generate` runs: on CPU in float32 an inference
copy whose linear layers and decoding attention are compiled kernels (`Float32Linear`, `decoding_attention.py`), with
`quantization="int8"` one whose linear layers are int8 (`Int8Linear`); elsewhere the model itself.

In float32 the numbers are `generate()`'s except for the order of sums (the kernels', an encoder group's attention
over fewer masked keys, and beam search attends a sentence's beams together), so the tokens are the same unless two candidates tie to the last bits;
tests/test_fast_generation.py checks the tokens against `generate()` for every family, greedy and beam, and
`study/bench_inference.py` on every run.

Anything the loop does not cover (sampling, `return_dict_in_generate`, streamers, assistant models, custom stopping
criteria, a prompt for the decoder, attention implementations other than eager and SDPA (and the copies'), ...) runs
`generate()` itself, with one warning naming the reason; `fast_generate(..., fallback=False)` raises
`UnsupportedFastGeneration` instead.
"""

from __future__ import annotations

import contextlib

import torch
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
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
from transformers.utils import ModelOutput, logging

from ..compat import CACHE_NAME, LEGACY_CACHE_NAME, beam_search_loop, sample_loop
from ..modeling.input_checks import check_generation_arguments, check_switch
from .cpu_kernels import torch_operators_on_one_thread
from .decoding import DecoderSteps
from .decoding_attention import DECODING_ATTENTION
from .encoding import encode_by_length
from .inference_copies import compiled_decoder_layers, prepare_for_inference
from .search import beam_search, greedy_search

fast_generation_logger = logging.get_logger(__name__)

FAST_ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager", DECODING_ATTENTION)  # the last: the inference copies'
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


class UnsupportedFastGeneration(ValueError):
    """A generation setting the fast loop does not cover; `fast_generate(..., fallback=True)` runs `generate()`."""


# keyword arguments of generate() that the fast loop does not receive through transformers' `custom_generate` hook
# (`stop_strings`: its stopping criterion needs the `tokenizer`, which that hook does not pass on)
CALL_KEYWORDS_NOT_COVERED = ("streamer", "assistant_model", "synced_gpus", "custom_generate", "stopping_criteria",
                             "stop_strings")


def precision_reason(model) -> str | None:
    """Why the loop cannot run `model` at its precision, or None. Its tokens are generate()'s in float32; in a lower
    precision its rows leaving the batch change the shapes of the products and so their rounding, and beam search's
    choices with it (and the float32 copy's kernels take float32 inputs only)."""
    device_type = model.device.type
    if torch.is_autocast_enabled(device_type):
        return f"autocast ({torch.get_autocast_dtype(device_type)})"
    if model.dtype != torch.float32:
        return f"a {model.dtype} model"
    return None


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
    precision = precision_reason(model)
    if precision is not None:
        return precision
    implementation = model.config._attn_implementation
    if implementation not in FAST_ATTENTION_IMPLEMENTATIONS:
        return f"attn_implementation={implementation!r}"
    if input_ids.shape[1] != 1:
        return "a decoder prompt (decoder_input_ids)"
    if model_kwargs.get("decoder_attention_mask") is not None or model_kwargs.get("decoder_inputs_embeds") is not None:
        return "decoder_attention_mask / decoder_inputs_embeds"
    cache = model_kwargs.get(CACHE_NAME)
    if cache is not None and cache.get_seq_length() > 0:
        return f"a filled {CACHE_NAME}"
    criteria = {type(criterion) for criterion in stopping_criteria}
    if MaxLengthCriteria not in criteria or not criteria <= {MaxLengthCriteria, EosTokenCriteria}:
        return f"stopping criteria {sorted(c.__name__ for c in criteria)}"
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
    check_switch(fallback, "fallback")

    def decode(model, input_ids, logits_processor, stopping_criteria, generation_config, **model_kwargs):
        reason = unsupported_reason(model, input_ids, stopping_criteria, generation_config, model_kwargs)
        if reason is not None:
            mode = generation_config.get_generation_mode()
            method = beam_search_loop if mode == GenerationMode.BEAM_SEARCH else sample_loop
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
            compile_layers=compiled_decoder_layers,
            # the inference copies' kernels compute each row by itself (`prepare_for_inference`)
            rows_computed_alone=getattr(model, "prepared_for_inference", None) is not None,
        )
        try:
            if generation_config.num_beams > 1:
                return beam_search(model, steps, input_ids, logits_processor, generation_config, max_length, compact)
            return greedy_search(steps, input_ids, logits_processor, generation_config, max_length, compact)
        finally:
            steps.cache.release()  # its buffers serve the thread's next generation

    return decode


def encodes_by_length(model, kwargs: dict) -> bool:
    """Whether `fast_generate` encodes the batch itself, in groups of similar length (`encode_by_length`), and hands
    `generate()` the encoder outputs: for token ids with an attention mask as the encoder's only tensors, and no
    encoder attentions or hidden states asked for (the groups' outputs leave them out)."""
    input_ids = kwargs["inputs"] if "inputs" in kwargs else kwargs.get("input_ids")
    mask = kwargs.get("attention_mask")
    if not (isinstance(input_ids, torch.Tensor) and isinstance(mask, torch.Tensor) and input_ids.shape == mask.shape):
        return False
    others = [name for name, value in kwargs.items() if name not in ("inputs", "input_ids", "attention_mask")
              and isinstance(value, (torch.Tensor, ModelOutput, Cache))]
    config = kwargs.get("generation_config") or model.generation_config
    wants_encoder_details = any(
        kwargs.get(name, getattr(config, name, False))
        for name in ("return_dict_in_generate", "output_attentions", "output_hidden_states")
    )
    return not others and not wants_encoder_details


def empty_cache_for_generate(model, kwargs: dict) -> dict:
    """`{cache name: an empty EncoderDecoderCache of DynamicCaches}` for `generate()` to take as the caller's, where the
    call gives none and does not turn the cache off; else {}. `generate()` would make the same caches from the model's
    config (each asking `get_text_config(decoder=True)`, a deep copy of a flat encoder-decoder config: a share of a
    short call's time, study/fast_cpu_translation_log.md), which the fast loop never fills (it keeps its own
    `DecodingCache`); a fallback inside the loop fills this one as it would fill its own (layers made as they are
    first written)."""
    config = kwargs.get("generation_config") or model.generation_config
    if any(kwargs.get(name) is not None for name in (CACHE_NAME, LEGACY_CACHE_NAME)):
        return {}
    if kwargs.get("use_cache", config.use_cache) is False:
        return {}
    if kwargs.get("cache_implementation", config.cache_implementation) is not None:  # generate() makes another kind
        return {}
    return {CACHE_NAME: EncoderDecoderCache(DynamicCache(), DynamicCache())}


def fast_generate(model, inputs: torch.Tensor | None = None, *, quantization: str | None = None, fallback: bool = True, **kwargs):
    """`model.generate(inputs, **kwargs)` with the fast decoding loop (see the module docstring): the same output for
    greedy and beam search. It runs the model's inference copy (`prepare_for_inference`): on CPU in float32 the
    compiled kernels' copy (the same function, sums in another order), with `quantization="int8"` the int8 copy (not
    token-exact, see there). Settings the loop does not cover run `generate()` itself (of `model`, or of the int8
    copy; a warning names the reason once), or raise `UnsupportedFastGeneration` with `fallback=False`."""
    # before the copy is made or the batch encoded
    check_switch(fallback, "fallback")
    check_generation_arguments(kwargs, getattr(model, "generation_config", None))
    engine = prepare_for_inference(model, quantization)
    # a fallback is generate() of the model given, except with int8, whose numbers are the point of the call
    fallback_model = engine if quantization == "int8" else model
    if inputs is not None:
        kwargs["inputs"] = inputs
    covered = [name for name in CALL_KEYWORDS_NOT_COVERED if kwargs.get(name) is not None]
    reason = f"the generate() argument(s) {covered}" if covered else None
    if getattr(kwargs.get("generation_config") or getattr(model, "generation_config", None), "stop_strings", None):
        reason = "the generation config's stop_strings"
    if not (hasattr(engine, "output_head") and hasattr(engine, "get_decoder")):
        reason = f"{type(engine).__name__}, which is not an hf_layerfusion model"
    else:
        reason = precision_reason(model) or reason
    if reason is not None:
        if not fallback:
            raise UnsupportedFastGeneration(reason)
        report_fallback(reason)
        return fallback_model.generate(**kwargs)

    # inside the loop a fallback runs transformers' loop on the model generate() was called on: only where that is
    # the fallback model (not the float32 copy, whose attention returns no weights)
    decode = fast_decoding_loop(fallback and engine is fallback_model)
    engine_kwargs = {**kwargs, **empty_cache_for_generate(engine, kwargs)}
    # on CPU, torch's operators on one thread beside the kernels' pool (`torch_operators_on_one_thread`)
    threads = torch_operators_on_one_thread() if engine.device.type == "cpu" else contextlib.nullcontext()
    try:
        with torch.inference_mode(), threads:
            if encodes_by_length(engine, kwargs):
                input_ids = kwargs["inputs"] if "inputs" in kwargs else kwargs["input_ids"]
                encoder_outputs = encode_by_length(engine.get_encoder(), input_ids, kwargs["attention_mask"])
                return engine.generate(custom_generate=decode, encoder_outputs=encoder_outputs, **engine_kwargs)
            return engine.generate(custom_generate=decode, **engine_kwargs)
    except UnsupportedFastGeneration as error:
        if not fallback:
            raise
        report_fallback(str(error))
        return fallback_model.generate(**kwargs)
