"""The CPU kernels are built once per machine and source hash (hf_layerfusion/inference/cpu_kernels.py): every copy
of the same sources (two checkouts, a checkout and an installed package) finds one build, changed sources get another,
concurrent processes build once, a build says so in one line and finding one says nothing, and
`python -m hf_layerfusion.inference.build` prints what it built and where, a forced build that fails leaves the build
there, a damaged library is never loaded, and a build reports its progress. Nothing here compiles: builds are made by
a stand-in for torch's `load`, under a temporary extensions root (or torch's own `load` with a compiler that fails at
once), except the suite's own (the `kernels` fixture), which the build command must find."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import types
import warnings
from pathlib import Path

import pytest
import torch
import torch.utils.cpp_extension

from hf_layerfusion.inference import build as build_command
from hf_layerfusion.inference import cpu_kernels
from hf_layerfusion.inference.cpu_kernels import (
    KERNEL_DIRECTORY,
    build_kernels,
    compiled_kernels,
    kernel_build_key,
    kernel_cache_root,
    kernel_sources,
)

PACKAGE_KERNELS = Path(cpu_kernels.__file__).parent / KERNEL_DIRECTORY
LOGGER = cpu_kernels.kernel_build_logger.name
TORCH_LOAD = torch.utils.cpp_extension.load  # torch's own, which the `builds` fixture replaces


def stand_in_library(name: str) -> bytes:
    return f"the library of {name}\n".encode() * 64


@pytest.fixture
def two_copies(tmp_path):
    """The kernel sources as two places would hold them: a clone and a wheel's install."""
    copies = [tmp_path / "clone" / "hf_layerfusion" / "inference" / KERNEL_DIRECTORY,
              tmp_path / "site-packages" / "hf_layerfusion" / "inference" / KERNEL_DIRECTORY]
    for copy in copies:
        shutil.copytree(PACKAGE_KERNELS, copy)
    return copies


