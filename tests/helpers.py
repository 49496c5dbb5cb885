"""What the test files share, in one plain module (`from helpers import ...`; pytest puts tests/ on the path):

- the tiny sizes and special ids every test builds with, each family's tiny test config (tests/tiny_configs), tiny
  models and a tiny tokenizer, a tiny random MarianMTModel and its batch, the shared data of ../shared;
- the family contract (`assert_...`): the checks tests/test_family_contract.py runs on every registered family and
  the family files run on their papers' settings (KV cache, cached search, eager == SDPA, gradient checkpointing,
  save / load, gradients of every parameter);
- independent references: the Transformer computed from its definitions, generation written as loops over full
  forward passes, and a Trainer step computed as plain SGD;
- processes without the package (the Hub code alone).

Nothing in the references calls the code under test except to read its weights (`module.q_proj.weight`, ...) and,
for the generation and training references, the model's full forward pass and loss (what `generate()` and the Trainer
must agree with). The layer functions take the layout string of the test, not the module's own, and apply every
sub-layer as the papers define it:

- post-norm (Vaswani et al.): `x <- LN(x + f(x))`;
- pre-norm: `x <- x + f(LN(x))`, and the stack's final LayerNorm on top;

with `f` multi-head attention `softmax(Q K^T / sqrt(d_h) + mask) V` (heads concatenated, output projection) or the
feed-forward network `W_2 relu(W_1 x + b_1) + b_2`, and the input `sqrt(d) E[x] + P[pos]` with the sinusoidal table
(sin in the first half of the features, cos in the second, positions from 0) written out here.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import io
import json
import math
import os
import subprocess
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM, MarianConfig, MarianMTModel

import hf_layerfusion
from hf_layerfusion.compat import output_cache

# --------------------------------------------------------------------------------------------- sizes, data
# Special ids of every hf_layerfusion config (fairseq convention); ordinary tokens start at FIRST_TOKEN_ID.
BOS, PAD, EOS, UNK = 0, 1, 2, 3
FIRST_TOKEN_ID = 4

TINY_BACKBONE = dict(
    vocab_size=24,
    d_model=16,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=32,
    decoder_ffn_dim=32,
    max_position_embeddings=32,
    dropout=0.0,
    attention_dropout=0.0,
    activation_dropout=0.0,
)

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DIR = REPO_ROOT.parent / "shared"
MULTI30K_DIR = SHARED_DIR / "data" / "multi30k"


def require_shared(path: Path, what: str) -> None:
    """Skip a test whose data from ../shared is missing, except in CI (`CI=true`), where a missing dataset is a
    failure: there the skip would silently hide the tests that need it."""
    if path.exists():
        return
    message = f"{what} not found at {path}"
    if os.environ.get("CI", "").strip().lower() in ("true", "1", "yes"):
        pytest.fail(f"{message}; CI=true: the tests that need ../shared must run, not skip", pytrace=False)
    pytest.skip(message)


def cpu_flags() -> set[str]:
    """The CPU's feature flags (/proc/cpuinfo; empty elsewhere)."""
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return {flag for line in lines if line.startswith("flags") for flag in line.split(":", 1)[1].split()}


# the CPU flags each instruction set of the kernels' cap (`cpu_kernels.INSTRUCTION_SETS`) adds to the narrower ones
INSTRUCTION_SET_FLAGS = {"avx2": ("avx2", "fma"), "avx512": ("avx512",), "amx": ("amx",)}


def instruction_sets_of_this_cpu() -> list[str]:
    """The kernels' instruction sets this CPU has, narrowest first: "generic" always; "avx2" with AVX2 and FMA;
    "avx512" with AVX-512F; "amx" with AMX-INT8 tiles. Capped at each (`limit_instruction_set`), the kernels run the
    code paths of a CPU that has only that, so the tests reach every path on the widest machine."""
    flags = cpu_flags()
    sets = ["generic"]
    if {"avx2", "fma"} <= flags:
        sets.append("avx2")
        if "avx512f" in flags:
            sets.append("avx512")
            if {"amx_tile", "amx_int8"} <= flags:
                sets.append("amx")
    return sets


def usable_cpu_flags() -> set[str]:
    """The CPU's flags that the compiled kernels may use under their current instruction set cap: which kernels must
    be in use."""
    from hf_layerfusion.inference.cpu_kernels import INSTRUCTION_SETS, compiled_kernels

    level = compiled_kernels().max_instruction_set()
    excluded = tuple(prefix for name in INSTRUCTION_SETS[level + 1:] for prefix in INSTRUCTION_SET_FLAGS[name])
    return {flag for flag in cpu_flags() if not flag.startswith(excluded)} if excluded else cpu_flags()


def vnni_before_onednn() -> bool:
    """Whether the one-thread timings this process's kernels took of oneDNN's product and VNNI's put VNNI's first."""
    from hf_layerfusion.inference.cpu_kernels import compiled_kernels

    timings = compiled_kernels().onednn_vnni_timings()
    return timings["vnni"] < timings["onednn"]


