"""A translation pipeline for every hf_layerfusion family (transformers 5 removed the `translation` task).

Importing hf_layerfusion registers it with transformers' `PIPELINE_REGISTRY` as `"layerfusion-translation"`:
`pipeline("translation", ...)` itself cannot be registered, because transformers 5 resolves that name to a removal
error before it looks at the registry. A saved model's config also names the pipeline under `custom_pipelines` as
`"translation"`, the one place transformers still accepts that name, so that the Hub copy works without the
package: `pipeline("translation", model=repo_id, trust_remote_code=True)`. This module is part of the
self-contained Hub code (`hf_layerfusion.hub.remote_code`), so it may import from the package only what that code can
inline.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import Pipeline

from ..compat import prepare_pipeline_generate_kwargs
from ..inference.fast_generation import fast_generate
from ..inference.inference_copies import QUANTIZATIONS, prepare_for_inference
from ..modeling.input_checks import check_generation_arguments, check_positive_int, check_switch
from ..translation.language_tags import (
    check_language_tag,
    check_sources_tagged,
    check_sources_untagged,
    language_tag,
    tag_source,
)
from ..translation.translate import source_lengths

# `pipeline(PIPELINE_TASK, ...)` with the package installed; `pipeline(HUB_PIPELINE_TASK, ..., trust_remote_code=True)`
# with the Hub code alone.
PIPELINE_TASK = "layerfusion-translation"
HUB_PIPELINE_TASK = "translation"


def padding_last(model_inputs: dict) -> dict:
    """The batch with each row's tokens first and its padding after them. `Pipeline` pads a batch on the tokenizer's
    `padding_side`, and a left-padded source shifts its positions (as in Marian): a sentence's translation would
    depend on the longer sentences batched with it."""
    mask = model_inputs.get("attention_mask")
    if mask is None:
        return model_inputs
    order = torch.argsort((mask == 0).to(torch.int8), dim=1, stable=True)  # a row's tokens, then its padding
    return {**model_inputs, "input_ids": model_inputs["input_ids"].gather(1, order), "attention_mask": mask.gather(1, order)}


class LayerFusionTranslationPipeline(Pipeline):
    """Translate sentences with an hf_layerfusion encoder-decoder (greedy and beam search through the fast decoding
    loop of `hf_layerfusion.inference`, which gives the tokens of `generate()`; other settings run
    `generate()`).

    Call it on a string or a list of strings; `batch_size=` batches the inputs (padded per batch). Each input gives
    `[{"translation_text": ...}]` (one record per returned sequence); a list of inputs gives one record per input
    when `num_return_sequences` is 1, like transformers 4's translation pipeline.

    Args (at construction or per call):
        tgt_lang: multilingual models (`hf_layerfusion.training.multilingual`): the target language, whose `<2xx>` tag
            is prepended to every source; a `ValueError` if the tokenizer has no such tag. Required by a model whose
            tokenizer holds tags, unless every input begins with one (an untagged source would come back in any of
            its languages).
        src_lang: accepted for compatibility with transformers 4's translation pipeline; the tag scheme of Johnson
            et al. (2017) marks only the target, so the source language is validated as a language code and not fed
            to the model.
        max_source_length: truncation length of the sources (default: the model's position table); a call that cuts
            sources says so in one warning (how many, the limit), as `translate()` does.
        decoder_groups: GTrans, 1-based decoder groups to mix (paper Table VI).
        fast: decode with `fast_generate` (default True); False calls `generate()` itself.
        quantization: `"int8"` translates with the model's int8 copy (`prepare_for_inference`: faster on CPU, not
            token-exact); default None (float).
        truncation: True (default) truncates the sources to `max_source_length`; False keeps them whole, so that a
            source longer than the model's position table is an error rather than a translation of its beginning.
        return_tensors: True gives each translation's token ids (`{"translation_token_ids": tensor}`) instead of its
            text, as transformers 4's translation pipeline did (`return_text=False` means the same).
        clean_up_tokenization_spaces: passed to the tokenizer's `decode` (default: the tokenizer's setting).
        any other keyword (`num_beams`, `max_new_tokens`, ...): passed to `generate()`.
    """

    _pipeline_calls_generate = True
    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False

    def _sanitize_parameters(
        self,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        max_source_length: int | None = None,
        decoder_groups: Sequence[int] | None = None,
        fast: bool | None = None,
        quantization: str | None = None,
        truncation: bool | None = None,
        return_tensors: bool | None = None,
        return_text: bool | None = None,
        clean_up_tokenization_spaces: bool | None = None,
        **generate_kwargs,
    ):
        # keywords of the pipeline's own steps: they must not reach generate(), which refuses what it does not know
        switches = dict(fast=fast, truncation=truncation, return_tensors=return_tensors, return_text=return_text,
                        clean_up_tokenization_spaces=clean_up_tokenization_spaces)
        for name, value in switches.items():
            check_switch(value, name, allow_none=True)
        if return_tensors is not None and return_text is not None and return_tensors == return_text:
            raise ValueError(
                f"return_tensors={return_tensors} and return_text={return_text} contradict each other: a record holds "
                "the translation's text or its token ids; give one of them."
            )
        preprocess_params, postprocess_params = {}, {}
        if truncation is not None:
            preprocess_params["truncation"] = truncation
        if return_tensors is not None or return_text is not None:
            postprocess_params["return_tensors"] = return_tensors if return_tensors is not None else not return_text
        if clean_up_tokenization_spaces is not None:
            postprocess_params["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        if fast is not None:
            generate_kwargs["fast"] = fast
        if quantization is not None:
            if quantization not in QUANTIZATIONS:
                raise ValueError(f"Unknown quantization {quantization!r}; choose one of {QUANTIZATIONS}.")
            generate_kwargs["quantization"] = quantization
        if src_lang is not None:
            language_tag(src_lang)  # a clear error for a malformed code
        if tgt_lang is not None:
            check_language_tag(self.tokenizer, tgt_lang)
            preprocess_params["tgt_lang"] = tgt_lang
        # True would be a limit of 1 token, and 2.5 or NaN fail in the tokenizer with an error that names nothing
        if check_positive_int(max_source_length, "max_source_length", allow_none=True) is not None:
            preprocess_params["max_source_length"] = max_source_length
        if decoder_groups is not None:
            generate_kwargs["decoder_groups"] = list(decoder_groups)
        check_generation_arguments(generate_kwargs)  # here, before any input is read
        if generate_kwargs.get("max_new_tokens") is not None and "max_length" not in generate_kwargs:
            # the call's limit replaces the `max_length` saved in the model's generation config (run_translation.py
            # saves one) instead of competing with it: generate() warns about every call that has both
            generate_kwargs["max_length"] = None
        return preprocess_params, generate_kwargs, postprocess_params

    def __call__(self, inputs: str | list[str], **kwargs):
        if not isinstance(inputs, (str, list)) or (isinstance(inputs, list) and not all(isinstance(x, str) for x in inputs)):
            raise TypeError(f"The translation pipeline takes a string or a list of strings, got {type(inputs).__name__}.")
        if isinstance(inputs, list) and not inputs:
            raise ValueError("The translation pipeline got an empty list (no sentences): give at least one sentence.")
        results = super().__call__(inputs, **kwargs)
        if isinstance(inputs, list) and all(len(records) == 1 for records in results):
            return [records[0] for records in results]
        return results

    # a string runs through `run_single`, a list through `get_iterator`: each warns of the call's cut sources first,
    # once for the call, since `preprocess` sees one sentence at a time
    def run_single(self, inputs, preprocess_params, forward_params, postprocess_params):
        self._warn_of_cut_sources([inputs], **preprocess_params)
        return super().run_single(inputs, preprocess_params, forward_params, postprocess_params)

    def get_iterator(self, inputs, num_workers, batch_size, preprocess_params, forward_params, postprocess_params):
        self._warn_of_cut_sources(inputs, **preprocess_params)
        return super().get_iterator(
            inputs, num_workers, batch_size, preprocess_params, forward_params, postprocess_params
        )

    def _warn_of_cut_sources(
        self, texts: list[str], tgt_lang: str | None = None, max_source_length: int | None = None,
        truncation: bool = True,
    ) -> None:
        """`translate()`'s warning of the sources that truncation cuts to their beginning (how many, the limit)."""
        if truncation:
            if tgt_lang is not None:
                texts = [tag_source(text, tgt_lang) for text in texts]
            limit = max_source_length or self.model.config.max_position_embeddings
            source_lengths(self.tokenizer, texts, limit, caller="The translation pipeline")

    def preprocess(
        self, text: str, tgt_lang: str | None = None, max_source_length: int | None = None, truncation: bool = True
    ):
        if tgt_lang is not None:
            check_sources_untagged([text], tgt_lang, "tgt_lang=")
            text = tag_source(text, tgt_lang)
        else:
            check_sources_tagged(self.tokenizer, [text], "tgt_lang=")
        return self.tokenizer(
            text,
            truncation=truncation,
            max_length=(max_source_length or self.model.config.max_position_embeddings) if truncation else None,
            return_tensors="pt",
        )

    def _forward(self, model_inputs, fast: bool = True, quantization: str | None = None, **generate_kwargs):
        generate_kwargs = prepare_pipeline_generate_kwargs(self, generate_kwargs)
        model_inputs = padding_last(model_inputs)
        engine = self.model if quantization is None else prepare_for_inference(self.model, quantization)
        if fast:
            output_ids = fast_generate(engine, **model_inputs, **generate_kwargs)
        else:
            output_ids = engine.generate(**model_inputs, **generate_kwargs)
        # one row per returned sequence: keep the input as the leading axis so that batches split per input
        return {"output_ids": output_ids.reshape(model_inputs["input_ids"].shape[0], -1, output_ids.shape[-1])}

    def postprocess(
        self, model_outputs, return_tensors: bool = False, clean_up_tokenization_spaces: bool | None = None
    ):
        output_ids = model_outputs["output_ids"][0]
        if return_tensors:
            return [{"translation_token_ids": ids} for ids in output_ids]
        decode_options = {}
        if clean_up_tokenization_spaces is not None:
            decode_options["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return [
            {"translation_text": text.strip()}
            for text in self.tokenizer.batch_decode(output_ids, skip_special_tokens=True, **decode_options)
        ]
