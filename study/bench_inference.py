"""CPU translation speed of every family: `generate()` vs the fast decoding loop (float32 and int8), beside
`MarianMTModel` and CTranslate2 (issue 19).

The setting of `bench_backbone.py` (and of the issue's table): the Multi30k preset (d_model 256, 6 + 6 layers unless a
family changes the wiring, FFN 1024, 4 heads), a joint 8k BPE vocabulary trained on the train split, random weights
(`MarianMTModel` and the plain backbone share theirs through `from_marian`; the other families are random-init from the
same seed), one batch of 32 `test_2016_flickr.en` sentences, exactly 32 new tokens (`min_new_tokens` =
`max_new_tokens`, so every engine does the same number of decoder steps whatever its weights predict), greedy and
beam-4, at each `--threads` count. Engines:

- `MarianMTModel.generate()`: the reference of every "vs Marian" ratio;
- CTranslate2 float32 and int8 (`ctranslate2`, the `benchmark` extra of setup.cfg), exported from the plain backbone
  that shares Marian's weights (`hf_layerfusion.export_ctranslate2`); skipped with a message when the package is
  missing;
- per family: `generate()`, `fast_generate()` (`hf_layerfusion.inference`, float32) and
  `fast_generate(..., quantization="int8")`.

Timed calls alternate between engines (the order flips every repeat); the table gives medians, each ratio is the
median of the per-repeat ratios with its [min-max] range, so it holds up under other load on shared cores.
`OMP_WAIT_POLICY=PASSIVE` is set unless the environment sets it (spin-waiting threads on shared cores are very slow);
on idle cores give `OMP_WAIT_POLICY=ACTIVE` for two or more threads: with passive waits every parallel region wakes
a sleeping thread, and every engine ran slower at two threads than at one (study/fast_cpu_translation_log.md).
Checked, not timed: the fast loop's float32 tokens equal `generate()`'s for every family and search, the plain
backbone's equal Marian's, CTranslate2 float32's equal Marian's (reported); int8 tokens are compared with float32.

Targets (issue 19; printed as met / NOT met): the plain backbone's fast float32 loop >= 2.0x Marian (greedy and beam);
every fusion family's fast loop >= 1.8x its own `generate()`; the plain backbone's int8 loop >= 2.8x Marian; with
`--bleu MODEL_DIR`, the int8 BLEU cost on Multi30k test (`hf_layerfusion.translate`) <= 0.2.

`--bleu MODEL_DIR` (a trained model, e.g. a study run directory) also measures the real workload: all Multi30k test
sentences translated in batches of 32 sorted by length, each stopping at its end token, by `generate()`, the fast
loop (float32, int8) and, for a plain Transformer in Marian's setting, its `MarianMTModel` (`to_marian`) and
CTranslate2 float32 / int8 (`export_ctranslate2`; a pre-norm one has neither, said in a line): seconds, ratios and BLEU of each, at each `--threads` count. Targets there (issue 39): the
plain fast float32 loop at or above CTranslate2 float32, the int8 loop at or above CTranslate2 int8, and the int8
BLEU cost <= 0.2, printed with its 95% interval (paired bootstrap over the sentences, `int8_cost_interval`),
and, where two or more models were given, each int8 loop's cost pooled over them (`pooled_int8_costs`).
`--int8-formats 7 8` adds the int8 loop in each of those formats (`int8_copy(model, code_bits)`, run by whichever
product this CPU has for it: `Int8Linear`), the BLEU cost of every format measured on one CPU;
`--plain-reference PLAIN_DIR` (a trained plain Transformer with the same tokenizer) times that model's fast loops
beside every fusion model of `--bleu` on the same chunks and counts both models' FLOPs (`generate()` on every
`--flops-every`-th sentence, one at a time, `FlopCounterMode`): the issue-39 target there is each family's fast loop
at or above 0.8x the plain fast loop times the FLOPs ratio (plain / family), float32 and int8.
`--bleu-corpus quickstart` translates the quickstart's test split (examples/quickstart.py: its built-in number
corpus, German -> English) instead of Multi30k's, for the quickstart's models. `--results-dir DIR` (with `--bleu`)
also keeps the workload's numbers (no translations) in `DIR/workload_<cpu>_<commit>.json`, refused if that file
exists unless `--overwrite-results`: the README's real-workload tables are rendered from those files
(`study/inference_workload_report.py`), so they quote only what a run printed. `--max-cpu-isa avx2` (or `avx512`:
with VNNI, without AMX) runs every engine with at most those instructions, as on a CPU that has only them: the
package's kernels (`HF_LAYERFUSION_MAX_CPU_ISA`), CTranslate2 (`CT2_FORCE_CPU_ISA`), torch (`ATEN_CPU_CAPABILITY`),
oneDNN and MKL (`INSTRUCTION_SET_CAPS`; the run re-executes itself with them set); its results file is
`workload_<cpu>-max-<isa>_<commit>.json`. That is the code such a CPU runs, on this CPU's cores and caches.

    python -m study.bench_inference                     # full run: every family, 1 and 2 threads
    python -m study.bench_inference --quick             # smoke run (one repeat, 8 new tokens, 1 thread)
    python -m study.bench_inference --models plain gtrans_td2 --threads 1 --repeats 7
    # BLEU of generate(), the fast loop and int8 for a trained model (e.g. a bench_multi30k.py run directory)
    python -m study.bench_inference --speed none --threads 1 --bleu-beams 1 4 \
        --bleu runs/study/runs/steps_2000_warmup_1000/plain_transformer/seed_1
    # the BLEU cost of both int8 formats with the quickstart's models
    python -m study.bench_inference --speed none --threads 1 --bleu-beams 1 4 --int8-formats 7 8 \
        --bleu-corpus quickstart --bleu runs/quickstart/gtrans runs/quickstart/plain_transformer
    # fusion families against the plain fast loop, FLOPs-normalised (the study's fine-tuned models share its tokenizer)
    python -m study.bench_inference --speed none --threads 1 --bleu-beams 1 4 \
        --plain-reference runs/study/runs/steps_2000_warmup_1000/plain_transformer/seed_1 \
        --bleu runs/study/runs/steps_2000_warmup_1000/gtrans_finetuned/seed_1
    # the real workload kept for study/README.md (then: python -m study.report)
    python -m study.bench_inference --speed none --threads 1 2 --bleu-beams 1 4 \
        --results-dir study/results/inference \
        --bleu runs/study/runs/steps_2000_warmup_1000/plain_transformer/seed_1
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402
from torch.utils.flop_counter import FlopCounterMode  # noqa: E402

import hf_layerfusion  # noqa: E402
from hf_layerfusion import LayerFusionForConditionalGeneration  # noqa: E402
from hf_layerfusion.inference import (  # noqa: E402
    export_ctranslate2,
    fast_generate,
    prepare_for_inference,
)
from hf_layerfusion.inference.cpu_kernels import (  # noqa: E402
    compiled_kernels,
    instruction_set_summary,
    machine_type,
)
from hf_layerfusion.inference.inference_copies import int8_copy  # noqa: E402
from study import bench_backbone as backbone  # noqa: E402  (the shared setting: tokenizer, Marian, family settings)
from study.common import (  # noqa: E402
    REPO_ROOT,
    bleu_statistics,
    display_path,
    module_command,
    read_lines,
    reproduction_command,
    study_environment,
)
from study.multi30k_ledger import cpu_family_model  # noqa: E402

# one setting per family (names of bench_backbone.MODELS); `--models` picks others
DEFAULT_MODELS = ["plain", "gtrans_td2", "dr_hierarchical", "rtal_ewp", "lc_14", "re_transformer_2"]
SEARCHES = {"greedy": 1, "beam": 4}
ENGINES = ("generate", "fast", "fast_int8")
# beam search only: `generate()` as it was when issue 19 was filed, reordering every cache slot between steps (since
# commit 717e790 the model's `_reorder_cache` leaves the cross-attention slots, equal across a sentence's beams, alone);
# the issue's "its own generate() today". Greedy search reorders nothing: there it is `generate`.
ISSUE_BASELINE = "generate_issue19"
# `--max-cpu-isa`: what each library reads when it loads to use at most that instruction set (the package's kernels,
# CTranslate2, torch's own kernels, oneDNN, MKL); the run re-executes itself with all of them set, so that every
# engine runs the code a CPU with only those instructions runs (on this CPU's cores and caches, which differ)
INSTRUCTION_SET_CAPS = {
    "avx2": {"HF_LAYERFUSION_MAX_CPU_ISA": "avx2", "CT2_FORCE_CPU_ISA": "AVX2", "ATEN_CPU_CAPABILITY": "avx2",
             "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    # AVX-512 with VNNI, without AMX (an Intel Xeon of the Ice Lake or Cascade Lake generation, an AMD Zen 4)
    "avx512": {"HF_LAYERFUSION_MAX_CPU_ISA": "avx512", "CT2_FORCE_CPU_ISA": "AVX512",
               "ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE_VNNI",
               "MKL_ENABLE_INSTRUCTIONS": "AVX512_E1"},
}
CAP_VARIABLES = tuple(INSTRUCTION_SET_CAPS["avx2"])
TARGETS = {
    "plain_fast_vs_marian": 2.0,
    "fusion_fast_vs_generate": 1.8,
    "plain_int8_vs_marian": 2.8,
    "int8_bleu_cost": 0.2,
    "workload_vs_ctranslate2": 1.0,  # issue 39: the fast loop at or above CTranslate2 of the same precision
    # issue 39: a fusion family's fast loop at or above this share of the plain fast loop's speed times the counted
    # FLOPs ratio (plain / family) on the real workload
    "fusion_workload_vs_plain": 0.8,
}
PLAIN_ENGINES = {"fast float32": "plain fast float32", "fast int8": "plain fast int8"}  # `--plain-reference`'s
# the int8 BLEU cost's 95% interval: paired bootstrap resamples of the test sentences (fixed seed: a rerun of the same
# translations prints the same interval)
INT8_COST_BOOTSTRAP_SAMPLES = 1000
INT8_COST_BOOTSTRAP_SEED = 0


# ------------------------------------------------------------------------------------------------ CTranslate2
def ctranslate2_engines(plain, tokenizer, work: Path, threads: list[int]) -> dict:
    """`{(quantization, threads): ctranslate2.Translator}` of the plain Transformer `plain` (`export_ctranslate2`,
    float32 and int8, once each), or {} (with a message) without the package."""
    try:
        import ctranslate2
    except ImportError:
        print("- CTranslate2 skipped: `pip install ctranslate2` (or `pip install -e .[benchmark]`) to compare with it")
        return {}
    translators = {}
    for quantization in ("float32", "int8"):
        model_dir = export_ctranslate2(plain, tokenizer, work / quantization, None if quantization == "float32" else quantization)
        for count in threads:
            translators[quantization, count] = ctranslate2.Translator(
                str(model_dir), device="cpu", intra_threads=count, inter_threads=1
            )
    return translators


def ctranslate2_tokens(translator, source_tokens, num_beams: int, new_tokens: int) -> list[list[str]]:
    """Exactly `new_tokens` tokens per sentence (minimum = maximum length), like `generation_kwargs`."""
    length = dict(max_decoding_length=new_tokens, min_decoding_length=new_tokens)
    results = translator.translate_batch(source_tokens, beam_size=num_beams, return_end_token=True, **length)
    return [result.hypotheses[0] for result in results]


# ------------------------------------------------------------------------------------------------ engines
def generation_kwargs(num_beams: int, new_tokens: int) -> dict:
    return dict(num_beams=num_beams, do_sample=False, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                early_stopping=False)


@contextlib.contextmanager
def full_cache_reorder():
    """`generate()` without the backbone's `_reorder_cache` hook: transformers reorders every cache slot."""
    hook = LayerFusionForConditionalGeneration.__dict__["_reorder_cache"]
    del LayerFusionForConditionalGeneration._reorder_cache
    try:
        yield
    finally:
        LayerFusionForConditionalGeneration._reorder_cache = hook