@pytest.fixture
def builds(tmp_path, monkeypatch):
    """Builds under a fresh extensions root by a stand-in for torch's `load` (a library of `stand_in_library`, at
    once, where there is none: ninja takes one that is there as up to date), loaded by a stand-in import that fails
    on any other bytes (where a real library cut short or altered kills the process); the list of the builds made."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    made = []

    def import_extension(name, library):
        assert Path(library).read_bytes() == stand_in_library(name), f"a damaged library was loaded: {library}"
        return types.SimpleNamespace(__name__=name, __file__=str(library))

    def load(name, sources, build_directory, extra_cflags=None, extra_ldflags=None, **kwargs):
        # as torch's `load`, which appends its own flags to the lists it is given (`_prepare_ldflags`)
        extra_cflags.append("-DTORCH_EXTENSION_NAME=" + name)
        extra_ldflags.append("-ltorch_cpu")
        made.append(types.SimpleNamespace(name=name, sources=sources, directory=Path(build_directory)))
        library = Path(build_directory) / f"{name}.so"
        if not library.exists():
            library.write_bytes(stand_in_library(name))
        return import_extension(name, library)

    monkeypatch.setattr(torch.utils.cpp_extension, "load", load)
    monkeypatch.setattr(cpu_kernels, "import_extension", import_extension)
    return made


def announcements(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == LOGGER]


def test_the_key_is_the_sources_not_their_place(two_copies, monkeypatch):
    first, second = two_copies
    key = kernel_build_key(kernel_sources(first))
    assert kernel_build_key(kernel_sources(second)) == key == kernel_build_key(kernel_sources(PACKAGE_KERNELS))
    for changed in ("int8_linear.cpp", "vector16.h"):  # a compiled source, a header they include
        sources = kernel_sources(second)
        sources[changed] += b"\n// changed\n"
        assert kernel_build_key(sources) != key, changed
    monkeypatch.setattr(torch, "__version__", "0.0.0")  # another torch release: other headers and ABI
    assert kernel_build_key(kernel_sources(first)) != key


def test_two_copies_share_one_build_and_a_change_gets_its_own(two_copies, builds, caplog):
    first, second = two_copies
    caplog.set_level(logging.WARNING, logger=LOGGER)
    built = build_kernels(first)
    assert built.built and len(builds) == 1
    assert built.directory.parent == kernel_cache_root() and built.directory.name == builds[0].name
    # the build compiles its own copy of what it hashed, not the sources of whoever asked
    assert all(Path(source).parent == built.directory / "sources" for source in builds[0].sources)
    (message,) = announcements(caplog)
    assert message.startswith("hf_layerfusion: compiling the CPU kernels for this machine (about ")
    assert "once; `python -m hf_layerfusion.inference.build` does it ahead" in message
    assert message.endswith(f"into {built.directory}")

    caplog.clear()
    found = build_kernels(second)
    assert not found.built and found.directory == built.directory and len(builds) == 1
    assert announcements(caplog) == []  # finding a build says nothing

    (second / "layer_norm.cpp").write_text("// another version\n", encoding="utf-8")
    other = build_kernels(second)
    assert other.built and other.directory != built.directory and len(builds) == 2
    assert len(announcements(caplog)) == 1
    assert build_kernels(first).directory == built.directory and len(builds) == 2  # the first build is still there


def test_concurrent_processes_build_once(two_copies, builds, monkeypatch, caplog):
    """The second asker waits for the first's build (saying so) and loads it instead of compiling again."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    started, release = threading.Event(), threading.Event()
    stand_in = torch.utils.cpp_extension.load

    def slow_load(**kwargs):
        started.set()
        release.wait(30)
        return stand_in(**kwargs)

    monkeypatch.setattr(torch.utils.cpp_extension, "load", slow_load)
    results = {}
    # two threads take the lock as two processes would: `flock` locks belong to each open file, not to the process
    first = threading.Thread(target=lambda: results.update(first=build_kernels(two_copies[0])))
    first.start()
    assert started.wait(30)
    second = threading.Thread(target=lambda: results.update(second=build_kernels(two_copies[1])))
    second.start()
    deadline = time.monotonic() + 30
    while not any("waiting for another process" in message for message in announcements(caplog)):
        assert time.monotonic() < deadline, announcements(caplog)
        time.sleep(0.01)
    release.set()
    first.join(30)
    second.join(30)
    assert results["first"].built and not results["second"].built and len(builds) == 1
    assert results["second"].directory == results["first"].directory


def test_the_build_command_prints_what_it_built_and_where(builds, capsys):
    assert build_command.main([]) == 0
    (build,) = builds
    out = capsys.readouterr().out
    assert out.startswith(f"built the CPU kernels {build.name} from {PACKAGE_KERNELS} in ")
    assert out.rstrip().endswith(str(build.directory / f"{build.name}.so"))
    assert build_command.main([]) == 0 and len(builds) == 1
    assert f"found the CPU kernels {build.name} already built" in capsys.readouterr().out
    assert build_command.main(["--force"]) == 0 and len(builds) == 2


def test_the_build_command_finds_the_suites_build(kernels, capsys):
    """The kernels this test run uses are found where the key says, not compiled again."""
    assert build_command.main([]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"found the CPU kernels {kernels.__name__} already built"), out
    assert str(Path(kernels.__file__).parent) in out and Path(kernels.__file__).parent.parent == kernel_cache_root()


def test_the_build_command_names_a_missing_compiler(builds, monkeypatch, capsys):
    monkeypatch.setenv("CXX", "no-such-c++")
    assert build_command.main([]) == 1 and builds == []
    err = capsys.readouterr().err
    assert "no C++ compiler: `no-such-c++` is not on PATH" in err and "slower PyTorch path" in err


