"""Everything the package needs from transformers that differs between the supported releases, or that is private.

The supported range is `hf_layerfusion.version.TRANSFORMERS_REQUIREMENT`; `tools/check_transformers_range.py`
runs the contract, fast-generation, training, pipeline, checkpoint and Hub-code tests on its oldest and newest release
(docs/testing.md, *transformers versions*). Each difference is detected from transformers itself, not from its version
number, so a development build between two releases takes the branch its code needs.

1. The cache's name. transformers 5.24 renamed the decoder cache from `past_key_values` to `cache`: the keyword that
   `generate()` passes to `forward()`, the field of the output dataclasses it reads back, and the argument of the mask
   builders (the old name stays a deprecated alias there until 5.40). Inside the package the cache is always called
   `cache`; at the boundary, `forward()` takes either name (`accepts_either_cache_name`; on the releases that renamed
   it the old name warns, as transformers' own models warn) and the outputs carry the installed release's field
   (`cache_field`, `output_cache`).
2. Private names that stay, checked when this module is imported, so that a release which renamed or removed one
   fails at `import hf_layerfusion` with an ImportError naming it, the installed release and the supported range,
   never with an AttributeError in the middle of a translation:
   - `generate()`'s beam-search bookkeeping (seven methods of `GenerationMixin`): the fast beam search runs them
     where its compiled kernels do not (off CPU), and the kernels are tested against them (scoring, length penalty and
     early stopping bit for bit, tests/test_beam_search_kernels.py); transformers has no public API for one step of
     beam search;
   - `GenerationMixin._sample` / `_beam_search`: transformers' own loops, which the fast loop hands a generation it
     does not cover from inside `generate(custom_generate=...)` (the hook passes no public way back);
   - `generation_config._pad_token_tensor` / `_eos_token_tensor`: the special tokens as `generate()` resolved them
     (defaults, lists of end tokens) before calling the custom loop; the public ids are unresolved;
   - `Pipeline._prepare_generate_kwargs`: the pipeline base class's merge of call and default generation arguments,
     which a pipeline subclass is meant to call;
   - `GenerationConfig._get_default_generation_params`: the generation parameters transformers still reads from a
     model config (older config.json files hold them), which a config's check of its keywords must let through.
   The hooks transformers documents for model authors (`_init_weights`, `_tied_weights_keys`, `_no_split_modules`,
   `_supports_*`, `_can_record_outputs`, `config._attn_implementation`, `Trainer._get_train_sampler`) and the helpers
   every in-tree model imports (`merge_with_config_defaults`, `capture_outputs`, `OutputRecorder`,
   `is_torchdynamo_compiling`) are the modelling contract itself; transformers' common model tests
   (tests/test_hf_common_tests.py) exercise them on every release the range script runs.
"""

from __future__ import annotations

import functools
import inspect
import warnings

import transformers
from transformers import GenerationConfig
from transformers.generation import GenerationMixin
from transformers.modeling_outputs import Seq2SeqLMOutput
from transformers.pipelines import Pipeline

from .version import TRANSFORMERS_REQUIREMENT

# "cache" from transformers 5.24 on, "past_key_values" before it
CACHE_NAME = "cache" if "cache" in Seq2SeqLMOutput.__dataclass_fields__ else "past_key_values"
LEGACY_CACHE_NAME = "past_key_values"
# where transformers says the old name goes (`deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")` on its
# models' forward() and its mask builders)
LEGACY_CACHE_NAME_REMOVAL = "5.40.0"


def cache_field(cache) -> dict:
    """The keyword a transformers output dataclass takes the cache by: `Seq2SeqLMOutput(**cache_field(cache), ...)`."""
    return {CACHE_NAME: cache}


def output_cache(outputs):
    """The cache of a model output (`outputs.cache` from transformers 5.24 on, else `outputs.past_key_values`)."""
    return getattr(outputs, CACHE_NAME)