def expected_int8_products(code_bits: int) -> list[str]:
    """Every product that runs `code_bits` weights on this CPU under the kernels' instruction set cap, its fastest
    first, by the kernel's names: the AMX layout (either format), oneDNN's product and VNNI's own panels (8 bits, on a
    CPU with VNNI; without AMX, the one the process timed faster first), AVX2's (7 bits), and the float32 blocks
    anywhere."""
    flags = usable_cpu_flags()
    products = ["amx"] if {"amx_tile", "amx_int8"} <= flags else []
    if {"avx512_vnni", "avx512bw"} <= flags and code_bits == 8:
        products += ["vnni", "onednn"] if not products and vnni_before_onednn() else ["onednn", "vnni"]
    if "avx2" in flags and code_bits == 7:
        products.append("avx2")
    return [*products, "float32_blocks"]


class CountingKernels:
    """The compiled CPU kernels (the `kernels` fixture), counting the calls of each function by name: monkeypatched
    in as a module's `compiled_kernels()`, it shows which kernels ran (the calls made from Python: kernels that the
    compiled decoding steps or a `KernelLinear` call from C++ are not counted)."""

    def __init__(self, kernels):
        self.kernels, self.calls = kernels, collections.Counter()

    def __getattr__(self, name: str):
        function = getattr(self.kernels, name)
        if isinstance(function, type):  # a class (`KernelLinear`): its layers' calls are not counted here
            return function

        def counted(*args, **kwargs):
            self.calls[name] += 1
            return function(*args, **kwargs)

        return counted


# --------------------------------------------------------------------------------------------- tiny models
# one file per family: the config keywords that make it valid, with its fusion active, at 2 + 2 layers
TINY_CONFIGS_DIR = Path(__file__).resolve().parent / "tiny_configs"
SOURCES = ["ab ba", "abba baab ab", "b", "baba ab aab"]  # texts of `tiny_tokenizer`
GENERATION = dict(num_beams=4, max_new_tokens=8)


def tiny_config_overrides(model_type: str) -> dict:
    """The family's tiny test config, `tests/tiny_configs/<model_type>.json`."""
    return json.loads((TINY_CONFIGS_DIR / f"{model_type}.json").read_text(encoding="utf-8"))["config"]


def tiny_config(model_type: str, **overrides):
    """The family's config at the tiny sizes of `TINY_BACKBONE` with its tiny test config and `overrides`."""
    config_class = hf_layerfusion.FAMILIES[model_type].config
    return config_class(**{**TINY_BACKBONE, **tiny_config_overrides(model_type), **overrides})


def tiny_model(model_type: str, seed: int = 0, **overrides):
    """A tiny model of `model_type` in eval mode whose every weight is random (fusion weights start at 0 otherwise)."""
    model = hf_layerfusion.FAMILIES[model_type].for_conditional_generation(tiny_config(model_type, **overrides)).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return model


def tiny_sources() -> dict:
    """Five right-padded sources of lengths 9, 7, 3, 9, 2 ending in EOS."""
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(FIRST_TOKEN_ID, TINY_BACKBONE["vocab_size"], (5, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    for row, length in enumerate([9, 7, 3, 9, 2]):
        input_ids[row, length - 1] = EOS
        input_ids[row, length:] = PAD
        attention_mask[row, length:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def source_of(batch: dict) -> dict:
    """The source half of a batch: `input_ids` and `attention_mask`."""
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def seeded_decoder_inputs(model, batch_size: int = 3, length: int = 5) -> torch.Tensor:
    """Random teacher-forced decoder inputs (a fixed seed) that start with the model's decoder start token."""
    ids = torch.randint(4, model.config.vocab_size, (batch_size, length), generator=torch.Generator().manual_seed(9))
    ids[:, 0] = model.config.decoder_start_token_id
    return ids


def tiny_tokenizer(language_tags: bool = False):
    """A BPE tokenizer of `SOURCES`' letters with the package's special tokens; `language_tags=True` adds the
    target-language tags `<2de>` and `<2en>`, the tokenizer of a multilingual model (which refuses untagged sources)."""
    return hf_layerfusion.train_joint_tokenizer(
        ["ab ba abba", "baab ab b a", "abab baba aa bb"] * 5, vocab_size=24, model="bpe",
        extra_special_tokens=["<2de>", "<2en>"] if language_tags else (),
    )


# --------------------------------------------------------------------------------------------- Marian
MARIAN_VOCAB = 60
MARIAN_PAD = MARIAN_VOCAB - 1  # Marian puts <pad> last and starts decoding from it
MARIAN_EOS = 0


def tiny_marian(attn_implementation: str, scale_embedding: bool = True) -> MarianMTModel:
    """A random tiny Marian; `scale_embedding=True` as in the opus-mt checkpoints (MarianConfig's default is False)."""
    config = MarianConfig(
        **{**TINY_BACKBONE, "vocab_size": MARIAN_VOCAB, "max_position_embeddings": 64},  # MarianConfig's key names
        decoder_vocab_size=MARIAN_VOCAB,
        pad_token_id=MARIAN_PAD,
        decoder_start_token_id=MARIAN_PAD,
        eos_token_id=MARIAN_EOS,
        forced_eos_token_id=MARIAN_EOS,
        scale_embedding=scale_embedding,
        attn_implementation=attn_implementation,
    )
    model = MarianMTModel(config).eval()
    # Marian's 0.02-std init gives near-uniform logits on which beam search would be decided by rounding; larger
    # random weights (LayerNorms and the logits bias included) make every weight matter and the argmax robust.
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "embed_positions" not in name:
                param.copy_(
                    torch.randn(param.shape, generator=generator) * 0.5 + (1.0 if "layer_norm.weight" in name else 0.0)
                )
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape, generator=generator))
    return model


def padded_source():
    """A batch for `tiny_marian` (and the models converted from it): 3 padded sources, padded decoder inputs."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(1, MARIAN_VOCAB - 1, (3, 8), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    for row, length in enumerate([8, 5, 2]):
        input_ids[row, length - 1] = MARIAN_EOS
        input_ids[row, length:] = MARIAN_PAD
        attention_mask[row, length:] = 0
    decoder_input_ids = torch.randint(1, MARIAN_VOCAB - 1, (3, 6), generator=generator)
    decoder_input_ids[:, 0] = MARIAN_PAD
    decoder_attention_mask = torch.ones_like(decoder_input_ids)
    decoder_input_ids[2, 4:] = MARIAN_PAD
    decoder_attention_mask[2, 4:] = 0
    return dict(
        input_ids=input_ids,
        attention_mask=attention_mask,
        decoder_input_ids=decoder_input_ids,
        decoder_attention_mask=decoder_attention_mask,
    )


# --------------------------------------------------------------------------------------------- building blocks
def layer_norm(x: torch.Tensor, module) -> torch.Tensor:
    """`(x - mean) / sqrt(var + eps) * gain + bias` over the last dimension, with `module`'s gain, bias and eps."""
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + module.eps) * module.weight + module.bias


