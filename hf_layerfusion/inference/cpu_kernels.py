"""The C++ CPU kernels of the inference copies (`kernels/`): `float32_linear` (`Float32Linear`) and `int8_linear`
(`Int8Linear`), both called through `KernelLinear` (a layer's weights, bound once), `add_layer_norm`
(`KernelResidualSublayer`), `mixture_log_probs` (GTrans' output mixture) and the sub-layer decoding steps
`self_attention_step`, `cross_attention_step`, `feed_forward_step` (`KernelResidualSublayer.run`) and all of a
decoder's layers at a step in one call (`DecoderLayerSteps`, `CompiledDecoderLayers`), all used in inference_copies.py, `decode_attention` (the copies' attention at decoding steps, decoding_attention.py),
`first_argmax` and `greedy_choice` (greedy search's choice and the rest of its step), `beam_top_k` and
`beam_top_k_continuations` (beam search's, search.py), and `move_rows` (beam search's cache reorder, decoding.py),
compiled into one extension module.

The module is built once per machine and source hash: its build directory is named by a hash of everything the
build depends on (`kernel_build_key`: the sources, the flags, torch, the Python ABI, the machine type), under the
torch extensions root (`TORCH_EXTENSIONS_DIR`, else torch's per-user default, `~/.cache/torch_extensions`), so that
every checkout or installation of the same sources finds the same build, and two versions of the sources never
share one. `python -m hf_layerfusion.inference.build` builds it ahead; otherwise the first fast translation of a
process builds it, after one line saying so, then lines of its progress. A library is checked against its build's
record before it is loaded, and a forced build replaces the build only once it is built.

The kernels pick their instructions when they run: the widest the CPU has, up to a cap (kernels/instruction_sets.h):
`HF_LAYERFUSION_MAX_CPU_ISA` (one of `INSTRUCTION_SETS`), read when the module loads, or `limit_instruction_set`. On
one machine it runs the code paths of narrower CPUs, to test them all and to time an AVX2 CPU's path on an AVX-512 one
(as CTranslate2's `CT2_FORCE_CPU_ISA`)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import platform
import shutil
import struct
import sys
import sysconfig
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.utils import logging

kernel_build_logger = logging.get_logger(__name__)

KERNEL_DIRECTORY = "kernels"  # beside this file
KERNEL_SOURCES = (
    "float32_linear.cpp", "int8_linear.cpp", "decode_attention.cpp", "mixture_log_probs.cpp", "layer_norm.cpp",
    "kernel_linear.cpp", "decoding_step.cpp", "first_argmax.cpp", "beam_top_k.cpp", "beam_finish_step.cpp",
    "move_rows.cpp", "bindings.cpp",
)
# no fused multiply-add where the compiler would choose: the int8 kernel's float arithmetic is `int8_linear_reference`'s,
# bit for bit (the float32 kernel's multiply-adds are explicit)
KERNEL_CFLAGS = ("-O3", "-fno-math-errno", "-ffp-contract=off")
# `at::parallel_for` is a header template that splits work across threads only where the including code is compiled
# with OpenMP (ATen/Parallel-inl.h: `INTRA_OP_PARALLEL` comes from `_OPENMP`); without it every kernel runs on one
# thread whatever `torch.set_num_threads` says. Linked against libgomp.so.1, the extension shares the OpenMP runtime
# that torch's Linux wheels load (the same soname), so `torch.set_num_threads` governs its threads too.
OPENMP_FLAGS = ("-fopenmp",) if sys.platform.startswith("linux") else ()
KERNEL_EXTENSION = "hf_layerfusion_cpu_kernels"  # the module's name and build directory's, before the key
BUILD_RECORD = "build.json"  # in the build directory, written once the module is built and loaded
# a forced build compiles into `<directory>.new` and, once built, swaps it for `<directory>` (moved to `.old`, removed)
FORCED_BUILD_SUFFIX, REPLACED_BUILD_SUFFIX = ".new", ".old"
ELF_SECTION_WITHOUT_CONTENT = 8  # SHT_NOBITS (.bss): a section that takes no bytes of the file
# the kernels' instruction sets, narrowest first (kernels/instruction_sets.h's `InstructionSet`, whose values are the
# indices): "generic" runs no x86 vector extension chosen at run time, "avx2" AVX2 (with FMA for float), "avx512"
# AVX-512 (with VNNI for int8 where the CPU has it), "amx" everything, AMX tiles included (no cap)
INSTRUCTION_SETS = ("generic", "avx2", "avx512", "amx")
MAX_CPU_ISA_VARIABLE = "HF_LAYERFUSION_MAX_CPU_ISA"
# compiler CPU seconds (user + system) on an AMD EPYC (Zen 4) since each source includes only the ATen headers it uses
# (kernels/cpu_kernels.h): the longest source, bindings.cpp (pybind11's casters), ~15 s, and the whole build, ~90 s
# (~360 s before, with <torch/extension.h> in every source); ninja compiles one source per core at once, so a build on
# idle cores takes about max(longest, total / cores), and longer on busy ones
COMPILE_SECONDS_ONE_CORE = (15.0, 90.0)  # (longest source, all sources)
# while compiling: how often the build folder is looked at, and the longest silence between two progress lines
PROGRESS_POLL_SECONDS, PROGRESS_QUIET_SECONDS = 1.0, 60.0


@dataclass
class KernelBuild:
    """The compiled kernels and where they live (`library`: the file in `directory`); `seconds`: this process's
    build, or the recorded one if found."""

    module: object
    directory: Path
    library: Path
    built: bool
    seconds: float


def kernel_sources(directory: Path) -> dict[str, bytes]:
    """The contents of every file the build reads: the sources it compiles and the headers they include."""
    headers = sorted(path.name for path in directory.glob("*.h"))
    return {name: (directory / name).read_bytes() for name in (*KERNEL_SOURCES, *headers)}


def machine_type() -> str:
    """The processor architecture and its vector instruction sets (x86's `flags`, Arm's `Features` in
    /proc/cpuinfo): the kernels pick their instructions at run time, but a cache in a home directory that different
    machines share (a cluster's) should hold one build per machine type, each made on a machine of that type."""
    features = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            label, _, value = line.partition(":")
            if label.strip() in ("flags", "Features"):
                # only the instruction sets: `flags` also lists kernel mitigations that a kernel update changes
                vector_sets = ("avx", "amx", "fma", "sse", "f16c", "asimd", "sve")
                features = " ".join(sorted(flag for flag in value.split() if flag.startswith(vector_sets)))
                break
    return f"{platform.machine()} {features}".strip()


def kernel_build_key(sources: dict[str, bytes]) -> str:
    """16 hex digits of a hash of everything the compiled module depends on: the sources (not where they are), the
    compiler flags, the torch release (its headers and ABI), the Python ABI and the machine type."""
    digest = hashlib.sha256()
    for name in sorted(sources):
        digest.update(f"{name}\0{len(sources[name])}\0".encode())
        digest.update(sources[name])
    digest.update(
        json.dumps(
            [KERNEL_CFLAGS, OPENMP_FLAGS, torch.__version__, torch.version.git_version,
             sysconfig.get_config_var("EXT_SUFFIX"), machine_type()]
        ).encode()
    )
    return digest.hexdigest()[:16]


def kernel_cache_root() -> Path:
    """Where builds live: `TORCH_EXTENSIONS_DIR` if set, else torch's per-user extensions folder."""
    from torch.utils.cpp_extension import get_default_build_root

    return Path(os.environ.get("TORCH_EXTENSIONS_DIR") or get_default_build_root())


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def busy_machine_note(build_jobs: int = 0) -> str:
    """", the machine is busy (load average 5.2 on 2 cores)" where more processes want the cores than there are
    (besides the build's own `build_jobs` compilers), else "": a build there takes several times its estimate."""
    if not hasattr(os, "getloadavg"):
        return ""
    load, cores = os.getloadavg()[0], usable_cores()
    if load <= cores + build_jobs:
        return ""
    return f", the machine is busy (load average {load:.1f} on {cores} core{'s' if cores > 1 else ''})"


def build_time_estimate() -> str:
    """What a build takes on this machine's cores, in words ("about 45 s on 2 idle cores"), and whether they are
    busy now: busy ones take longer, by how much the estimate cannot know."""
    cores = usable_cores()
    longest, total = COMPILE_SECONDS_ONE_CORE
    seconds = max(longest, total / cores)
    duration = f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"
    return f"about {duration} on {cores} idle core{'s' if cores > 1 else ''}{busy_machine_note()}"


def import_extension(name: str, library: Path):
    """Imports a built extension module (what torch's loader does once it has built one)."""
    spec = importlib.util.spec_from_file_location(name, library)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def elf_library_cut_short(library: Path) -> bool:
    """Whether `library` is not a whole 64-bit ELF file: shorter than its header, its section header table or the
    contents of any of its sections say (a copy or a write cut short; a library patched after linking can keep
    sections after the table)."""
    content = library.read_bytes()
    if len(content) < 64 or content[:4] != b"\x7fELF" or content[4] != 2:  # 2: 64-bit, as every torch wheel
        return True
    order = "<" if content[5] == 1 else ">"
    (table,) = struct.unpack_from(order + "Q", content, 0x28)  # e_shoff
    entry_size, entries = struct.unpack_from(order + "HH", content, 0x3A)  # e_shentsize, e_shnum
    if len(content) < table + entry_size * entries:
        return True
    for header in range(table, table + entry_size * entries, entry_size):
        (kind,) = struct.unpack_from(order + "I", content, header + 4)  # sh_type
        offset, size = struct.unpack_from(order + "QQ", content, header + 0x18)  # sh_offset, sh_size
        if kind != ELF_SECTION_WITHOUT_CONTENT and len(content) < offset + size:
            return True
    return False


def library_fault(library: Path, record: dict) -> str | None:
    """How `library` differs from what its build wrote (`record`'s size and sha256), None where it does not."""
    if not library.is_file():
        return f"{library.name} is missing"
    if "library_sha256" not in record:
        # recorded before builds recorded their library's size and checksum: on Linux, at least not cut short
        cut_short = sys.platform.startswith("linux") and elf_library_cut_short(library)
        return f"{library.name} is cut short" if cut_short else None
    size = library.stat().st_size
    if size != record["library_bytes"]:
        return f"{library.name} holds {size} bytes, its build wrote {record['library_bytes']}"
    if file_sha256(library) != record["library_sha256"]:
        return f"{library.name} is not the file its build wrote (another sha256)"
    return None


def finished_build(directory: Path, *, say_if_damaged: bool = False) -> KernelBuild | None:
    """The module of a finished build in `directory` (its record names the library), or None if there is none or it
    is damaged: the library is checked against its record before it is loaded, since loading one cut short or
    altered kills the process ("Bus error", no Python error). `say_if_damaged`: warn naming the damage."""
    record_path = directory / BUILD_RECORD
    if not record_path.is_file():
        return None
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        library = directory / record["library"]
        fault = library_fault(library, record)
    except (ValueError, KeyError, TypeError) as error:  # a record cut short or not a record
        fault = f"its record {BUILD_RECORD} is unreadable ({type(error).__name__}: {error})"
    if fault is not None:
        if say_if_damaged:
            warnings.warn(
                f"hf_layerfusion: the CPU kernels built in {directory} are damaged ({fault}), so they are not "
                f"loaded but built again.",
                stacklevel=3,
            )
        return None
    module = import_extension(record["module"], library)
    return KernelBuild(module, directory, library, built=False, seconds=record["seconds"])


def write_build_record(library: Path, module, seconds: float, source_directory: Path) -> None:
    """Records a finished build beside its `library`, with the library's size and sha256 (checked before every
    load)."""
    record = {
        "module": module.__name__,
        "library": library.name,
        "library_bytes": library.stat().st_size,
        "library_sha256": file_sha256(library),
        "seconds": round(seconds, 1),
        "built_from": str(source_directory),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "machine": machine_type(),
    }
    # written whole and then renamed: a process reading it sees no record or a complete one
    partial = library.parent / f"{BUILD_RECORD}.{os.getpid()}"
    partial.write_text(json.dumps(record, indent=1), encoding="utf-8")
    os.replace(partial, library.parent / BUILD_RECORD)


def compiled_sources(build_directory: Path) -> int:
    """How many of the sources in `build_directory/sources` have an object file no older than them (what ninja
    counts as compiled)."""
    count = 0
    for source_name in KERNEL_SOURCES:
        source, object_file = build_directory / "sources" / source_name, build_directory / f"{Path(source_name).stem}.o"
        with contextlib.suppress(OSError):
            count += object_file.stat().st_mtime >= source.stat().st_mtime
    return count


@contextlib.contextmanager
def compile_progress(build_directory: Path):
    """While the block compiles into `build_directory`, a line each time sources are compiled, and one every
    `PROGRESS_QUIET_SECONDS` while none is: how many of all, the seconds so far and whether the machine is busy (a
    build on busy cores has taken 20 minutes: silence that long looks like a hang)."""
    stop, start = threading.Event(), time.monotonic()

    def report():
        said, said_at = compiled_sources(build_directory), start
        while not stop.wait(PROGRESS_POLL_SECONDS):
            done, now = compiled_sources(build_directory), time.monotonic()
            if done == said and now - said_at < PROGRESS_QUIET_SECONDS:
                continue
            linking = ", linking" if done == len(KERNEL_SOURCES) else ""
            # the build's own compilers fill the cores: busy means more than that
            busy = busy_machine_note(build_jobs=min(usable_cores(), len(KERNEL_SOURCES)))
            kernel_build_logger.warning(
                f"hf_layerfusion: compiling the CPU kernels: {done} of {len(KERNEL_SOURCES)} sources "
                f"compiled{linking}, {now - start:.0f} s so far{busy}"
            )
            said, said_at = done, now

    reporter = threading.Thread(target=report, name="hf_layerfusion kernel build progress", daemon=True)
    reporter.start()
    try:
        yield
    finally:
        stop.set()
        reporter.join()


@contextlib.contextmanager
def build_lock(path: Path):
    """Holds an exclusive lock on `path` (released by the system if the process dies, unlike torch's own lock
    file), saying so once when another process holds it."""
    import fcntl  # POSIX only, as the kernels are (`check_build_tools`, called first)

    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            kernel_build_logger.warning(
                f"hf_layerfusion: waiting for another process that is compiling the CPU kernels into {path.parent} "
                f"({build_time_estimate()} from its start)"
            )
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def check_build_tools() -> None:
    """Raises RuntimeError naming what the build needs and cannot find: a C++ compiler, ninja."""
    if sys.platform == "win32":
        raise RuntimeError("the kernels are written for GCC or Clang on Linux or macOS, not for Windows' compiler")
    compiler = os.environ.get("CXX", "c++")  # what torch's build runs
    if shutil.which(compiler) is None:
        raise RuntimeError(f"no C++ compiler: `{compiler}` is not on PATH (install g++ or clang++, or set CXX)")
    # the `ninja` wheel installs its binary next to the interpreter, which is not on PATH when the environment is not
    # activated; torch looks for it on PATH
    interpreter_bin = os.path.dirname(sys.executable)
    if shutil.which("ninja") is None and shutil.which("ninja", path=interpreter_bin) is not None:
        os.environ["PATH"] = os.pathsep.join([interpreter_bin, os.environ.get("PATH", "")])
    if shutil.which("ninja") is None:
        raise RuntimeError("no `ninja` on PATH (`pip install ninja`)")


def build_kernels(source_directory: Path, *, force: bool = False, implicit: bool = True) -> KernelBuild:
    """The kernels compiled from `source_directory`: the finished build of the same sources on this machine if there
    is one (whoever built it), else built now, once across processes (the others wait for it). `force`: build
    again even if a build exists, beside it (`build_beside`). The build announces itself in one line (the implicit
    one, at a process's first fast translation, with how to do it ahead), then reports its progress. Raises what the
    build raised."""
    sources = kernel_sources(source_directory)
    name = f"{KERNEL_EXTENSION}_{kernel_build_key(sources)}"
    directory = kernel_cache_root() / name
    if not force and (found := finished_build(directory, say_if_damaged=True)) is not None:
        return found
    check_build_tools()
    directory.parent.mkdir(parents=True, exist_ok=True)
    # the lock is beside the build directory, not in it, so that `force` can replace the directory while holding it
    with build_lock(directory.parent / f"{name}.lock"):
        if not force and (found := finished_build(directory)) is not None:  # built by the process we waited for
            return found
        ahead = "; `python -m hf_layerfusion.inference.build` does it ahead" if implicit else ""
        kernel_build_logger.warning(
            f"hf_layerfusion: compiling the CPU kernels for this machine ({build_time_estimate()}, once{ahead}) "
            f"into {directory}"
        )
        if force:
            return build_beside(directory, sources, source_directory)
        return build_into(directory, name, sources, source_directory)


def build_beside(directory: Path, sources: dict[str, bytes], source_directory: Path) -> KernelBuild:
    """Builds the kernels into a new folder beside `directory` and swaps it in only once built: a build that fails
    (a broken compiler) leaves `directory` as it was, its build still loading, instead of deleting it first and
    leaving the next fast translation to compile for minutes. Called under the build lock."""
    staging = directory.with_name(directory.name + FORCED_BUILD_SUFFIX)
    replaced = directory.with_name(directory.name + REPLACED_BUILD_SUFFIX)
    shutil.rmtree(staging, ignore_errors=True)  # what a forced build killed before left: start from nothing, as forced
    try:
        build = build_into(staging, directory.name, sources, source_directory)
    except Exception as error:
        shutil.rmtree(staging, ignore_errors=True)
        kept = " (its build still loads)" if (directory / BUILD_RECORD).is_file() else ""
        raise RuntimeError(
            f"the CPU kernels could not be built again into {staging} ({type(error).__name__}: {error}); "
            f"{directory} is as it was{kept}"
        ) from error
    shutil.rmtree(replaced, ignore_errors=True)
    if directory.exists():
        os.replace(directory, replaced)
    os.replace(staging, directory)
    shutil.rmtree(replaced, ignore_errors=True)
    return KernelBuild(build.module, directory, directory / build.library.name, built=True, seconds=build.seconds)


def build_into(build_directory: Path, name: str, sources: dict[str, bytes], source_directory: Path) -> KernelBuild:
    """Compiles the module `name` from `sources` in `build_directory`, resuming what an interrupted build there left,
    loads it and records it. Called under the build lock."""
    # the build compiles a copy of the sources it hashed, in its own directory: what it builds is what its key
    # says even if the checkout changes meanwhile, and its commands (which name the sources) are the same
    # whichever checkout asked, so that a build interrupted by one is resumed, not restarted, by another
    copies = build_directory / "sources"
    copies.mkdir(parents=True, exist_ok=True)
    for source_name, content in sources.items():
        copy = copies / source_name
        if not copy.is_file() or copy.read_bytes() != content:  # unchanged files keep their time: ninja resumes
            copy.write_bytes(content)
    # torch's own lock file in the build directory: a build killed before removing it makes every later one wait
    # for ever; under our lock no other process builds here, so one that exists is stale
    (build_directory / "lock").unlink(missing_ok=True)
    # a library that no record vouches for (a damaged one, or one an interrupted build may have written in part)
    # is linked again rather than loaded: ninja would take it as up to date
    (build_directory / BUILD_RECORD).unlink(missing_ok=True)
    (build_directory / f"{name}.so").unlink(missing_ok=True)
    from torch.utils.cpp_extension import load

    start = time.perf_counter()
    with compile_progress(build_directory):
        module = load(
            name=name,
            sources=[str(copies / source_name) for source_name in KERNEL_SOURCES],
            # new lists: torch's `load` appends its own flags to the lists it is given, which would change the key
            # (`kernel_build_key` hashes these constants) for the rest of the process and build again
            extra_cflags=[*KERNEL_CFLAGS, *OPENMP_FLAGS],
            extra_ldflags=[*OPENMP_FLAGS],
            extra_include_paths=[str(copies)],
            build_directory=str(build_directory),
        )
    seconds = time.perf_counter() - start
    library = build_directory / Path(module.__file__).name
    write_build_record(library, module, seconds, source_directory)
    return KernelBuild(module, build_directory, library, built=True, seconds=seconds)


def instruction_set_level(name: str, source: str = "instruction_set") -> int:
    """The kernels' level of an instruction set's name (`INSTRUCTION_SETS`, any case); ValueError naming `source` and
    the bad value otherwise."""
    if not isinstance(name, str) or name.strip().lower() not in INSTRUCTION_SETS:
        raise ValueError(f"{source} must be one of {', '.join(INSTRUCTION_SETS)} (the widest instructions the CPU "
                         f"kernels may use), got {name!r}.")
    return INSTRUCTION_SETS.index(name.strip().lower())


def instruction_set_cap_from_environment() -> int | None:
    """The level `HF_LAYERFUSION_MAX_CPU_ISA` asks for, None where it is unset or empty."""
    value = os.environ.get(MAX_CPU_ISA_VARIABLE, "")
    return instruction_set_level(value, MAX_CPU_ISA_VARIABLE) if value.strip() else None


@contextlib.contextmanager
def limit_instruction_set(name: str):
    """Within the block, the CPU kernels use at most the instruction set `name` (`INSTRUCTION_SETS`; the CPU's own
    still bounds them), then the cap before it again. Inference copies made inside keep int8 weights packed for the
    cap's product, which a lower cap later refuses by name. Raises RuntimeError where the kernels are not compiled."""
    level = instruction_set_level(name)
    kernels = compiled_kernels()
    if kernels is None:
        raise RuntimeError("limit_instruction_set: the CPU kernels are not compiled here (see the warning above).")
    before = kernels.max_instruction_set()
    kernels.set_max_instruction_set(level)
    try:
        yield
    finally:
        kernels.set_max_instruction_set(before)


@contextlib.contextmanager
def torch_operators_on_one_thread():
    """Within the block, torch's own CPU operators run on one thread of the calling thread while the kernels keep
    torch's thread count on their pool (`kernels/parallel.h`), then both as before. OpenMP's threads, which torch's
    operators run on, spin for a while after each parallel region under the default wait policy: beside the pool's
    threads they shared the cores (at two threads beam search ran slower than at one). The operators left in a
    decoding step are small (the kernels do the products). Where the kernels use OpenMP's threads themselves
    (`OMP_WAIT_POLICY=ACTIVE`), run on one thread, or are not compiled, the block runs as it is."""
    kernels = compiled_kernels()
    threads = torch.get_num_threads()
    if kernels is None or threads == 1 or kernels.parallel_backend() != "pool":
        yield
        return
    kernels.set_kernel_threads(threads)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        kernels.set_kernel_threads(0)


def instruction_set_summary(kernels) -> str:
    """The kernels' cap in words, for benchmark headers: "" without one."""
    level = kernels.max_instruction_set()
    if level == len(INSTRUCTION_SETS) - 1:
        return ""
    return f"instructions capped at {INSTRUCTION_SETS[level]} ({MAX_CPU_ISA_VARIABLE})"


@functools.cache
def compiled_kernels():
    """The extension module of the C++ kernels (`build_kernels`: found, or compiled for this machine the first time
    any process asks), or None, after a warning that names the reason, where it cannot be built (no C++ compiler or
    ninja; the Hub code, which does not carry the C++ sources): float32 inference then runs the model itself
    (`F.linear`, SDPA), int8 layers run `int8_linear_reference` (the same numbers, slower) and attention runs SDPA.
    The cap of `HF_LAYERFUSION_MAX_CPU_ISA` is applied when the module loads (a bad value: ValueError, before any
    build)."""
    fallback = (
        "float32 inference runs the model's own layers, int8 layers compute the same numbers with torch operations "
        "and attention runs SDPA, slower"
    )
    cap = instruction_set_cap_from_environment()  # a bad value is refused before any build
    directory = Path(__file__).parent / KERNEL_DIRECTORY
    if not directory.is_dir():
        warnings.warn(
            "hf_layerfusion: no C++ kernels beside this code (a model's Hub code carries none), so translation takes "
            "the slower PyTorch path; `pip install hf_layerfusion` for the fast one.",
            stacklevel=2,
        )
        return None
    missing = [name for name in KERNEL_SOURCES if not (directory / name).is_file()]
    if missing:
        warnings.warn(
            f"hf_layerfusion: the CPU kernels' source {', '.join(missing)} is not there in {directory} (an incomplete "
            f"copy of the package; a model's Hub code carries none); {fallback}. Reinstall hf_layerfusion for the "
            f"kernels.",
            stacklevel=2,
        )
        return None
    try:
        module = build_kernels(directory).module
    except Exception as error:  # a failed compile shows as OSError, RuntimeError or CalledProcessError
        warnings.warn(
            f"hf_layerfusion: the CPU kernels could not be compiled ({type(error).__name__}: "
            f"{str(error).strip()[:500]}) or loaded under {kernel_cache_root()}; {fallback}. They need a C++ compiler "
            f"and ninja (`pip install ninja`); `python -m hf_layerfusion.inference.build --force` builds them again "
            f"and prints the whole error.",
            stacklevel=2,
        )
        return None
    if cap is not None:
        module.set_max_instruction_set(cap)
    return module