def run_engine(model, engine: str, batch, num_beams: int, new_tokens: int) -> torch.Tensor:
    kwargs = generation_kwargs(num_beams, new_tokens)
    if engine == "generate":
        with torch.inference_mode():
            return model.generate(**batch, **kwargs)
    if engine == ISSUE_BASELINE:
        with torch.inference_mode(), full_cache_reorder():
            return model.generate(**batch, **kwargs)
    quantization = "int8" if engine == "fast_int8" else None
    return fast_generate(model, **batch, quantization=quantization, fallback=False, **kwargs)


def build_runs(args, models, translators, batch, source_tokens, num_beams: int, threads: int) -> dict:
    """`{row key: callable}` of every timed engine for one search and thread count."""
    runs = {("marian", "generate"): lambda: run_engine(models["marian"], "generate", batch, num_beams, args.max_new_tokens)}
    for quantization in ("float32", "int8"):
        translator = translators.get((quantization, threads))
        if translator is not None:
            runs["ctranslate2", quantization] = (
                lambda t=translator: ctranslate2_tokens(t, source_tokens, num_beams, args.max_new_tokens)
            )
    for name in args.models:
        for engine in (ISSUE_BASELINE, *ENGINES) if num_beams > 1 and name != "plain" else ENGINES:
            runs[name, engine] = lambda m=models[name], e=engine: run_engine(m, e, batch, num_beams, args.max_new_tokens)
    return runs


def interleaved_seconds(runs: dict, repeats: int) -> tuple[dict, dict]:
    """Wall-clock and process CPU seconds of every run, engines alternated (order flipped every repeat)."""
    keys = list(runs)
    for key in keys:  # warm-up: first calls, thread pools
        runs[key]()
    wall, cpu = {key: [] for key in keys}, {key: [] for key in keys}
    for repeat in range(repeats):
        for key in keys if repeat % 2 == 0 else reversed(keys):
            start, start_cpu = time.perf_counter(), time.process_time()
            runs[key]()
            wall[key].append(time.perf_counter() - start)
            cpu[key].append(time.process_time() - start_cpu)
    return wall, cpu