def linear(x: torch.Tensor, module) -> torch.Tensor:
    return x @ module.weight.T + module.bias


def feed_forward(x: torch.Tensor, module) -> torch.Tensor:
    """`W_2 relu(W_1 x + b_1) + b_2` with `module.fc1` / `module.fc2`."""
    return linear(torch.clamp(linear(x, module.fc1), min=0), module.fc2)


def attention(module, queries_from: torch.Tensor, keys_from: torch.Tensor, allowed: torch.Tensor, heads: int):
    """Multi-head attention of `queries_from` (batch, m, d) over `keys_from` (batch, n, d) with `module`'s
    projections; `allowed` (batch, m, n) says which keys each query may see (the others get -inf)."""
    batch, m, d = queries_from.shape
    head_dim = d // heads

    def split(t):
        return t.view(batch, -1, heads, head_dim).transpose(1, 2)

    q = split(linear(queries_from, module.q_proj))
    k, v = split(linear(keys_from, module.k_proj)), split(linear(keys_from, module.v_proj))
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(head_dim)
    scores = scores.masked_fill(~allowed[:, None], float("-inf"))
    context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, m, d)
    return linear(context, module.out_proj)


def padding_allowed(key_mask: torch.Tensor, queries: int) -> torch.Tensor:
    """(batch, queries, keys): every query may see every key whose mask entry is 1."""
    return key_mask.bool()[:, None, :].expand(-1, queries, -1)


def causal_allowed(batch: int, length: int) -> torch.Tensor:
    """(batch, length, length): query t may see keys 0..t."""
    return torch.ones(length, length, dtype=torch.bool).tril()[None].expand(batch, -1, -1)


