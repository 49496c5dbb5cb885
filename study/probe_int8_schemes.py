"""What an int8 scheme costs in translation, before a kernel is written for it (issue 39, item 4).

The compiled products exist for two formats (`hf_layerfusion.inference.inference_copies.ACTIVATION_CODES` and
`WEIGHT_CODE_MAX`): 8 bits (activation codes over 256 steps, weights in [-127, 127]; AMX, AVX-512 VNNI) and 7 bits
(activation codes [0, 127], weights [-63, 63]; AVX2's `vpmaddubsw`). This probe simulates any scheme of that family in
float32 torch operations, every `nn.Linear` of the model and its output projection a `SimulatedInt8Linear` (each
row's activations on `2^bits - 1` steps with its own scale and zero point, as `Int8Linear` quantizes them; each
output feature's weights rounded to `[-weight_max, weight_max]`), and translates the test set with `generate()`: BLEU,
its cost against float32, and how many translations stay float32's. For the two formats that exist, the simulation
computes `int8_linear_reference`'s numbers to float rounding (tests/test_inference_benchmarks.py), so its counts are
those of the kernels' arithmetic; for the others it answers "would this format be worth a kernel?".

    python -m study.probe_int8_schemes runs/study/runs/steps_2000_warmup_1000/plain_transformer/seed_2
    python -m study.probe_int8_schemes RUN_DIR --schemes 8:127 7:63 7:127 8:63 --num-beams 4 --sentences 500
"""

from __future__ import annotations

import argparse
import math
import platform
import shlex
import sys
import time
from pathlib import Path

import torch
from torch import nn

from study.common import DEFAULT_DATA

DEFAULT_SCHEMES = ("8:127", "7:63", "7:127", "8:63")  # the two formats, then each with the other's weights


class SimulatedInt8Linear(nn.Module):
    """`x W^T + b` with `weight` rounded per output feature to the codes [-weight_max, weight_max] (symmetric, as
    `Int8Linear`) and each input row quantized on the fly with its own scale and zero point onto `2^activation_bits
    - 1` steps over [min(x, 0), max(x, 0)] (round half to even), computed in float32: the scheme, not its exact
    integer arithmetic."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, activation_bits: int, weight_max: int):
        super().__init__()
        weight = weight.detach().float()
        scale = weight.abs().amax(dim=1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny) / weight_max
        self.register_buffer("weight", torch.round(weight / scale) * scale)
        self.register_buffer("bias", None if bias is None else bias.detach().float())
        self.steps = 2**activation_bits - 1

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        low = hidden_states.amin(dim=-1, keepdim=True).clamp_max(0)
        high = hidden_states.amax(dim=-1, keepdim=True).clamp_min(0)
        inverse = self.steps / (high - low).clamp_min(1e-30)  # the kernel's kMinimumSpan
        zero = torch.round(-low * inverse)
        codes = torch.clamp(torch.round(hidden_states * inverse) + zero, 0, self.steps)
        return nn.functional.linear((codes - zero) / inverse, self.weight, self.bias)


def parse_scheme(text: str) -> tuple[int, int]:
    """"BITS:WEIGHT_MAX" -> (activation bits, largest weight code), e.g. "7:127"."""
    try:
        bits, weight_max = (int(part) for part in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a scheme is ACTIVATION_BITS:WEIGHT_MAX, e.g. 7:127; got {text!r}") from None
    if not 2 <= bits <= 8 or not 1 <= weight_max <= 127:
        raise argparse.ArgumentTypeError(f"activation bits must lie in [2, 8] and the largest weight code in [1, 127]; "
                                         f"got {text!r}")
    return bits, weight_max


def simulated_copy(model_dir: Path, activation_bits: int, weight_max: int) -> nn.Module:
    """The model of `model_dir` with every `nn.Linear` of its encoder-decoder a `SimulatedInt8Linear`, and its output
    projection (`project`: `lm_head`'s weight and `final_logits_bias`) one through the output head's declared hook,
    `set_output_kernels`, as the int8 copies quantize it."""
    from transformers import AutoModelForSeq2SeqLM

    model = AutoModelForSeq2SeqLM.from_pretrained(model_dir).eval()
    for module in list(model.model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Linear:
                setattr(module, name, SimulatedInt8Linear(child.weight, child.bias, activation_bits, weight_max))
    model.set_output_kernels(projection=SimulatedInt8Linear(
        model.lm_head.weight, model.final_logits_bias[0], activation_bits, weight_max))
    return model


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", type=Path, help="a trained model (e.g. a study run directory)")
    parser.add_argument("--schemes", nargs="+", type=parse_scheme, default=[parse_scheme(s) for s in DEFAULT_SCHEMES],
                        metavar="BITS:WEIGHT_MAX", help=f"schemes to simulate (default: {' '.join(DEFAULT_SCHEMES)})")
    parser.add_argument("--num-beams", type=int, default=1)
    parser.add_argument("--sentences", type=int, default=1000, help="the first N Multi30k test sentences")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the Multi30k folder (test_2016_flickr.en/de)")
    args = parser.parse_args(argv)
    if args.num_beams < 1 or args.sentences < 1:
        parser.error(f"--num-beams and --sentences must be positive; got {args.num_beams} and {args.sentences}")
    if not (args.model_dir / "config.json").is_file():
        parser.error(f"{args.model_dir} holds no config.json: give a trained model's folder")
    for name in ("test_2016_flickr.en", "test_2016_flickr.de"):
        if not (args.data / name).is_file():
            parser.error(f"{args.data / name} not found: give the Multi30k folder with --data")
    return args


def translations(args: argparse.Namespace, sources: list[str]) -> dict:
    """`{"float32": texts, (activation_bits, weight_max): texts}`: `generate()` of the model, then of its simulated
    copy in each scheme of `args.schemes`."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    import hf_layerfusion

    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)

    def translate(model):
        return hf_layerfusion.translate(model, tokenizer, sources, num_beams=args.num_beams, fast=False)

    texts = {"float32": translate(AutoModelForSeq2SeqLM.from_pretrained(args.model_dir).eval())}
    for bits, weight_max in args.schemes:
        texts[bits, weight_max] = translate(simulated_copy(args.model_dir, bits, weight_max))
    return texts