# ------------------------------------------------------------------------------------------------ checks
def check_tokens(args, models, translators, tokenizer, batch, source_tokens) -> list[str]:
    """The equalities the fast path promises (float32) and how close int8 stays, as report lines."""
    lines = []
    for search, num_beams in SEARCHES.items():
        marian = run_engine(models["marian"], "generate", batch, num_beams, args.max_new_tokens)
        for name in args.models:
            reference = run_engine(models[name], "generate", batch, num_beams, args.max_new_tokens)
            fast = run_engine(models[name], "fast", batch, num_beams, args.max_new_tokens)
            int8 = run_engine(models[name], "fast_int8", batch, num_beams, args.max_new_tokens)
            equal = reference.shape == fast.shape and torch.equal(reference, fast)
            same_rows = (int8 == fast).all(dim=1).sum().item() if int8.shape == fast.shape else 0
            lines.append(
                f"- {search}, {backbone.MODELS[name].title}: fast float32 tokens == generate(): "
                f"{'yes' if equal else 'NO'}; int8 rows equal to float32: {same_rows}/{len(fast)}"
            )
            if not equal:
                raise AssertionError(f"{name} {search}: the fast loop's tokens differ from generate()")
            if name == "plain":
                lines.append(f"- {search}: plain backbone == MarianMTModel tokens: {'yes' if torch.equal(reference, marian) else 'NO'}")
        translator = translators.get(("float32", args.threads[0]))
        if translator is not None:
            hypotheses = ctranslate2_tokens(translator, source_tokens, num_beams, args.max_new_tokens)
            expected = [tokenizer.convert_ids_to_tokens(row[1:].tolist()) for row in marian]
            same = sum(h == e for h, e in zip(hypotheses, expected))
            lines.append(f"- {search}: CTranslate2 float32 == MarianMTModel tokens: {same}/{len(expected)} sentences")
    return lines


# ------------------------------------------------------------------------------------------------ BLEU
WORKLOAD_CHUNK = 128  # sentences per turn of the alternation in the translation workload


def ctranslate2_translate(translator, tokenizer, sentences, num_beams: int, max_decoding_length: int) -> list[str]:
    """CTranslate2 translations of `sentences` in batches of 32 (CTranslate2 sorts them by length itself)."""
    tokens = [tokenizer.convert_ids_to_tokens(ids) for ids in tokenizer(list(sentences), truncation=True)["input_ids"]]
    results = translator.translate_batch(
        tokens, max_batch_size=32, beam_size=num_beams, max_decoding_length=max_decoding_length
    )
    return [tokenizer.decode(tokenizer.convert_tokens_to_ids(r.hypotheses[0]), skip_special_tokens=True) for r in results]


def int8_format_engine(code_bits: int) -> str:
    """The workload engine of `--int8-formats`' `code_bits`, named with the product that runs it on this CPU."""
    kernels = compiled_kernels()
    product = "torch operations" if kernels is None else kernels.int8_product(code_bits)
    return f"fast int8 {code_bits}-bit ({product})"


def other_int8_formats(model, int8_formats) -> dict:
    """`{code_bits: int8_copy(model, code_bits)}` for each format of `int8_formats` but this CPU's default (which
    "fast int8" runs already), made once per model."""
    kernels = compiled_kernels()
    default_bits = 8 if kernels is None else kernels.int8_code_bits()
    return {code_bits: int8_copy(model, code_bits) for code_bits in int8_formats if code_bits != default_bits}


def workload_engines(
    model, tokenizer, num_beams: int, marian=None, translators: dict | None = None, int8_copies: dict | None = None,
    plain_reference: tuple | None = None,
) -> dict:
    """`{engine: translate(sentences) -> list[str]}` for a trained model: `generate()`, the fast loop in float32
    and int8 (`hf_layerfusion.translate`, batches of 32 sorted by length), and each int8 copy of `int8_copies`
    (`other_int8_formats`); for a plain Transformer also its `MarianMTModel` (`marian`, from
    `to_marian`) and the CTranslate2 `translators` of `ctranslate2_engines` (`{quantization: translator}`); for a
    fusion family with `plain_reference` (`(model, tokenizer)` of `--plain-reference`) also that plain model's fast
    loops, float32 and int8 (`PLAIN_ENGINES`), timed on the same chunks."""
    engines = {
        "generate()": lambda s: hf_layerfusion.translate(model, tokenizer, s, num_beams=num_beams, fast=False),
        "fast float32": lambda s: hf_layerfusion.translate(model, tokenizer, s, num_beams=num_beams),
        "fast int8": lambda s: hf_layerfusion.translate(model, tokenizer, s, num_beams=num_beams, quantization="int8"),
    }
    for code_bits, copy in (int8_copies or {}).items():
        engines[int8_format_engine(code_bits)] = lambda s, c=copy: hf_layerfusion.translate(
            c, tokenizer, s, num_beams=num_beams, quantization="int8"
        )
    if plain_reference is not None:
        plain, plain_tokenizer = plain_reference
        for engine, quantization in ((PLAIN_ENGINES["fast float32"], None), (PLAIN_ENGINES["fast int8"], "int8")):
            engines[engine] = lambda s, q=quantization: hf_layerfusion.translate(
                plain, plain_tokenizer, s, num_beams=num_beams, quantization=q
            )
    if marian is not None:
        engines = {"MarianMTModel generate()": lambda s: hf_layerfusion.translate(
            marian, tokenizer, s, num_beams=num_beams, fast=False), **engines}
    max_decoding_length = model.generation_config.max_length - 1  # generate() counts the start token
    for quantization, translator in (translators or {}).items():
        engines[f"CTranslate2 {quantization}"] = (
            lambda s, t=translator: ctranslate2_translate(t, tokenizer, s, num_beams, max_decoding_length)
        )
    return engines


def marian_of(model, model_dir) -> object | None:
    """`to_marian(model)` of a plain Transformer, the reference engine of its rows (and the source of its
    CTranslate2 models); None, said in a line, for one that Marian cannot express (pre-norm, ...: `to_marian`'s
    error names the setting), which is then timed against its own `generate()` as a fusion model is."""
    try:
        return hf_layerfusion.to_marian(model)
    except ValueError as error:
        print(f"- {model_dir}: no MarianMTModel or CTranslate2 engine ({error})")
        return None


QUICKSTART = REPO_ROOT / "examples" / "quickstart.py"


def quickstart_setting() -> dict:
    """The quickstart's corpus setting (`SOURCE_LANG`, `TARGET_LANG`, `CORPUS`), read from the constants in its
    source: examples/quickstart.py is a script to run, not a module of a package to import."""
    tree = ast.parse(QUICKSTART.read_text(encoding="utf-8"), str(QUICKSTART))
    setting = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            names = [element.id for element in target.elts] if isinstance(target, ast.Tuple) else [target.id]
            if {"SOURCE_LANG", "CORPUS"} & set(names):
                value = ast.literal_eval(node.value) if not isinstance(node.value, ast.Call) else {
                    keyword.arg: ast.literal_eval(keyword.value) for keyword in node.value.keywords}  # dict(...)
                setting.update(zip(names, value) if len(names) > 1 else [(names[0], value)])
    return setting