def sinusoidal_table(length: int, d: int) -> torch.Tensor:
    """P[pos] = [sin(pos / 10000^(2i/d)) for i < d/2] + [cos(pos / 10000^(2i/d)) for i < d/2]."""
    rows = []
    for pos in range(length):
        angles = [pos / 10000 ** (2 * i / d) for i in range(d // 2)]
        rows.append([math.sin(a) for a in angles] + [math.cos(a) for a in angles])
    return torch.tensor(rows, dtype=torch.float64)


def embed(model, input_ids: torch.Tensor, layernorm_embedding=None) -> torch.Tensor:
    """s_0 = sqrt(d) E[x] + P[pos] (positions from 0), then the embedding LayerNorm if one is given."""
    weight = model.model.shared.weight
    x = math.sqrt(weight.shape[1]) * weight[input_ids] + sinusoidal_table(input_ids.shape[1], weight.shape[1]).to(weight)
    return x if layernorm_embedding is None else layer_norm(x, layernorm_embedding)


def output_logits(model, features: torch.Tensor) -> torch.Tensor:
    """`h E^T + b`: the tied output projection and Marian's logits bias."""
    return features @ model.model.shared.weight.T + model.final_logits_bias[0]


@contextlib.contextmanager
def float64_default():
    """Models built inside are float64 throughout, their computed position tables included (`.double()` would keep
    tables computed in float32, 1e-8 off the reference's)."""
    dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(dtype)


# --------------------------------------------------------------------------------------------- layers and stacks
def sublayer_module_names(layout: str) -> list[tuple[str, str]]:
    """(kind, module name) of each sub-layer: the first of a kind carries the Marian name (`self_attn`, `encoder_attn`,
    `ffn`), a repeated kind is numbered from 2 (`ffn_2`); each has its LayerNorm in `<name>_block.layer_norm`."""
    base = {"s": "self_attn", "c": "encoder_attn", "f": "ffn"}
    seen: dict[str, int] = {}
    names = []
    for kind in layout:
        seen[kind] = seen.get(kind, 0) + 1
        names.append((kind, base[kind] if seen[kind] == 1 else f"{base[kind]}_{seen[kind]}"))
    return names


# attend(kind, module, normalised input, normalize) -> the attention sub-layer's output; `normalize` is what the
# sub-layer's residual block does to its input (its LayerNorm in pre-norm, the identity in post-norm)
Attend = Callable[[str, torch.nn.Module, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]], torch.Tensor]


def reference_layer(layer, layout: str, x: torch.Tensor, pre_norm: bool, attend: Attend) -> torch.Tensor:
    """One layer of `layout`, sub-layer by sub-layer, with `layer`'s weights: post-norm `x <- LN(x + f(x))`, pre-norm
    `x <- x + f(LN(x))`; `f` is `attend(...)` for `s` and `c`, the feed-forward network for `f`."""
    for kind, name in sublayer_module_names(layout):
        norm = getattr(layer, f"{name}_block").layer_norm

        def normalize(t, norm=norm):
            return layer_norm(t, norm) if pre_norm else t

        module = getattr(layer, name)
        update = feed_forward(normalize(x), module) if kind == "f" else attend(kind, module, normalize(x), normalize)
        x = x + update if pre_norm else layer_norm(x + update, norm)
    return x


def plain_attend(heads: int, self_allowed: torch.Tensor, memory=None, memory_allowed=None) -> Attend:
    """The Transformer's attention sub-layers: `s` over its own (normalised) input, `c` over the memory."""

    def attend(kind, module, x, normalize):
        if kind == "s":
            return attention(module, x, x, self_allowed, heads)
        return attention(module, x, memory, memory_allowed, heads)

    return attend


def reference_stack(
    layers: Sequence,
    layouts: Sequence[str],
    s_0: torch.Tensor,
    pre_norm: bool,
    attend_for_layer: Callable[[int, list[torch.Tensor]], Attend],
    connect: Callable[[int, torch.Tensor, list[torch.Tensor]], torch.Tensor] | None = None,
) -> list[torch.Tensor]:
    """The states [s_0 .. s_L] as the layers produce them (pre-norm: before the final LayerNorm). Layer l reads
    s_{l-1}; `connect(l, output, states_below)` turns layer l's output into s_l (default: the output itself);
    `attend_for_layer(l, states_below)` gives layer l's attention (l is 1-based)."""
    states = [s_0]
    for index, (layer, layout) in enumerate(zip(layers, layouts, strict=True), start=1):
        output = reference_layer(layer, layout, states[-1], pre_norm, attend_for_layer(index, states))
        states.append(output if connect is None else connect(index, output, states))
    return states


def reference_encoder_decoder_logits(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    decoder_input_ids: torch.Tensor,
    encoder_layouts: Sequence[str],
    decoder_layouts: Sequence[str],
    pre_norm: bool,
    layernorm_embedding: bool = False,
) -> torch.Tensor:
    """Logits of the plain encoder-decoder (any layer layouts), every step written out; pre-norm stacks end in their
    final LayerNorm. The decoder input is unpadded (causal attention only)."""
    config = model.config
    encoder, decoder = model.model.encoder, model.model.decoder

    def embedding_norm(stack):
        return stack.embeddings.layernorm_embedding if layernorm_embedding else None

    def final(stack, top):
        return layer_norm(top, stack.layer_norm) if pre_norm else top

    source_allowed = padding_allowed(attention_mask, input_ids.shape[1])
    states = reference_stack(
        encoder.layers,
        encoder_layouts,
        embed(model, input_ids, embedding_norm(encoder)),
        pre_norm,
        lambda l, below: plain_attend(config.encoder_attention_heads, source_allowed),
    )
    memory = final(encoder, states[-1])
    batch, length = decoder_input_ids.shape
    attend = plain_attend(
        config.decoder_attention_heads,
        causal_allowed(batch, length),
        memory,
        padding_allowed(attention_mask, length),
    )
    states = reference_stack(
        decoder.layers,
        decoder_layouts,
        embed(model, decoder_input_ids, embedding_norm(decoder)),
        pre_norm,
        lambda l, below: attend,
    )
    return output_logits(model, final(decoder, states[-1]))


def randomize_layer_norms(model, seed: int = 0, scale: float = 0.3) -> None:
    """Every LayerNorm gain and bias moved away from 1 / 0, so that a LayerNorm applied in the wrong place (or one
    skipped) changes the result by far more than rounding."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.add_(torch.randn(module.weight.shape, generator=generator, dtype=module.weight.dtype) * scale)
                module.bias.add_(torch.randn(module.bias.shape, generator=generator, dtype=module.bias.dtype) * scale)


def assert_same_logits_and_beam_search(reference_model, model, batch: dict, atol: float) -> None:
    """`model` computes what a transformers reference model computes on `batch`: the same logits (not near zero) and,
    from the batch's source, the same beam search (4 beams: hypotheses and scores)."""
    with torch.no_grad():
        expected, logits = reference_model(**batch).logits, model(**batch).logits
    assert expected.abs().max() > 1.0  # the comparison is not between near-zero tensors
    torch.testing.assert_close(logits, expected, atol=atol, rtol=0)
    generate_kwargs = dict(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=4, max_length=12,
        output_scores=True, return_dict_in_generate=True,
    )
    expected, generated = reference_model.generate(**generate_kwargs), model.generate(**generate_kwargs)
    assert generated.sequences.tolist() == expected.sequences.tolist()
    torch.testing.assert_close(generated.sequences_scores, expected.sequences_scores, atol=atol, rtol=0)


def pre_norm_readout_states(model, batch: dict, targets: torch.Tensor, memory_from: Callable) -> tuple:
    """The hand-written pre-norm encoder and decoder states of a model with plain layers as readouts see them: s_0 as
    it is, s_1..s_L through the stack's final LayerNorm. `memory_from(encoder states)` is the memory every
    cross-attention reads. Returns the memory and the decoder states."""
    config, encoder, decoder = model.config, model.model.encoder, model.model.decoder
    source_mask = batch["attention_mask"]

    def readout_states(stack, ids, attend, layout):
        states = reference_stack(stack.layers, [layout] * len(stack.layers), embed(model, ids), True, lambda l, below: attend)
        return states[:1] + [layer_norm(state, stack.layer_norm) for state in states[1:]]

    encoder_attend = plain_attend(config.encoder_attention_heads, padding_allowed(source_mask, source_mask.shape[1]))
    memory = memory_from(readout_states(encoder, batch["input_ids"], encoder_attend, "sf"))
    decoder_attend = plain_attend(
        config.decoder_attention_heads, causal_allowed(*targets.shape), memory,
        padding_allowed(source_mask, targets.shape[1]),
    )
    return memory, readout_states(decoder, targets, decoder_attend, "scf")


# --------------------------------------------------------------------------------------------- family contract
def assert_incremental_decoding_matches_full_forward(model, source, decoder_input_ids, atol=1e-5, **forward_kwargs):
    """Feeds the target one token at a time through the KV cache (the encoder run once) and checks every step's
    logits against the full forward pass over the whole target, and that the cache grew by one position per step.
    Returns the final cache."""
    with torch.no_grad():
        full = model(**source, decoder_input_ids=decoder_input_ids, **forward_kwargs).logits
        encoder_outputs = model.get_encoder()(**source)
        cache = None
        for step in range(decoder_input_ids.shape[1]):
            out = model(
                encoder_outputs=encoder_outputs,
                attention_mask=source["attention_mask"],
                decoder_input_ids=decoder_input_ids[:, step : step + 1],
                cache=cache,
                use_cache=True,
                **forward_kwargs,
            )
            cache = output_cache(out)
            assert cache.get_seq_length() == step + 1
            torch.testing.assert_close(out.logits[:, 0], full[:, step], atol=atol, rtol=0, msg=f"step {step}")
    return cache


def assert_cached_search_is_uncached_search(model, source: dict, num_beams: int, max_new_tokens: int = 6, **kwargs):
    """`generate()` with the KV cache (reordered between beams) returns the sequences, and in beam search the scores,
    that it returns without the cache."""
    searches = [
        model.generate(
            **source, num_beams=num_beams, max_new_tokens=max_new_tokens, use_cache=use_cache, output_scores=True,
            return_dict_in_generate=True, **kwargs,
        )
        for use_cache in (True, False)
    ]
    assert searches[0].sequences.tolist() == searches[1].sequences.tolist()
    if num_beams > 1:
        torch.testing.assert_close(searches[0].sequences_scores, searches[1].sequences_scores, atol=1e-5, rtol=0)


def assert_eager_equals_sdpa(model, batch: dict, atol: float = 1e-5, rtol: float = 0.0) -> None:
    """The logits of `model` with eager attention and with SDPA (the same weights) agree."""
    with torch.no_grad():
        model.set_attn_implementation("eager")
        eager = model(**batch).logits
        model.set_attn_implementation("sdpa")
        assert model.config._attn_implementation == "sdpa"
        sdpa = model(**batch).logits
    torch.testing.assert_close(sdpa, eager, atol=atol, rtol=rtol)


def assert_gradient_checkpointing_same_gradients(model, batch: dict, use_reentrant: bool, atol=1e-6, rtol=1e-5):
    """With activation checkpointing every layer of both stacks is checkpointed (counted: hooks do not see the
    recompute), the same parameters get gradients, and the gradients are those without it. Returns them."""
    model.train()

    def gradients():
        model.zero_grad(set_to_none=True)
        model(**batch).loss.backward()
        return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}

    reference = gradients()
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": use_reentrant})
        assert model.is_activation_checkpointing
    else:  # transformers before 5.23 (the supported range starts earlier) calls it gradient checkpointing
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": use_reentrant})
        assert model.is_gradient_checkpointing
    layers = [*model.model.encoder.layers, *model.model.decoder.layers]
    checkpoint_calls = []
    for index, layer in enumerate(layers):
        checkpoint = layer._gradient_checkpointing_func
        layer._gradient_checkpointing_func = lambda *a, c=checkpoint, i=index, **k: (
            checkpoint_calls.append(i) or c(*a, **k)
        )
    checkpointed = gradients()
    assert sorted(checkpoint_calls) == list(range(len(layers)))
    assert checkpointed.keys() == reference.keys()
    for name in reference:
        torch.testing.assert_close(checkpointed[name], reference[name], atol=atol, rtol=rtol, msg=name)
    return checkpointed