def test_without_a_compiler_fast_translation_warns_and_falls_back(builds, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-c++")
    compiled_kernels.cache_clear()
    try:
        with pytest.warns(UserWarning, match=r"could not be compiled \(RuntimeError: no C\+\+ compiler.*slower"):
            assert compiled_kernels() is None
    finally:
        compiled_kernels.cache_clear()


def warnings_of_kernels_not_compiled() -> list[str]:
    """The warnings of a first `compiled_kernels()` call (its cache cleared before and after) that must give None:
    the kernels did not load, and fast translation takes the PyTorch path."""
    compiled_kernels.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert compiled_kernels() is None
    finally:
        compiled_kernels.cache_clear()
    return [str(warning.message) for warning in caught]


def test_the_hub_codes_warning_is_one_short_sentence(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "KERNEL_DIRECTORY", "not_in_the_hub_code")
    (message,) = warnings_of_kernels_not_compiled()
    assert "Hub code" in message and message.count(". ") == 0 and len(message) < 200, message


def test_the_build_module_runs_with_python_m():
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_KERNELS.parents[2])}
    result = subprocess.run(
        [sys.executable, "-W", "error", "-m", "hf_layerfusion.inference.build", "--help"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "python -m hf_layerfusion.inference.build --force" in result.stdout


# ------------------------------------------------------------------------------------------ issue 73, items 3, 15, 21
def test_a_forced_build_that_fails_leaves_the_build_there(two_copies, builds, monkeypatch):
    """`--force` with a compiler that fails (`CXX=/bin/false`, through torch's own `load`) keeps the build it was to
    replace, byte for byte, and it still loads: before, the build folder was deleted first and the next fast
    translation compiled for minutes."""
    built = build_kernels(two_copies[0])
    before = {path.name: path.read_bytes() for path in built.directory.iterdir() if path.is_file()}
    monkeypatch.setattr(torch.utils.cpp_extension, "load", TORCH_LOAD)
    monkeypatch.setenv("CXX", "/bin/false")
    with pytest.raises(RuntimeError, match=rf"could not be built again into {re.escape(str(built.directory))}\.new "
                                           rf".*; {re.escape(str(built.directory))} is as it was \(its build still"):
        build_kernels(two_copies[0], force=True)
    assert {path.name: path.read_bytes() for path in built.directory.iterdir() if path.is_file()} == before
    assert sorted(path.name for path in kernel_cache_root().iterdir()) == [built.directory.name,
                                                                          f"{built.directory.name}.lock"]
    found = build_kernels(two_copies[0])
    assert not found.built and found.library == built.library and len(builds) == 1


def test_a_forced_build_is_made_beside_the_build_and_swapped_in(two_copies, builds, monkeypatch, capsys):
    built = build_kernels(two_copies[0])
    stand_in = torch.utils.cpp_extension.load

    def load_beside(**kwargs):
        # while the new build compiles, the one it replaces is where it was and loads
        assert cpu_kernels.finished_build(built.directory).library == built.library
        return stand_in(**kwargs)

    monkeypatch.setattr(torch.utils.cpp_extension, "load", load_beside)
    assert build_command.main(["--force"]) == 0
    assert builds[-1].directory == built.directory.with_name(built.directory.name + ".new")
    assert capsys.readouterr().out.rstrip().endswith(str(built.library))  # where it is now, not where it was built
    assert sorted(path.name for path in kernel_cache_root().iterdir()) == [built.directory.name,
                                                                          f"{built.directory.name}.lock"]
    assert json.loads((built.directory / "build.json").read_text())["library_sha256"]
    assert not build_kernels(two_copies[0]).built and len(builds) == 2


def cut_short(library: Path) -> None:
    library.write_bytes(library.read_bytes()[:-100])


def altered(library: Path) -> None:
    content = bytearray(library.read_bytes())
    content[len(content) // 2] ^= 0xFF
    library.write_bytes(bytes(content))


@pytest.mark.parametrize("damage, fault", [
    (cut_short, r"\.so holds \d+ bytes, its build wrote \d+"),
    (altered, r"\.so is not the file its build wrote \(another sha256\)"),
    (Path.unlink, r"\.so is missing"),
    (lambda library: cut_short(library.parent / "build.json"), r"its record build\.json is unreadable"),
], ids=["cut-short", "altered", "missing", "record-cut-short"])
def test_a_damaged_build_is_not_loaded_but_built_again(two_copies, builds, damage, fault):
    """A library that is not the one its build recorded (size, sha256) is never loaded: dlopen of a library cut
    short kills the process ("Bus error"). It is named in a warning and built again in its folder."""
    built = build_kernels(two_copies[0])
    damage(built.library)
    with pytest.warns(UserWarning, match=rf"built in {re.escape(str(built.directory))} are damaged \(.*{fault}"):
        again = build_kernels(two_copies[0])
    assert again.built and again.directory == built.directory and len(builds) == 2
    assert not build_kernels(two_copies[1]).built and len(builds) == 2


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="ELF libraries")
def test_a_build_recorded_without_a_checksum_is_loaded_unless_cut_short(two_copies, builds, monkeypatch):
    """Builds recorded before records held the library's size and sha256 (the caches of earlier versions) load as
    long as the library is a whole ELF file, not one cut short."""
    built = build_kernels(two_copies[0])
    shutil.copyfile(torch._C.__file__, built.library)  # a real ELF library in place of the stand-in's
    record_path = built.directory / "build.json"
    record = json.loads(record_path.read_text())
    record_path.write_text(json.dumps({key: value for key, value in record.items() if not key.startswith("library_")}))
    loaded = []
    monkeypatch.setattr(cpu_kernels, "import_extension", lambda name, library: loaded.append(library) or built.module)
    assert not build_kernels(two_copies[0]).built and loaded == [built.library]
    cut_short(built.library)
    with pytest.warns(UserWarning, match=r"are damaged \(.*\.so is cut short\)"):
        assert build_kernels(two_copies[0]).built
    assert loaded == [built.library] and len(builds) == 2


def test_a_damaged_build_that_cannot_be_built_again_is_not_loaded(builds, monkeypatch):
    """With no compiler to build it again, fast translation warns twice (the damage, the missing compiler) and takes
    the PyTorch path; the damaged library is not loaded."""
    cut_short(build_kernels(PACKAGE_KERNELS).library)
    monkeypatch.setenv("CXX", "no-such-c++")
    damaged, fallback = warnings_of_kernels_not_compiled()
    assert "are damaged (" in damaged and "could not be compiled (RuntimeError: no C++ compiler" in fallback


@pytest.mark.parametrize("load_average", [50.0, 0.0], ids=["busy", "idle"])
def test_a_build_reports_its_progress_and_whether_the_machine_is_busy(builds, monkeypatch, caplog, load_average):
    """A build prints a line whenever sources are compiled, and one every `PROGRESS_QUIET_SECONDS` while none is
    (sources done of all, seconds so far), and says when more processes want the cores than there are: one build
    printed nothing for 1,246 s on a busy machine."""
    caplog.set_level(logging.WARNING, logger=LOGGER)
    monkeypatch.setattr(cpu_kernels, "PROGRESS_POLL_SECONDS", 0.01)
    monkeypatch.setattr(cpu_kernels, "PROGRESS_QUIET_SECONDS", 0.1)
    monkeypatch.setattr(os, "getloadavg", lambda: (load_average, load_average, load_average))
    stand_in = torch.utils.cpp_extension.load

    def compiling_load(**kwargs):
        time.sleep(0.5)  # the first source takes a while: quiet lines
        for source in kwargs["sources"]:
            (Path(kwargs["build_directory"]) / f"{Path(source).stem}.o").write_bytes(b"object")
            time.sleep(0.05)
        time.sleep(0.5)  # linking
        return stand_in(**kwargs)

    monkeypatch.setattr(torch.utils.cpp_extension, "load", compiling_load)
    build_kernels(PACKAGE_KERNELS)
    announcement, *progress = announcements(caplog)
    total = len(cpu_kernels.KERNEL_SOURCES)
    counts = [int(re.match(rf"hf_layerfusion: compiling the CPU kernels: (\d+) of {total} sources compiled", line)[1])
              for line in progress]
    assert counts[:2] == [0, 0] and counts == sorted(counts) and counts[-1] == total, progress
    assert all(re.search(r", \d+ s so far", line) for line in progress)
    assert ", linking" in progress[-1]
    busy = f"the machine is busy (load average 50.0 on {cpu_kernels.usable_cores()} core"
    for line in (announcement, *progress):
        assert (busy in line) == (load_average == 50.0), line