def workload_corpus(args) -> tuple[str, list[str], list[str]]:
    """(name, sources, references) of the test set `--bleu-corpus` names, its first `--bleu-sentences`: Multi30k
    test (en -> de), or the quickstart's test split (examples/quickstart.py's built-in number corpus, de -> en,
    generated as its training run generates it)."""
    if args.bleu_corpus == "quickstart":
        from hf_layerfusion.training.data import builtin_number_corpus

        setting = quickstart_setting()
        source_lang, target_lang, corpus = setting["SOURCE_LANG"], setting["TARGET_LANG"], setting["CORPUS"]
        test = builtin_number_corpus(
            source_lang, target_lang, corpus["builtin_num_train"], corpus["builtin_num_valid"],
            corpus["builtin_num_test"],
        )["test"]
        pairs = [example["translation"] for example in test]
        sources = [pair[source_lang] for pair in pairs]
        references = [pair[target_lang] for pair in pairs]
        name = "the quickstart's test split"
    else:
        sources = read_lines(args.data / "test_2016_flickr.en")
        references = read_lines(args.data / "test_2016_flickr.de")
        name = "Multi30k test"
    return name, sources[: args.bleu_sentences], references[: args.bleu_sentences]


def alternate_on_chunks(engines: dict, sources: list[str]) -> tuple[dict, dict]:
    """`({engine: seconds per chunk}, {engine: translations})` of `engines` (`{name: translate(sentences)}`)
    translating `sources` in chunks of `WORKLOAD_CHUNK` sentences, taking turns on each chunk (the order flipped
    every chunk), so that a change of machine speed hits every engine alike. Each engine first translates two
    sentences untimed (an inference copy made, first calls, thread pools)."""
    for translate in engines.values():
        translate(sources[:2])
    chunks = [sources[start : start + WORKLOAD_CHUNK] for start in range(0, len(sources), WORKLOAD_CHUNK)]
    seconds = {engine: [] for engine in engines}
    translations = {engine: [] for engine in engines}
    for index, chunk in enumerate(chunks):
        for engine in engines if index % 2 == 0 else reversed(list(engines)):
            start = time.perf_counter()
            translations[engine].extend(engines[engine](chunk))
            seconds[engine].append(time.perf_counter() - start)
    return seconds, translations


def counted_flops(model, tokenizer, sources: list[str], num_beams: int) -> int:
    """Floating-point operations of `generate()` translating each of `sources` alone (batch 1: each sentence decodes
    to its own end, no padding and no finished rows computed), counted by torch's `FlopCounterMode` (matrix products;
    element-wise operations are not counted): the work the model's own computation takes for these sentences, which
    the fusion target compares with the plain model's."""
    with FlopCounterMode(display=False) as counter:
        for sentence in sources:
            hf_layerfusion.translate(model, tokenizer, [sentence], num_beams=num_beams, fast=False)
    return counter.get_total_flops()