def assert_save_load_round_trip(model, batch: dict, directory: Path):
    """`save_pretrained` then `AutoModelForSeq2SeqLM.from_pretrained` give the same family (AutoConfig and AutoModel
    load its classes), config, weights (the embeddings and the output projection still one matrix), generation config
    special ids, logits and loss bit for bit, and beam search. Returns the loaded model."""
    model.eval().save_pretrained(directory)
    family = hf_layerfusion.FAMILIES[model.config.model_type]
    assert (directory / "model.safetensors").is_file()
    generation_config = json.loads((directory / "generation_config.json").read_text())
    for key in ("decoder_start_token_id", "eos_token_id", "pad_token_id"):
        assert generation_config[key] == getattr(model.config, key), key
    assert type(AutoConfig.from_pretrained(directory)) is family.config
    assert type(AutoModel.from_pretrained(directory)) is family.model
    loaded = AutoModelForSeq2SeqLM.from_pretrained(directory, attn_implementation=model.config._attn_implementation)
    loaded.eval()
    assert type(loaded) is type(model) is family.for_conditional_generation
    assert loaded.config.to_dict() == {**model.config.to_dict(), "_name_or_path": str(directory)}
    shared = loaded.model.shared.weight
    for tied in (loaded.model.encoder.embed_tokens.weight, loaded.model.decoder.embed_tokens.weight, loaded.lm_head.weight):
        assert tied is shared
    for key, value in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    with torch.no_grad():
        expected, actual = model(**batch), loaded(**batch)
    assert torch.equal(actual.logits, expected.logits)
    assert torch.equal(actual.loss, expected.loss)
    generate_kwargs = dict(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=3,
                           max_new_tokens=6)
    assert torch.equal(loaded.generate(**generate_kwargs), model.generate(**generate_kwargs))
    return loaded