def main(argv=None) -> None:
    args = parse_args(argv)
    import transformers

    import hf_layerfusion
    from hf_layerfusion.translation.bleu import corpus_bleu
    from study import bench_backbone as backbone

    torch.set_num_threads(1)
    started = time.perf_counter()
    sources = (args.data / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()[: args.sentences]
    references = (args.data / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()[: args.sentences]
    print("## int8 schemes simulated in float32 (issue 39, item 4)\n")
    print(f"- command (from the repository root): `python -m study.probe_int8_schemes "
          f"{shlex.join(sys.argv[1:] if argv is None else argv)}`")
    print(f"- torch {torch.__version__}, transformers {transformers.__version__}, hf_layerfusion "
          f"{hf_layerfusion.__version__} (git {backbone.git_revision()}), Python {platform.python_version()}")
    print(f"- CPU: {backbone.cpu_model()}, 1 thread; {args.model_dir}, Multi30k test, {len(sources)} sentences, "
          f"{'greedy' if args.num_beams == 1 else f'beam {args.num_beams}'}, `generate()`\n")
    texts = translations(args, sources)
    float32 = texts.pop("float32")
    float32_bleu = corpus_bleu(float32, references)[0]
    print("| scheme | activation steps | weight codes | BLEU | cost (float32 minus scheme) | translations identical "
          "to float32 |")
    print("|---|---|---|---|---|---|")
    print(f"| float32 | – | – | {float32_bleu:.2f} | – | – |")
    for (bits, weight_max), scheme_texts in texts.items():
        bleu = corpus_bleu(scheme_texts, references)[0]
        same = sum(a == b for a, b in zip(scheme_texts, float32))
        print(f"| {bits}-bit activations, weights [-{weight_max}, {weight_max}] | {2**bits - 1} | "
              f"{2 * weight_max + 1} | {bleu:.2f} | {float32_bleu - bleu:.3f} | {same}/{len(scheme_texts)} |")
    print(f"\n(total wall time {math.ceil(time.perf_counter() - started)}s)")


if __name__ == "__main__":
    main()