def load_plain_reference(args, tokenizers: dict) -> tuple | None:
    """`(model, tokenizer)` of `--plain-reference`, checked to share the tokenizer of every fusion model of `--bleu`
    (`tokenizers`: `{model_dir: tokenizer}`): the two translate the same token sequences. None without the option."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    if args.plain_reference is None:
        return None
    tokenizer = AutoTokenizer.from_pretrained(args.plain_reference)
    for model_dir, other in tokenizers.items():
        if other.get_vocab() != tokenizer.get_vocab():
            raise SystemExit(f"error: --plain-reference {args.plain_reference} and --bleu {model_dir} have different "
                             "vocabularies: the plain reference must be trained with the fusion model's tokenizer")
    return AutoModelForSeq2SeqLM.from_pretrained(args.plain_reference).eval(), tokenizer


def measure_workload(args) -> list[dict]:
    """For each `--bleu` model, each `--threads` count and each search of `--bleu-beams`: the first
    `--bleu-sentences` test sentences (`workload_corpus`) translated by every engine of `workload_engines`, with
    their seconds and BLEU. The sentences stop at their end token as in real use (a finished sentence leaves the
    fast loop's batch; `generate()` keeps computing it until its batch is done). The engines alternate on chunks of
    `WORKLOAD_CHUNK` sentences (order flipped every chunk), so a change of machine speed hits every engine alike;
    ratios are medians of the per-chunk ratios. Each engine first translates two sentences untimed (making the
    int8 copy, first calls).

    With `--plain-reference`, each fusion model's rows also time that plain model's fast loops on the same chunks and
    give `flops`: the counted FLOPs (`counted_flops`) of the fusion model and of the plain one on every
    `--flops-every`-th sentence, per search, for the target "fast loop at or above 0.8x the plain fast loop times
    the FLOPs ratio"."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    from hf_layerfusion.translation.bleu import corpus_bleu

    corpus, sources, references = workload_corpus(args)
    tokenizers = {model_dir: AutoTokenizer.from_pretrained(model_dir) for model_dir in args.bleu}
    plain_reference = load_plain_reference(args, tokenizers)
    flops_sources = sources[:: args.flops_every]
    plain_flops = {}  # num_beams -> the plain reference's counted FLOPs, counted once
    rows = []
    for model_dir in args.bleu:
        model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
        tokenizer = tokenizers[model_dir]
        plain = model.config.model_type == "plain_transformer"
        versus_plain = plain_reference if not plain else None
        marian = marian_of(model, model_dir) if plain else None
        int8_copies = other_int8_formats(model, args.int8_formats)
        flops_by_search = {}
        with tempfile.TemporaryDirectory() as work:
            translators = ctranslate2_engines(model, tokenizer, Path(work), args.threads) if marian else {}
            for threads in args.threads:
                torch.set_num_threads(threads)
                for num_beams in args.bleu_beams:
                    engines = workload_engines(
                        model, tokenizer, num_beams, marian,
                        {quantization: t for (quantization, count), t in translators.items() if count == threads},
                        int8_copies, versus_plain,
                    )
                    seconds, translations = alternate_on_chunks(engines, sources)
                    row = dict(
                        model=display_path(model_dir), model_type=model.config.model_type, num_beams=num_beams,
                        threads=threads, corpus=corpus, sentences=len(sources), seconds=seconds,
                        bleu={engine: corpus_bleu(texts, references)[0] for engine, texts in translations.items()},
                        translations=translations,
                    )
                    if threads == args.threads[0]:  # the BLEU does not depend on the thread count: once
                        row["bleu_statistics"] = {engine: bleu_statistics(texts, references)
                                                  for engine, texts in translations.items()
                                                  if engine == "fast float32" or engine.startswith("fast int8")}
                        row["int8_cost_interval"] = {
                            engine: int8_cost_interval(row["bleu_statistics"]["fast float32"], statistics)
                            for engine, statistics in row["bleu_statistics"].items() if engine.startswith("fast int8")
                        }
                    if versus_plain is not None:
                        if num_beams not in plain_flops:
                            plain_flops[num_beams] = counted_flops(*versus_plain, flops_sources, num_beams)
                        counted = flops_by_search.get(num_beams)
                        if counted is None:  # the thread count changes no FLOPs: counted once per search
                            counted = flops_by_search[num_beams] = counted_flops(
                                model, tokenizer, flops_sources, num_beams
                            )
                        row["plain_reference"] = str(args.plain_reference)
                        row["flops"] = {"model": counted, "plain reference": plain_flops[num_beams],
                                        "sentences": len(flops_sources)}
                    rows.append(row)
    return rows


def bleu_from_statistics(statistics_sum: np.ndarray) -> float:
    from sacrebleu.metrics import BLEU

    counts = [int(value) for value in statistics_sum]
    return BLEU.compute_bleu(counts[0:4], counts[4:8], counts[8], counts[9], smooth_method="exp").score


def bootstrap_weights(sentences: int, samples: int = INT8_COST_BOOTSTRAP_SAMPLES,
                      seed: int = INT8_COST_BOOTSTRAP_SEED) -> np.ndarray:
    """`(samples, sentences)`: how often each sentence is drawn in each bootstrap resample of the test set."""
    picks = np.random.default_rng(seed).integers(0, sentences, size=(samples, sentences))
    weights = np.zeros((samples, sentences), dtype=np.int64)
    np.add.at(weights, (np.arange(samples)[:, None], picks), 1)
    return weights


def resampled_costs(float_statistics: np.ndarray, int8_statistics: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """float32 BLEU minus int8 BLEU on each resample of `weights` (`bootstrap_weights`), from `bleu_statistics`."""
    return np.array([bleu_from_statistics(float_sum) - bleu_from_statistics(int8_sum)
                     for float_sum, int8_sum in zip(weights @ float_statistics, weights @ int8_statistics)])


def percentile_interval(values: np.ndarray) -> list[float]:
    low, high = np.percentile(values, [2.5, 97.5])
    return [round(float(low), 3), round(float(high), 3)]


def int8_cost_interval(float_statistics: np.ndarray, int8_statistics: np.ndarray,
                       samples: int = INT8_COST_BOOTSTRAP_SAMPLES, seed: int = INT8_COST_BOOTSTRAP_SEED) -> list[float]:
    """The 95% interval `[low, high]` of the int8 BLEU cost (float32 BLEU minus int8 BLEU) from both engines'
    `bleu_statistics` of one test set: paired bootstrap over the sentences (Koehn 2004), each resample scored with both
    engines' translations, the 2.5th and 97.5th percentiles of the differences. A greedy cost is decided by the few
    sentences whose translations differ (a sentence that loops to the maximum length in one engine moves the corpus
    BLEU by tenths), so a point estimate near the 0.2 goal is read with this interval beside it."""
    weights = bootstrap_weights(len(float_statistics), samples, seed)
    return percentile_interval(resampled_costs(float_statistics, int8_statistics, weights))


def pooled_int8_costs(rows: list[dict], threads: int, samples: int = INT8_COST_BOOTSTRAP_SAMPLES,
                      seed: int = INT8_COST_BOOTSTRAP_SEED) -> list[dict]:
    """For each search and int8 engine that two or more models of a run were measured with (rows of `threads` with
    `bleu_statistics`, one test set): the mean of the models' int8 costs and its 95% interval, every resample drawing
    the same sentences for every model. One model's cost is decided by a few sentences; the mean over models is the
    steadier answer to "what does this int8 format cost?"."""
    groups: dict = {}
    for row in rows:
        if row["threads"] == threads and "bleu_statistics" in row:
            for engine in row["bleu_statistics"]:
                if engine.startswith("fast int8"):
                    groups.setdefault((row["num_beams"], engine), []).append(row)
    pooled = []
    for (num_beams, engine), group in groups.items():
        if len(group) < 2:
            continue
        sentences = {len(row["bleu_statistics"][engine]) for row in group}
        if len(sentences) != 1:
            raise ValueError(f"pooled_int8_costs: the models of {engine!r} translated different test sets {sentences}")
        weights = bootstrap_weights(sentences.pop(), samples, seed)
        costs = np.mean([resampled_costs(row["bleu_statistics"]["fast float32"], row["bleu_statistics"][engine],
                                         weights) for row in group], axis=0)
        pooled.append(dict(num_beams=num_beams, engine=engine, models=[row["model"] for row in group],
                           mean=round(float(np.mean([row["bleu"]["fast float32"] - row["bleu"][engine]
                                                     for row in group])), 3),
                           interval=percentile_interval(costs)))
    return pooled


def workload_reference(seconds: dict) -> str:
    """The engine a workload row's ratios are relative to: `MarianMTModel generate()` for a plain Transformer, the
    model's own `generate()` otherwise."""
    return "MarianMTModel generate()" if "MarianMTModel generate()" in seconds else "generate()"


def identical_translations(row: dict) -> dict[str, tuple[str, int]]:
    """`{engine: (other engine, sentences translated identically by both)}` for the engines of a workload row that
    have a natural twin: the fast float32 loop against `generate()`, every int8 loop against float32, `generate()`
    and CTranslate2 float32 against the reference, CTranslate2 int8 against its float32. One function for the printed
    table and the `--results-dir` file, so that the two cannot count differently."""
    reference = workload_reference(row["seconds"])
    twins = {"fast float32": "generate()", "fast int8": "fast float32", "generate()": reference,
             "CTranslate2 float32": reference, "CTranslate2 int8": "CTranslate2 float32"}
    translations, counts = row["translations"], {}
    for engine in row["seconds"]:
        other = twins.get(engine, "fast float32" if engine.startswith("fast int8") else None)
        if other is not None and other != engine:
            counts[engine] = (other, sum(a == b for a, b in zip(translations[engine], translations[other])))
    return counts


def print_workload(row: dict) -> None:
    search = "greedy" if row["num_beams"] == 1 else f"beam {row['num_beams']}"
    seconds = row["seconds"]
    reference = workload_reference(seconds)
    print(f"\n### Translating {row['corpus']} with {row['model']} ({row['model_type']}): {row['sentences']} sentences, "
          f"{search}, {row['threads']} thread(s)\n")
    print("Batches of 32 sorted by length, each sentence stopping at its end token (the model's `max_length`), engines "
          f"alternated on chunks of {WORKLOAD_CHUNK} sentences; ratios: median of per-chunk ratios [min-max].\n")
    versus_own = reference != "generate()"  # a second ratio column when the reference is Marian
    print(f"| engine | seconds | vs {reference} |{' vs generate() |' if versus_own else ''} BLEU | "
          "translations identical to |")
    print("|---|---|---|" + ("---|" if versus_own else "") + "---|---|")
    identical = identical_translations(row)
    for engine, samples in seconds.items():
        versus = "1" if engine == reference else ratio_cell(seconds, engine, reference)[1]
        own = "–" if engine in (reference, "generate()") else ratio_cell(seconds, engine, "generate()")[1]
        same = f"{identical[engine][0]}: {identical[engine][1]}/{row['sentences']}" if engine in identical else "–"
        own = f" {own} |" if versus_own else ""
        print(f"| {engine} | {sum(samples):.1f} | {versus} |{own} {row['bleu'][engine]:.2f} | {same} |")
    if "flops" in row:
        print(f"\nAgainst the plain fast loop of {row['plain_reference']} (issue 39: speed ratio / FLOPs ratio >= "
              f"{TARGETS['fusion_workload_vs_plain']}):\n")
        print("| fast loop | vs plain fast loop, same precision | FLOPs ratio (plain / model) | speed / FLOPs ratio |")
        print("|---|---|---|---|")
        for engine, (speed, flops_ratio, normalised) in fusion_versus_plain(row).items():
            print(f"| {engine} | {speed[1]} | {flops_ratio:.3f} | {normalised:.2f} |")
        flops = row["flops"]
        print(f"\n(counted FLOPs of `generate()` on {flops['sentences']} of the sentences, one at a time: model "
              f"{flops['model'] / 1e9:.2f} G, plain reference {flops['plain reference'] / 1e9:.2f} G)")


def fusion_versus_plain(row: dict) -> dict:
    """`{fast engine: ((ratio, cell) against the plain reference's fast loop of the same precision, FLOPs ratio
    plain / model, ratio / FLOPs ratio)}` of a row measured with `--plain-reference`; the last is what the target
    bounds. One function for the printed table, the targets and the README report."""
    flops_ratio = row["flops"]["plain reference"] / row["flops"]["model"]
    result = {}
    for engine, plain_engine in PLAIN_ENGINES.items():
        if engine in row["seconds"] and plain_engine in row["seconds"]:
            speed = ratio_cell(row["seconds"], engine, plain_engine)
            result[engine] = (speed, flops_ratio, speed[0] / flops_ratio)
    return result


# ------------------------------------------------------------------------------------------------ report
def ratio_cell(samples: dict, key, reference) -> tuple[float, str]:
    ratios = [b / a for a, b in zip(samples[key], samples[reference])]  # speed ratio = reference time / time
    median = statistics.median(ratios)
    return median, f"{median:.2f}x [{min(ratios):.2f}-{max(ratios):.2f}]"


def row_title(key) -> str:
    name, engine = key
    if name == "ctranslate2":
        return f"CTranslate2 {engine}"
    if name == "marian":
        return "MarianMTModel generate()"
    title = {ISSUE_BASELINE: "generate() as at issue 19 (every cache slot reordered)"}.get(engine, engine)
    return f"{backbone.MODELS[name].title}: {title.replace('_', ' ')}"


def print_speed_table(args, results: dict, clock: str = "wall-clock") -> dict:
    """One table per thread count; returns `{(kind, row, search, threads): ratio}` for the target checks."""
    ratios = {}
    for threads in args.threads:
        print(f"\n### {threads} thread{'s' if threads > 1 else ''}, {clock} seconds\n")
        header = ["engine"]
        for search in SEARCHES:
            header += [f"{search} s", f"{search} vs Marian", f"{search} vs own generate()"]
        header.append("beam vs own generate() at issue 19")
        print("| " + " | ".join(header) + " |")
        print("|" + "---|" * len(header))
        for key in results[threads, "beam"]:  # the beam runs are a superset of the greedy ones
            cells = [row_title(key)]
            for search in SEARCHES:
                samples = results[threads, search]
                if key not in samples:
                    cells += ["–"] * 3
                    continue
                cells.append(f"{statistics.median(samples[key]):.3f}")
                value, cell = ratio_cell(samples, key, ("marian", "generate"))
                cells.append(cell if key != ("marian", "generate") else "1")
                ratios["vs_marian", key, search, threads] = value
                own = key[0] in backbone.MODELS and key[0] != "marian" and key[1] in ("fast", "fast_int8")
                if own:
                    value, cell = ratio_cell(samples, key, (key[0], "generate"))
                    ratios["vs_generate", key, search, threads] = ratios["vs_issue", key, search, threads] = value
                cells.append(cell if own else "–")
            baseline = (key[0], ISSUE_BASELINE)
            if key[1] in ("fast", "fast_int8") and baseline in results[threads, "beam"]:
                value, cell = ratio_cell(results[threads, "beam"], key, baseline)
                ratios["vs_issue", key, "beam", threads] = value
                cells.append(cell)
            else:
                cells.append("–")
            print("| " + " | ".join(cells) + " |")
    return ratios


def print_targets(args, ratios: dict, bleu_rows) -> None:
    print("\nTargets (issues 19 and 39; median ratios of this run):")

    def report(text: str, value: float, bound: float, higher: bool = True, unit: str = "x", digits: int = 2):
        met = value >= bound if higher else value <= bound
        print(f"- {text} {'>=' if higher else '<='} {bound}{unit}: {value:.{digits}f}{unit}, {'met' if met else 'NOT met'}")

    for threads in args.threads if ratios else []:
        for search in SEARCHES:
            if "plain" in args.models:
                report(f"plain backbone fast float32 / Marian, {search}, {threads} thread(s)",
                       ratios["vs_marian", ("plain", "fast"), search, threads], TARGETS["plain_fast_vs_marian"])
                report(f"plain backbone fast int8 / Marian, {search}, {threads} thread(s)",
                       ratios["vs_marian", ("plain", "fast_int8"), search, threads], TARGETS["plain_int8_vs_marian"])
            for name in args.models:
                if name == "plain":
                    continue
                for engine in ("fast", "fast_int8"):
                    report(f"{backbone.MODELS[name].title} {engine.replace('_', ' ')} / its generate() at issue 19, "
                           f"{search}, {threads} thread(s)", ratios["vs_issue", (name, engine), search, threads],
                           TARGETS["fusion_fast_vs_generate"])
    for row in bleu_rows:
        search = "greedy" if row["num_beams"] == 1 else f"beam {row['num_beams']}"
        for fast_engine, versus in (("fast float32", "CTranslate2 float32"), ("fast int8", "CTranslate2 int8")):
            if versus in row["seconds"]:
                report(f"{fast_engine} / {versus} on {row['corpus']} ({row['model']}, {search}, {row['threads']} "
                       "thread(s))", ratio_cell(row["seconds"], fast_engine, versus)[0], TARGETS["workload_vs_ctranslate2"])
        if "flops" in row:
            for engine, (_, flops_ratio, normalised) in fusion_versus_plain(row).items():
                report(f"{row['model_type']} {engine} / plain {engine} ÷ FLOPs ratio {flops_ratio:.3f} on "
                       f"{row['corpus']} ({row['model']}, {search}, {row['threads']} thread(s))", normalised,
                       TARGETS["fusion_workload_vs_plain"])
        if row["threads"] != args.threads[0]:
            continue  # the BLEU does not depend on the thread count
        fast = row["bleu"]["fast float32"]
        for engine, int8 in row["bleu"].items():
            if engine.startswith("fast int8"):
                low, high = row["int8_cost_interval"][engine]
                report(f"{engine} BLEU cost on {row['corpus']} ({row['model']}, num_beams={row['num_beams']}: float32 "
                       f"{fast:.2f}, int8 {int8:.2f}; 95% interval {low:.3f} to {high:.3f})", fast - int8,
                       TARGETS["int8_bleu_cost"], higher=False, unit=" BLEU", digits=3)  # 0.203 must not print 0.20


def print_pooled_int8_costs(pooled: list[dict]) -> None:
    if not pooled:
        return
    print("\nint8 BLEU cost pooled over the models of this run (the mean of their costs; 95% interval: paired bootstrap, "
          "the same resamples of the sentences for every model):")
    for entry in pooled:
        search = "greedy" if entry["num_beams"] == 1 else f"beam {entry['num_beams']}"
        print(f"- {entry['engine']}, {search}, {len(entry['models'])} models: mean {entry['mean']:.3f} BLEU, 95% "
              f"interval {entry['interval'][0]:.3f} to {entry['interval'][1]:.3f}")


# ------------------------------------------------------------------------------------------------ results file
# the layout of a `--results-dir` file; study/inference_workload_report.py reads this version only
WORKLOAD_RESULTS_VERSION = 1


def search_label(num_beams: int) -> str:
    return "greedy" if num_beams == 1 else f"beam-{num_beams}"


def workload_results_path(results_dir: Path, max_cpu_isa: str | None = None, kind: str = "workload",
                          variant: str | None = None) -> Path:
    """`results_dir/<kind>_<cpu>_<commit>.json`: one file per CPU model and commit, so the results of different
    machines committed side by side never collide (a second run of the same code on the same CPU type must say
    `--overwrite-results`); `<cpu>-max-<isa>` for a run under `--max-cpu-isa`. `kind`: "workload" for this
    benchmark's files, "processes" for `bench_workload_processes.py`'s; `variant`: a run's other settings
    (`<cpu>-<variant>`, `bench_workload_processes.run_variant`)."""
    cpu = re.sub(r"[^a-z0-9]+", "-", backbone.cpu_model().lower()).strip("-") or "unknown-cpu"
    cap = (f"-max-{max_cpu_isa}" if max_cpu_isa else "") + (f"-{variant}" if variant else "")
    commit = backbone.git_revision().split("+")[0]  # the short commit; the file itself records uncommitted changes
    return Path(results_dir) / f"{kind}_{cpu}{cap}_{commit}.json"


def instruction_set_caps() -> dict[str, str]:
    """The instruction set caps this process's environment sets (`CAP_VARIABLES`)."""
    return {name: os.environ[name] for name in CAP_VARIABLES if os.environ.get(name)}


def run_under_instruction_set_cap(max_cpu_isa: str, argv: list[str]) -> None:
    """Re-executes this benchmark with every library capped at `max_cpu_isa` (`INSTRUCTION_SET_CAPS`: they read
    their caps when they load, and torch is loaded already); returns where the environment sets them already."""
    caps = INSTRUCTION_SET_CAPS[max_cpu_isa]
    if instruction_set_caps() == caps:
        return
    sys.stdout.flush()
    os.execve(sys.executable, [*module_command(__spec__.name), *argv], study_environment({**os.environ, **caps}))


def workload_record(args, command: str, revision: str, loadavg_start, rows: list[dict],
                    pooled: list[dict] | None = None) -> dict:
    """What `--results-dir` keeps of a run: its provenance (command, code, libraries, CPU, kernels, load), every
    row of `measure_workload` without its translations (megabytes per run; the identical counts stay), enough for
    inference_workload_report.py to compute every ratio and BLEU cost the printed tables show, and the run's
    `pooled_int8_costs` where it has any."""
    return {
        "format_version": WORKLOAD_RESULTS_VERSION,
        "command": command,
        "git_revision": revision,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__,
                     "hf_layerfusion": hf_layerfusion.__version__, "python": platform.python_version()},
        "cpu_model": backbone.cpu_model(),
        "cpu_family_model": cpu_family_model(),  # the generation, where the model name is generic
        "machine_type": machine_type(),  # the architecture and its vector instruction sets
        "logical_cpus": os.cpu_count(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        **({"max_cpu_isa": args.max_cpu_isa, "instruction_set_caps": instruction_set_caps()}
           if args.max_cpu_isa else {}),
        "kernels": kernel_summary(args.threads),
        "threads": list(args.threads),
        "workload_chunk": WORKLOAD_CHUNK,
        "loadavg_start": [round(value, 2) for value in loadavg_start],
        "loadavg_end": [round(value, 2) for value in os.getloadavg()],
        "rows": [
            {
                "model": row["model"], "model_type": row["model_type"], "corpus": row["corpus"],
                "num_beams": row["num_beams"], "threads": row["threads"], "sentences": row["sentences"],
                "seconds": row["seconds"], "bleu": row["bleu"],
                "identical_to": {engine: {"engine": other, "sentences": count}
                                 for engine, (other, count) in identical_translations(row).items()},
                **{key: row[key] for key in ("plain_reference", "flops", "int8_cost_interval") if key in row},
            }
            for row in rows
        ],
        **({"pooled_int8_costs": pooled} if pooled else {}),
    }


def write_workload_results(path: Path, record: dict, overwrite: bool) -> None:
    """Write `record` to `path` whole or not at all (a temporary file in the same folder, renamed into place): a run
    cut short leaves no half file for the report to choke on. An existing file was checked before the run
    (`parse_args`); one that appeared since is kept, and this run's results stay in the temporary file, named in
    the error."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # a dot file: the report reads none
    temporary.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} appeared during the run; this run's results are in {temporary} "
                              "(rename it, or rerun with --overwrite-results)")
    os.replace(temporary, path)


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=backbone.DEFAULT_DATA, help="Multi30k directory")
    parser.add_argument("--models", nargs="+", choices=[name for name in backbone.MODELS if name != "marian"],
                        default=None, help=f"family settings of bench_backbone.py (default: {' '.join(DEFAULT_MODELS)})")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--sentences", type=int, default=32, help="source sentences in the batch")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--speed", choices=["all", "none"], default="all", help="`none`: only --bleu")
    parser.add_argument("--bleu", type=Path, nargs="+", default=[],
                        help="trained model dirs: translate Multi30k test with every engine (seconds, BLEU)")
    parser.add_argument("--bleu-beams", type=int, nargs="+", default=[4], help="searches for --bleu (num_beams)")
    parser.add_argument("--bleu-sentences", type=int, default=None, help="test sentences for --bleu (default: all)")
    parser.add_argument("--bleu-corpus", choices=["multi30k", "quickstart"], default="multi30k",
                        help="the test set of --bleu: Multi30k's, or examples/quickstart.py's (for its models)")
    parser.add_argument("--int8-formats", type=int, nargs="+", choices=[7, 8], default=[],
                        help="with --bleu, also the int8 loop in each of these formats (code bits), whatever this "
                             "CPU's default")
    parser.add_argument("--plain-reference", type=Path, default=None,
                        help="with --bleu: a trained plain Transformer (same tokenizer) whose fast loops are timed "
                             "beside every fusion model's, with both models' counted FLOPs (issue 39's fusion target)")
    parser.add_argument("--flops-every", type=int, default=5,
                        help="with --plain-reference: count FLOPs on every N-th workload sentence (default 5)")
    parser.add_argument("--results-dir", type=Path, default=None,
                        help="with --bleu: also write the real workload's results to DIR/workload_<cpu>_<commit>.json "
                             "(for study/inference_workload_report.py, e.g. study/results/inference)")
    parser.add_argument("--overwrite-results", action="store_true",
                        help="let --results-dir replace an existing file of the same CPU and commit")
    parser.add_argument("--max-cpu-isa", choices=sorted(INSTRUCTION_SET_CAPS), default=None,
                        help="run every engine (the package's kernels, torch, oneDNN, MKL, CTranslate2) with at most "
                             "these instructions, as on a CPU that has only them: avx2, or avx512 (with VNNI, no "
                             "AMX); the run re-executes itself with the libraries' variables set")
    parser.add_argument("--quick", action="store_true", help="smoke run: one repeat, 8 new tokens, 1 thread")
    args = parser.parse_args(argv)
    caps = instruction_set_caps()
    if caps and args.max_cpu_isa is None:
        parser.error(f"the environment caps instruction sets ({', '.join(f'{k}={v}' for k, v in caps.items())}): "
                     "unset them, or give --max-cpu-isa so that every engine is capped alike and the results say so")
    if args.max_cpu_isa is not None and caps and caps != INSTRUCTION_SET_CAPS[args.max_cpu_isa]:
        other = {k: v for k, v in caps.items() if INSTRUCTION_SET_CAPS[args.max_cpu_isa].get(k) != v}
        parser.error(f"--max-cpu-isa {args.max_cpu_isa}: the environment sets other caps already "
                     f"({', '.join(f'{k}={v}' for k, v in other.items())}); unset them")
    # checked before any work: a workload run takes hours, and its results must have somewhere to go
    args.results_path = None
    if args.results_dir is not None:
        if not args.bleu:
            parser.error("--results-dir keeps the results of the real workload: it needs --bleu MODEL_DIR")
        if args.results_dir.exists() and not args.results_dir.is_dir():
            parser.error(f"--results-dir {args.results_dir} is not a directory")
        target = workload_results_path(args.results_dir, args.max_cpu_isa)
        if target.exists() and not args.overwrite_results:
            parser.error(f"{target} exists already (this CPU type and commit); --overwrite-results replaces it")
        args.results_path = target
    elif args.overwrite_results:
        parser.error("--overwrite-results needs --results-dir")
    if args.plain_reference is not None:
        if not args.bleu:
            parser.error("--plain-reference is timed beside the fusion models of --bleu MODEL_DIR: give some")
        config = args.plain_reference / "config.json"
        try:
            model_type = json.loads(config.read_text(encoding="utf-8")).get("model_type")
        except (OSError, ValueError) as error:
            parser.error(f"--plain-reference {args.plain_reference}: no readable config.json ({error})")
        if model_type != "plain_transformer":
            parser.error(f"--plain-reference {args.plain_reference} is a {model_type!r} model; it must be a "
                         "plain_transformer")
    if args.flops_every < 1:
        parser.error(f"--flops-every takes a positive integer, got {args.flops_every}")
    for name in ("bleu_beams", "threads"):
        bad = [value for value in getattr(args, name) if value < 1]
        if bad:
            parser.error(f"--{name.replace('_', '-')} takes positive integers, got {bad}")
    if args.bleu_sentences is not None and args.bleu_sentences < 1:
        parser.error(f"--bleu-sentences must be positive, got {args.bleu_sentences}")
    args.models = list(dict.fromkeys(["plain", *(args.models or DEFAULT_MODELS)]))
    if args.quick:
        args.repeats, args.max_new_tokens, args.threads = 1, 8, [1]
    return args


def kernel_summary(thread_counts: list[int]) -> str:
    """What the fast loop's compiled kernels run on here: the int8 product, and how many threads their
    `at::parallel_for` uses at each --threads count (1 everywhere means they were built without OpenMP)."""
    kernels = compiled_kernels()
    if kernels is None:
        return "not compiled (the fast loop runs torch operations)"
    before = torch.get_num_threads()
    used = []
    for threads in thread_counts:
        torch.set_num_threads(threads)
        used.append(f"{kernels.parallel_for_threads(64)} at {threads}")
    torch.set_num_threads(before)
    bits = kernels.int8_code_bits()
    cap = instruction_set_summary(kernels)
    return (f"int8 product {kernels.int8_product(bits)} ({bits}-bit codes), threads used by their parallel loops "
            f"{', '.join(used)}{'; ' + cap if cap else ''}")


def main(argv=None):
    args = parse_args(argv)
    if args.max_cpu_isa is not None:
        run_under_instruction_set_cap(args.max_cpu_isa, sys.argv[1:] if argv is None else list(argv))
    command = reproduction_command(__spec__.name, sys.argv[1:])
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    start, loadavg_start, loadavg_numbers = time.perf_counter(), backbone.loadavg(), os.getloadavg()
    revision = backbone.git_revision()
    print("## hf_layerfusion CPU inference benchmark (issue 19)\n")
    print(f"- command (from the repository root): `{command}`")
    print(f"- torch {torch.__version__}, transformers {transformers.__version__}, hf_layerfusion "
          f"{hf_layerfusion.__version__} (git {revision}), Python {platform.python_version()}")
    family_model = cpu_family_model()
    print(f"- CPU: {backbone.cpu_model()}{f' ({family_model})' if family_model else ''} ({os.cpu_count()} logical "
          f"CPUs visible), OMP_WAIT_POLICY="
          f"{os.environ['OMP_WAIT_POLICY']}, load average at start {loadavg_start}")
    print(f"- compiled kernels: {kernel_summary(args.threads)}")
    if args.max_cpu_isa is not None:
        print(f"- every engine capped at {args.max_cpu_isa} (--max-cpu-isa): "
              f"{', '.join(f'{k}={v}' for k, v in instruction_set_caps().items())}")
    lines, ratios, results, cpu_results = [], {}, {}, {}
    if args.speed == "all":
        tokenizer = backbone.train_tokenizer(args.data, args.vocab_size)
        sources = backbone.read_lines(args.data / "test_2016_flickr.en")[: args.sentences]
        batch = backbone.encode_batch(tokenizer, sources)
        source_tokens = [
            tokenizer.convert_ids_to_tokens(ids[mask.bool()].tolist())
            for ids, mask in zip(batch["input_ids"], batch["attention_mask"])
        ]
        marian = backbone.build_marian(len(tokenizer), args.seed)
        models = {name: backbone.build_model(name, marian, args.seed).eval() for name in ["marian", *args.models]}
        print(f"- setting: Multi30k preset, vocab {len(tokenizer)}, random weights (seed {args.seed}; Marian and the "
              f"plain backbone share theirs), {len(sources)} test_2016_flickr.en sentences ({batch['input_ids'].shape[1]} "
              f"positions padded), exactly {args.max_new_tokens} new tokens, greedy and beam-{SEARCHES['beam']}, "
              f"{args.repeats} repeats, engines alternated; ratios = median of per-repeat ratios [min-max]")
        with tempfile.TemporaryDirectory() as work:
            translators = ctranslate2_engines(models["plain"], tokenizer, Path(work), args.threads)
            prepare = time.perf_counter()
            for name in args.models:
                prepare_for_inference(models[name], "int8")
            print(f"- int8 copies of {len(args.models)} models made in {time.perf_counter() - prepare:.1f}s (not timed below)")
            torch.set_num_threads(args.threads[0])
            lines = check_tokens(args, models, translators, tokenizer, batch, source_tokens)
            for threads in args.threads:
                torch.set_num_threads(threads)
                for search, num_beams in SEARCHES.items():
                    runs = build_runs(args, models, translators, batch, source_tokens, num_beams, threads)
                    results[threads, search], cpu_results[threads, search] = interleaved_seconds(runs, args.repeats)
        print("\nChecks:")
        print("\n".join(lines))
        ratios = print_speed_table(args, results)
        print("\nThe same runs in process CPU time (less sensitive to other load; with 2 threads it adds both threads' "
              "time, so it measures work rather than speed; targets use the wall-clock table above):")
        print_speed_table(args, cpu_results, "process CPU")
    bleu_rows = measure_workload(args) if args.bleu else []
    for row in bleu_rows:
        print_workload(row)
    print_targets(args, ratios, bleu_rows)
    pooled = pooled_int8_costs(bleu_rows, args.threads[0])
    print_pooled_int8_costs(pooled)
    if args.results_path is not None:
        record = workload_record(args, command, revision, loadavg_numbers, bleu_rows, pooled)
        write_workload_results(args.results_path, record, args.overwrite_results)
        print(f"\n- results written to {args.results_path} "
              "(`python -m study.inference_workload_report` renders them)")
    print(f"\n(load average at end {backbone.loadavg()}; total wall time {time.perf_counter() - start:.0f}s)")


if __name__ == "__main__":
    main()