def assert_every_parameter_gets_a_gradient(model, batch: dict) -> dict[str, torch.Tensor]:
    """One training-mode loss on `batch` gives every parameter a finite gradient that is not all zero. Returns the
    gradients by name."""
    model.train().zero_grad(set_to_none=True)
    loss = model(**batch).loss
    assert torch.isfinite(loss)
    loss.backward()
    gradients = {}
    for name, param in model.named_parameters():
        assert param.grad is not None, f"no gradient reached {name}"
        assert torch.isfinite(param.grad).all(), f"non-finite gradient in {name}"
        assert param.grad.abs().sum() > 0, f"zero gradient in {name}"
        gradients[name] = param.grad
    return gradients


# --------------------------------------------------------------------------------------------- generation
def _decode_loop(model, source: dict, max_new_tokens: int, process: Callable[[torch.Tensor], torch.Tensor],
                 pick: Callable[[torch.Tensor], torch.Tensor]):
    """Step-by-step decoding over full forward passes (no cache): at each step the prefix's last logits, processed by
    `process`, give the next tokens through `pick`; finished rows continue with the pad id, and decoding stops when
    every row has produced EOS. Returns the sequences and the processed logits of every step."""
    config = model.generation_config
    batch = source["input_ids"].shape[0]
    sequences = torch.full((batch, 1), config.decoder_start_token_id, dtype=torch.long)
    finished = torch.zeros(batch, dtype=torch.bool)
    scores = []
    for _ in range(max_new_tokens):
        with torch.no_grad():
            logits = model(**source, decoder_input_ids=sequences, use_cache=False).logits[:, -1].float()
        scores.append(process(logits))
        tokens = pick(scores[-1]).masked_fill(finished, config.pad_token_id)
        sequences = torch.cat([sequences, tokens[:, None]], dim=1)
        finished |= tokens == config.eos_token_id
        if finished.all():
            break
    return sequences, scores


def reference_greedy(model, source: dict, max_new_tokens: int):
    """Greedy search written out: at every step the argmax of the full forward pass over the prefix. Returns the
    sequences and each step's logits."""
    return _decode_loop(model, source, max_new_tokens, lambda logits: logits, lambda scores: scores.argmax(-1))


def reference_sample(model, source: dict, max_new_tokens: int, top_k: int, seed: int, num_return_sequences: int = 1):
    """Multinomial sampling written out from `torch.manual_seed(seed)`: each row's next token is drawn from
    softmax(logits) restricted to its `top_k` largest logits (0: all), one `torch.multinomial` call per step for the
    whole batch (rows repeated `num_return_sequences` times, as `generate` does). Returns the sequences and each
    step's logits with the ones outside the top k at -inf."""
    source = {key: value.repeat_interleave(num_return_sequences, dim=0) for key, value in source.items()}

    def keep_top_k(logits):
        if not top_k:
            return logits
        kth_largest = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
        return logits.masked_fill(logits < kth_largest, float("-inf"))

    torch.manual_seed(seed)
    return _decode_loop(
        model, source, max_new_tokens, keep_top_k, lambda scores: torch.multinomial(scores.softmax(-1), 1)[:, 0]
    )


def assert_same_decoding(output, reference) -> None:
    """`generate(..., output_scores=True, return_dict_in_generate=True)` against a reference decode: the same tokens
    and, step by step, the same (processed) logits, so that the check is decisive even where the argmax repeats."""
    sequences, scores = reference
    assert output.sequences.tolist() == sequences.tolist()
    assert len(output.scores) == len(scores)
    for step, (ours, theirs) in enumerate(zip(output.scores, scores)):
        torch.testing.assert_close(ours.float(), theirs, atol=1e-5, rtol=1e-5, msg=f"step {step}")


def assert_beam_scores_match_full_forward(model, source: dict, output, length_penalty: float) -> None:
    """Each returned beam hypothesis scores what a full forward pass gives it: the sum of its tokens' log-probabilities
    (up to and including EOS) divided by its length ** length_penalty (transformers' beam score)."""
    config = model.generation_config
    sequences = output.sequences
    with torch.no_grad():
        log_probs = model(**source, decoder_input_ids=sequences[:, :-1], use_cache=False).logits.float().log_softmax(-1)
    for row in range(sequences.shape[0]):
        tokens = sequences[row, 1:].tolist()
        length = tokens.index(config.eos_token_id) + 1 if config.eos_token_id in tokens else len(tokens)
        total = sum(log_probs[row, t, tokens[t]] for t in range(length))
        expected = total / length**length_penalty
        torch.testing.assert_close(output.sequences_scores[row], expected, atol=1e-5, rtol=0, msg=f"row {row}")