def accepts_either_cache_name(forward):
    """Decorates a `forward(self, ..., cache=None, ...)` so that it also takes the cache as `past_key_values=`, the name
    `generate()` and callers used before transformers 5.24. On the releases that renamed it the old name is a
    deprecated alias: it warns with the FutureWarning transformers' own models give (`deprecate_kwarg`'s message, which
    transformers' common tests check from 5.25 on)."""

    @functools.wraps(forward)
    def forward_with_either_name(*args, **kwargs):
        if LEGACY_CACHE_NAME in kwargs:
            legacy = kwargs.pop(LEGACY_CACHE_NAME)
            if kwargs.get("cache") is not None and legacy is not None:
                raise ValueError("Pass the decoder cache once: as `cache` or as `past_key_values`, not both.")
            if CACHE_NAME != LEGACY_CACHE_NAME:
                warnings.warn(
                    f"`{LEGACY_CACHE_NAME}` is deprecated and will be removed in version {LEGACY_CACHE_NAME_REMOVAL} "
                    f"for `{type(args[0]).__name__}.{forward.__name__}`. Use `cache` instead.",
                    FutureWarning,
                    stacklevel=2,
                )
            if legacy is not None:
                kwargs["cache"] = legacy
        return forward(*args, **kwargs)

    return forward_with_either_name


def _unsupported(what: str, found: str) -> ImportError:
    return ImportError(
        f"hf_layerfusion needs {what}, which transformers {transformers.__version__} {found}. hf_layerfusion supports "
        f"{TRANSFORMERS_REQUIREMENT}: pip install '{TRANSFORMERS_REQUIREMENT}'"
    )


def _private_method(owner: type, name: str, parameters: tuple[str, ...]):
    """`owner.name` (a function, as stored on the class), after checking that its parameters are still `parameters`."""
    method = inspect.getattr_static(owner, name, None)
    if isinstance(method, staticmethod):
        method = method.__func__
    if not callable(method):
        raise _unsupported(f"`{owner.__name__}.{name}`", "does not define")
    found = tuple(inspect.signature(method).parameters)
    if found[: len(parameters)] != parameters:
        raise _unsupported(f"`{owner.__name__}.{name}{parameters}`", f"defines with the parameters {found}")
    return method


# generate()'s beam-search bookkeeping, called by the fast beam search (`inference/search.py`)
flatten_beam_dim = _private_method(GenerationMixin, "_flatten_beam_dim", ("tensor",))
unflatten_beam_dim = _private_method(GenerationMixin, "_unflatten_beam_dim", ("tensor", "batch_size", "num_beams"))
get_top_k_continuations = _private_method(
    GenerationMixin,
    "_get_top_k_continuations",
    ("self", "accumulated_log_probs", "running_sequences", "running_beam_indices", "cur_len", "decoder_prompt_len",
     "do_sample", "beams_to_keep", "num_beams", "batch_size"),
)
get_running_beams_for_next_iteration = _private_method(
    GenerationMixin,
    "_get_running_beams_for_next_iteration",
    ("self", "topk_log_probs", "topk_running_sequences", "topk_running_beam_indices",
     "next_token_hits_stopping_criteria", "num_beams"),
)
update_finished_beams = _private_method(
    GenerationMixin,
    "_update_finished_beams",
    ("self", "sequences", "topk_running_sequences", "beam_scores", "topk_log_probs", "beam_indices",
     "topk_running_beam_indices", "is_early_stop_heuristic_unsatisfied", "is_sent_finished",
     "next_token_hits_stopping_criteria", "top_num_beam_mask", "num_beams"),
)
check_early_stop_heuristic = _private_method(
    GenerationMixin,
    "_check_early_stop_heuristic",
    ("is_early_stop_heuristic_unsatisfied", "running_beam_scores", "beam_scores", "is_sent_finished", "cur_len",
     "max_length", "decoder_prompt_len", "early_stopping", "length_penalty"),
)
beam_search_has_unfinished_sequences = _private_method(
    GenerationMixin,
    "_beam_search_has_unfinished_sequences",
    ("is_early_stop_heuristic_unsatisfied", "is_sent_finished", "next_token_hits_stopping_criteria", "early_stopping"),
)
# transformers' own decoding loops, for a generation the fast loop hands back from inside `custom_generate`
sample_loop = _private_method(
    GenerationMixin, "_sample", ("self", "input_ids", "logits_processor", "stopping_criteria", "generation_config")
)
beam_search_loop = _private_method(
    GenerationMixin, "_beam_search", ("self", "input_ids", "logits_processor", "stopping_criteria", "generation_config")
)
prepare_pipeline_generate_kwargs = _private_method(Pipeline, "_prepare_generate_kwargs", ("self", "generate_kwargs"))
# the generation parameters (and their defaults) that transformers accepts on a model config
default_generation_parameters = _private_method(GenerationConfig, "_get_default_generation_params", ())


def special_token_tensors(generation_config) -> tuple:
    """`(pad, eos)` as `generate()` resolved them for this call (a tensor each, or None), before the decoding loop."""
    return generation_config._pad_token_tensor, generation_config._eos_token_tensor
