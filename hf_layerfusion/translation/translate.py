"""Batched translation of raw sentences with any hf_layerfusion model (used by the `translate` command, the examples,
the benchmarks and the multilingual evaluation)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from tqdm.auto import tqdm
from transformers.utils import logging

from ..inference.fast_generation import fast_generate
from ..inference.inference_copies import prepare_for_inference
from ..modeling.input_checks import check_decoder_groups, check_generation_arguments, check_positive_int, check_switch
from .language_tags import check_language_tag, check_sources_tagged, check_sources_untagged, tag_source

translation_logger = logging.get_logger(__name__)


def source_lengths(
    tokenizer, sentences: Sequence[str], max_source_length: int, caller: str = "translate()"
) -> list[int]:
    """Each sentence's token count as the model reads it: at most `max_source_length`, a longer sentence is cut to its
    beginning, which one warning of the call says (`caller`, how many sentences, the limit)."""
    # one token past the limit: a sentence that long is one the limit cuts
    encoded = tokenizer(list(sentences), truncation=True, max_length=max_source_length + 1)["input_ids"]
    lengths = [len(ids) for ids in encoded]
    cut = sum(length > max_source_length for length in lengths)
    if cut:
        translation_logger.warning(
            f"{caller}: {cut} of {len(sentences)} sentence(s) are longer than max_source_length={max_source_length} "
            f"tokens (default: the model's position table) and are cut: only their first {max_source_length} tokens "
            "are translated. Split long sentences, or pass a larger max_source_length where the position table allows."
        )
    return [min(length, max_source_length) for length in lengths]


@torch.no_grad()
def translate(
    model,
    tokenizer,
    sentences: Sequence[str],
    batch_size: int = 32,
    num_beams: int | None = None,
    max_new_tokens: int | None = None,
    decoder_groups: Sequence[int] | None = None,
    max_source_length: int | None = None,
    progress: bool = False,
    fast: bool = True,
    quantization: str | None = None,
    tgt_lang: str | None = None,
    inter_threads: int = 1,
    **generate_kwargs,
) -> list[str] | list[list[str]]:
    """Translations of `sentences`, in order. `num_beams` / `max_new_tokens` default to the model's generation
    config; `decoder_groups` (GTrans) mixes only those 1-based decoder groups; sources longer than
    `max_source_length` tokens are truncated (default: the model's position table), which a warning says once per
    call (how many, the limit); other keyword arguments go to `generate()`. Sentences are sorted by their token count
    into batches (less padding) and returned in input order.

    `fast=True` (default) decodes with `hf_layerfusion.inference.fast_generate`: the tokens of `generate()`
    for greedy and beam search, faster (settings it does not cover run `generate()`); `fast=False` calls
    `generate()` itself. `quantization="int8"` translates with the model's int8 copy (faster on CPU, not
    token-exact; see `hf_layerfusion.inference.prepare_for_inference`).

    `inter_threads=N` translates N batches side by side, each in a thread of its own that gets an equal share of
    torch's threads (`torch.get_num_threads() // N`, at least one), as CTranslate2's `inter_threads`: more sentences
    per second on many cores, where one batch's decoding steps are too small to keep them all busy; each batch's
    translation is the one it gets alone at that thread count. The default, 1, gives every thread to one batch at a
    time (on 2 cores the faster choice for the fast loop: see the README's speed results).

    A multilingual model (its tokenizer holds `<2xx>` target-language tags, `hf_layerfusion.training.multilingual`)
    needs the target language: `tgt_lang="de"` prepends its tag to every sentence (one that begins with a tag of its
    own is a `ValueError`: the model would read two tags); without it every sentence must begin with a tag, else a
    `ValueError` (an untagged source would come back in whichever language the model drifts to).

    With `num_return_sequences=n > 1` (a `generate()` keyword, or the model's generation config) the result holds
    one list per sentence: its n hypotheses, best first, as `generate()` returns them for that sentence. An empty
    `sentences` is an error (nothing to translate is more often a wrong input file than a request). The model's
    training mode is left as it was (translation itself runs in eval mode)."""
    if isinstance(sentences, (str, bytes)) or not isinstance(sentences, Sequence):
        # a bare string is a sequence of characters: it would be translated character by character
        raise TypeError(
            f"`sentences` must be a list of strings, got {type(sentences).__name__} {str(sentences)[:50]!r}; "
            "wrap a single sentence in a list."
        )
    not_text = [(index, sentence) for index, sentence in enumerate(sentences) if not isinstance(sentence, str)]
    if not_text:
        index, sentence = not_text[0]
        raise TypeError(f"`sentences[{index}]` is {type(sentence).__name__} {sentence!r}, not a string.")
    check_positive_int(batch_size, "batch_size")
    check_positive_int(inter_threads, "inter_threads")
    check_switch(progress, "progress")
    check_switch(fast, "fast")
    check_positive_int(num_beams, "num_beams", allow_none=True)
    check_positive_int(max_new_tokens, "max_new_tokens", allow_none=True)
    check_positive_int(max_source_length, "max_source_length", allow_none=True)
    check_positive_int(generate_kwargs.get("num_return_sequences"), "num_return_sequences", allow_none=True)
    if not sentences:
        raise ValueError("`sentences` is empty (0 sentences): give at least one sentence to translate.")
    if tgt_lang is not None:
        check_language_tag(tokenizer, tgt_lang)
        check_sources_untagged(sentences, tgt_lang, "tgt_lang=")
        sentences = [tag_source(sentence, tgt_lang) for sentence in sentences]
    else:
        check_sources_tagged(tokenizer, sentences, "tgt_lang=")
    if num_beams is not None:
        generate_kwargs["num_beams"] = num_beams
    if max_new_tokens is not None:
        positions = model.config.max_position_embeddings
        if max_new_tokens > positions:  # the decoder reads the start token and all but the last new token
            raise ValueError(
                f"max_new_tokens={max_new_tokens} exceeds the model's position table (max_position_embeddings="
                f"{positions}): a translation that long could not be decoded; give at most {positions}."
            )
        # replaces the saved `max_length` limit rather than competing with it
        generate_kwargs.update(max_new_tokens=max_new_tokens, max_length=None)
    if decoder_groups is not None:
        generate_kwargs["decoder_groups"] = check_decoder_groups(decoder_groups, model.config.num_decoder_groups)
    if generate_kwargs.get("stop_strings") is not None:
        generate_kwargs["tokenizer"] = tokenizer  # generate() matches stop strings through the tokenizer's vocabulary
    # before a copy is made or a batch encoded
    check_generation_arguments(generate_kwargs, getattr(model, "generation_config", None))
    max_source_length = max_source_length or model.config.max_position_embeddings
    lengths = source_lengths(tokenizer, sentences, max_source_length)
    order = sorted(range(len(sentences)), key=lambda i: lengths[i], reverse=True)
    translations: list = [None] * len(sentences)
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    was_training = model.training
    threads = torch.get_num_threads()
    model.eval()
    try:
        engine = model if quantization is None else prepare_for_inference(model, quantization)
        # every batch encoded here, before any is translated: a fast tokenizer refuses calls from two threads at once
        # ("Already borrowed")
        encoded = [
            tokenizer(
                [sentences[i] for i in batch],
                padding=True,
                # whatever the tokenizer's own side: a left-padded source shifts its positions (as in Marian), so
                # that a sentence's translation would depend on the longer sentences sorted into its batch
                padding_side="right",
                truncation=True,
                max_length=max_source_length,
                return_tensors="pt",
            ).to(model.device)
            for batch in batches
        ]

        def translated(inputs):
            return fast_generate(engine, **inputs, **generate_kwargs) if fast else engine.generate(**inputs, **generate_kwargs)

        with ThreadPoolExecutor(
            inter_threads, thread_name_prefix="translate", initializer=torch.set_num_threads,
            initargs=(max(1, threads // inter_threads),),
        ) if inter_threads > 1 else contextlib.nullcontext() as pool:
            outputs_in_order = pool.map(translated, encoded) if pool is not None else map(translated, encoded)
            progress_bar = tqdm(batches, desc="Translating", unit="batch", disable=not progress)
            for batch, outputs in zip(progress_bar, outputs_in_order):
                # beam search right-pads finished hypotheses (with </s> or <pad>): special tokens are dropped here
                texts = [text.strip() for text in tokenizer.batch_decode(outputs, skip_special_tokens=True)]
                # generate() returns the num_return_sequences hypotheses of each sentence one after the other
                per_sentence = len(texts) // len(batch)
                for position, i in enumerate(batch):
                    hypotheses = texts[position * per_sentence : (position + 1) * per_sentence]
                    translations[i] = hypotheses if per_sentence > 1 else hypotheses[0]
    finally:
        if inter_threads > 1:  # the pool's threads set torch's thread count for the process (MKL's too): set back
            torch.set_num_threads(threads)
        model.train(was_training)
    return translations