def assert_generate_matches_references(model, source: dict, max_new_tokens: int = 5, top_k: int = 5, seed: int = 0,
                                       num_return_sequences: int = 1):
    """`generate()` against the references above: greedy search decodes as `reference_greedy` (tokens and logits);
    beam search (4 beams) returns hypotheses scored as a full forward pass scores them; sampling from a fixed seed
    draws exactly what `reference_sample` draws, and not only the greedy tokens. Returns the three sequence tensors."""
    dict_output = dict(output_scores=True, return_dict_in_generate=True)
    greedy = model.generate(**source, max_new_tokens=max_new_tokens, **dict_output)
    assert_same_decoding(greedy, reference_greedy(model, source, max_new_tokens))
    beam = model.generate(**source, num_beams=4, max_new_tokens=max_new_tokens, length_penalty=0.8, **dict_output)
    assert_beam_scores_match_full_forward(model, source, beam, length_penalty=0.8)
    torch.manual_seed(seed)
    sampled = model.generate(
        **source, do_sample=True, top_k=top_k, max_new_tokens=max_new_tokens,
        num_return_sequences=num_return_sequences, **dict_output,
    )
    assert_same_decoding(sampled, reference_sample(model, source, max_new_tokens, top_k, seed, num_return_sequences))
    assert sampled.sequences.tolist() != greedy.sequences.repeat_interleave(num_return_sequences, dim=0).tolist()
    return greedy.sequences, beam.sequences, sampled.sequences


# --------------------------------------------------------------------------------------------- training
def copy_task_rows(vocab_size: int, count: int = 4, seed: int = 7, first_token_id: int = 4, eos_token_id: int = 2):
    """`count` copy-task examples of lengths 4, 5, ..., each ending in EOS (source = labels)."""
    generator = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(count):
        tokens = torch.randint(first_token_id, vocab_size, (3 + i,), generator=generator).tolist() + [eos_token_id]
        rows.append({"input_ids": tokens, "labels": tokens})
    return rows


def collate_rows(features, pad_token_id: int = 1) -> dict:
    """Right-pad sources with the pad id (and mask them) and labels with -100."""
    from torch.nn.utils.rnn import pad_sequence

    input_ids = pad_sequence([torch.tensor(f["input_ids"]) for f in features], batch_first=True, padding_value=pad_token_id)
    labels = pad_sequence([torch.tensor(f["labels"]) for f in features], batch_first=True, padding_value=-100)
    return {"input_ids": input_ids, "attention_mask": input_ids.ne(pad_token_id).long(), "labels": labels}


def assert_trainer_step_is_hand_computed(model, rows: list[dict], output_dir, collate=collate_rows,
                                         learning_rate: float = 0.05, accumulation_steps: int = 1):
    """One `LayerFusionSeq2SeqTrainer` step (SGD, constant learning rate, no gradient clipping: clipping would hide a
    wrongly scaled loss) on one batch holding every row (`accumulation_steps` micro-batches of them, accumulated),
    against the step computed here on a copy of the model: every parameter moves by `-lr * g`, g the gradient of the
    model's own loss on the collated batch of all rows, and the loss on that batch goes down. Returns the trainer and
    the reference gradients by parameter name (None where the loss does not reach a parameter)."""
    from datasets import Dataset
    from transformers import Seq2SeqTrainingArguments

    from hf_layerfusion.training.trainer import LayerFusionSeq2SeqTrainer

    args = Seq2SeqTrainingArguments(
        output_dir=str(output_dir), per_device_train_batch_size=len(rows) // accumulation_steps,
        gradient_accumulation_steps=accumulation_steps, max_steps=1, optim="sgd",
        learning_rate=learning_rate, lr_scheduler_type="constant", max_grad_norm=0.0, logging_steps=1, save_strategy="no",
        report_to="none", disable_tqdm=True, use_cpu=True,
    )
    trainer = LayerFusionSeq2SeqTrainer(
        model=model, args=args, data_collator=collate, train_dataset=Dataset.from_list(rows)
    )
    reference = copy.deepcopy(model).train()  # after the trainer set it up (label smoothing moved to the config)
    batch = collate(rows)
    loss_before = reference(**batch).loss
    loss_before.backward()
    named = dict(reference.named_parameters())  # tied / shared parameters once
    gradients = {name: p.grad for name, p in named.items()}
    trainer.train()
    assert trainer.state.global_step == 1
    moved = dict(model.named_parameters())
    assert moved.keys() == named.keys()
    for name, param in named.items():
        expected = param if gradients[name] is None else param - learning_rate * gradients[name]
        torch.testing.assert_close(moved[name], expected, atol=1e-6, rtol=1e-5, msg=lambda m, name=name: f"{name}: {m}")
    with torch.no_grad():
        assert model.train()(**batch).loss < loss_before
    return trainer, gradients


# --------------------------------------------------------------------------------------------- processes
def fake_package_versions(versions: dict[str, str | None]) -> str:
    """Code that makes `importlib.metadata` report these versions (None: not installed) to everything run after it."""
    return (
        "import importlib.metadata as metadata\n"
        "real_version = metadata.version\n"
        f"fake = {versions!r}\n"
        "def version(name):\n"
        "    if name not in fake:\n"
        "        return real_version(name)\n"
        "    if fake[name] is None:\n"
        "        raise metadata.PackageNotFoundError(name)\n"
        "    return fake[name]\n"
        "metadata.version = version\n"
    )


