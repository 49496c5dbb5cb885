"""The C++ CPU kernels of the inference copies (`kernels/`): `float32_linear` (`Float32Linear`) and `int8_linear`
(`Int8Linear`), both called through `KernelLinear` (a layer's weights, bound once), `add_layer_norm`
(`KernelResidualSublayer`), `mixture_log_probs` (GTrans' output mixture) and the sub-layer decoding steps
`self_attention_step`, `cross_attention_step`, `feed_forward_step` (`KernelResidualSublayer.run`), all used in
inference_copies.py, `decode_attention` (the copies' attention at decoding steps, decoding_attention.py),
`first_argmax` (greedy search's choice) and `beam_top_k` (beam search's, search.py), and `move_rows` (beam search's
cache reorder, decoding.py), compiled into one extension module at first use."""

from __future__ import annotations

import functools
import os
import shutil
import sys
import warnings
from pathlib import Path

KERNEL_DIRECTORY = "kernels"  # beside this file
KERNEL_SOURCES = (
    "float32_linear.cpp", "int8_linear.cpp", "decode_attention.cpp", "mixture_log_probs.cpp", "layer_norm.cpp",
    "kernel_linear.cpp", "decoding_step.cpp", "first_argmax.cpp", "beam_top_k.cpp", "move_rows.cpp", "bindings.cpp",
)
# no fused multiply-add where the compiler would choose: the int8 kernel's float arithmetic is `int8_linear_reference`'s,
# bit for bit (the float32 kernel's multiply-adds are explicit)
KERNEL_CFLAGS = ["-O3", "-fno-math-errno", "-ffp-contract=off"]
# `at::parallel_for` is a header template that splits work across threads only where the including code is compiled
# with OpenMP (ATen/Parallel-inl.h: `INTRA_OP_PARALLEL` comes from `_OPENMP`); without it every kernel runs on one
# thread whatever `torch.set_num_threads` says. Linked against libgomp.so.1, the extension shares the OpenMP runtime
# that torch's Linux wheels load (the same soname), so `torch.set_num_threads` governs its threads too.
OPENMP_FLAGS = ["-fopenmp"] if sys.platform.startswith("linux") else []


@functools.cache
def compiled_kernels():
    """The extension module of the C++ kernels, compiled for this machine at first use (about 30 s, then cached by
    torch in its extensions folder, `TORCH_EXTENSIONS_DIR`), or None, after a warning that names the reason, where it
    cannot be built (no C++ compiler or ninja; the Hub code, which does not carry the C++ sources): float32 inference
    then runs the model itself (`F.linear`, SDPA), int8 layers run `int8_linear_reference` (the same numbers,
    slower) and attention runs SDPA."""
    fallback = (
        "float32 inference runs the model's own layers, int8 layers compute the same numbers with torch operations "
        "and attention runs SDPA, slower"
    )
    directory = Path(__file__).parent / KERNEL_DIRECTORY
    sources = [directory / name for name in KERNEL_SOURCES]
    missing = [str(source) for source in sources if not source.is_file()]
    if missing:
        warnings.warn(
            f"hf_layerfusion: the CPU kernels' source {', '.join(missing)} is not there (this code runs outside the "
            f"installed package, e.g. as a model's Hub code); {fallback}. `pip install hf_layerfusion` for the "
            f"kernels.",
            stacklevel=2,
        )
        return None
    # the `ninja` wheel installs its binary next to the interpreter, which is not on PATH when the environment is not
    # activated; torch looks for it on PATH
    interpreter_bin = os.path.dirname(sys.executable)
    if shutil.which("ninja") is None and shutil.which("ninja", path=interpreter_bin) is not None:
        os.environ["PATH"] = os.pathsep.join([interpreter_bin, os.environ.get("PATH", "")])
    try:
        from torch.utils.cpp_extension import load

        return load(
            name="hf_layerfusion_cpu_kernels",
            sources=[str(source) for source in sources],
            extra_cflags=KERNEL_CFLAGS + OPENMP_FLAGS,
            extra_ldflags=OPENMP_FLAGS,
            extra_include_paths=[str(directory)],
        )
    except Exception as error:  # a missing compiler or ninja shows as OSError, RuntimeError or CalledProcessError
        warnings.warn(
            f"hf_layerfusion: the CPU kernels ({', '.join(KERNEL_SOURCES)}) could not be compiled "
            f"({type(error).__name__}: {str(error).strip()[:500]}); {fallback}. They need a C++ compiler and ninja "
            f"(`pip install ninja`).",
            stacklevel=2,
        )
        return None