def run_python(arguments: list[str], env_updates: dict, cwd: Path) -> subprocess.CompletedProcess:
    """`python <arguments>` in a fresh process without this session's Hub settings and `PYTHONPATH` (so that only the
    installed packages are importable; `env_updates={"PYTHONPATH": str(REPO_ROOT)}` gives it this checkout's package),
    one thread (a value of None in `env_updates` removes that variable); a non-zero exit fails the test with the
    process's output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_", "PYTHONPATH"))}
    env.update(HF_HUB_DISABLE_TELEMETRY="1", HF_HUB_DISABLE_PROGRESS_BARS="1", OMP_NUM_THREADS="1", **env_updates)
    env = {name: value for name, value in env.items() if value is not None}
    result = subprocess.run([sys.executable, *arguments], env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{arguments[:2]} failed:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    return result


def without_package_preamble() -> str:
    """The first lines of a script run with `python -S` (`run_python(["-S", "-c", script], ...)`): this process's
    site-packages folders on the path, in order (a virtual environment's own, then the system's when it sees them: the
    transformers-range check's environments), without their .pth files, which hold the editable install's import hook,
    so that hf_layerfusion cannot be imported (asserted) and a model can only load through the Hub code it carries."""
    site_packages = [path for path in sys.path if Path(path).name == "site-packages"] or [sysconfig.get_paths()["purelib"]]
    return (
        f"import sys\nsys.path.extend({site_packages!r})\n"
        "try:\n    import hf_layerfusion\nexcept ModuleNotFoundError:\n    pass\n"
        "else:\n    raise SystemExit('hf_layerfusion is importable in the process without the package')\n"
    )


def one_call_applies(engine) -> bool:
    """Whether an inference copy's decoder layers run a step in one compiled call: every decoder sub-layer's block
    has a bound decoding step, and the stack has no connection or one that changes the embeddings alone."""
    from hf_layerfusion.inference.inference_copies import KernelResidualSublayer

    connection = engine.get_decoder().connection
    blocks = [module for module in engine.get_decoder().modules() if isinstance(module, KernelResidualSublayer)]
    return (connection is None or connection.changes_only_embeddings()) and all(
        block.decoding_step is not None for block in blocks
    )


def varied_gtrans():
    """(model, tokenizer, sources): a tiny GTrans in eval mode with a unigram tokenizer of English words (on which
    transformers' stop-string matching works) and weights drawn wide (N(0, 0.5)), so that its outputs vary from token
    to token and from row to row, as a trained model's do: where a setting changes a decision, they show it."""
    sources = ["the cat sits on the mat", "a dog runs in the park", "two birds fly over the house", "a",
               "the mat", "a dog runs over the mat in the park"]
    tokenizer = hf_layerfusion.train_joint_tokenizer(sources * 5, vocab_size=40, model="unigram")
    config = hf_layerfusion.GTransConfig(vocab_size=len(tokenizer), d_model=16, encoder_layers=2, decoder_layers=2,
                                         encoder_attention_heads=2, decoder_attention_heads=2, encoder_ffn_dim=32,
                                         decoder_ffn_dim=32, max_position_embeddings=64, encoder_group_size=1,
                                         decoder_group_size=1)
    torch.manual_seed(0)
    model = hf_layerfusion.GTransForConditionalGeneration(config).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() > 1:
                parameter.normal_(0, 0.5)
    return model, tokenizer, sources


def piped_stdin(data: bytes) -> io.TextIOWrapper:
    """`sys.stdin` as Python sets it up for bytes piped in under the C locale: UTF-8 with surrogateescape (bytes that
    are not UTF-8 pass as lone surrogates) and no newline translation (a lone `\\r` stays inside its line)."""
    return io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="surrogateescape", newline="\n")


@contextlib.contextmanager
def stdout_redirected_to(descriptor: int):
    """This process's descriptor 1 pointing where `descriptor` points, as a shell's `>> file` or `| reader` sets it up."""
    saved = os.dup(1)
    os.dup2(descriptor, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def encoded_sources(engine, group: int):
    """The tiny sources' encoder outputs and attention mask, each row repeated `group` times (beams), as `generate()`
    hands them to the decoding loop."""
    source = tiny_sources()
    with torch.inference_mode():
        encoder_outputs = engine.get_encoder()(**source)
    for name in ("last_hidden_state", "layer_memories"):
        value = getattr(encoder_outputs, name, None)
        if value is not None:
            setattr(encoder_outputs, name, value.repeat_interleave(group, dim=0))
    return encoder_outputs, source["attention_mask"].repeat_interleave(group, dim=0)


def decoder_logits(engine, group: int, tokens: torch.Tensor, compile_layers=None) -> list[torch.Tensor]:
    """The logits of `DecoderSteps` at each step of `tokens` `(steps, rows)`, rows = sources x `group` (beams)."""
    from hf_layerfusion.inference.decoding import DecoderSteps

    encoder_outputs, mask = encoded_sources(engine, group)
    with torch.inference_mode():
        steps = DecoderSteps(engine, encoder_outputs, mask, capacity=tokens.shape[0], decoder_groups=None, group=group,
                             compile_layers=compile_layers)
        return [steps.logits(step_tokens) for step_tokens in tokens]
