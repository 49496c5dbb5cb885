"""The CPU kernels are built once per machine and source hash (hf_layerfusion/inference/cpu_kernels.py): every copy
of the same sources (two checkouts, a checkout and an installed package) finds one build, changed sources get another,
concurrent processes build once, a build says so in one line and finding one says nothing, and
`python -m hf_layerfusion.inference.build` prints what it built and where. Nothing here compiles: builds are made
by a stand-in for torch's `load`, under a temporary extensions root, except the suite's own (the `kernels` fixture),
which the build command must find."""

from __future__ import annotations

import logging
import os
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
    """Builds under a fresh extensions root by a stand-in for torch's `load` (an empty library, at once), loaded by
    a stand-in import; the list of the builds made."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "extensions"))
    made = []

    def load(name, sources, build_directory, extra_cflags=None, extra_ldflags=None, **kwargs):
        # as torch's `load`, which appends its own flags to the lists it is given (`_prepare_ldflags`)
        extra_cflags.append("-DTORCH_EXTENSION_NAME=" + name)
        extra_ldflags.append("-ltorch_cpu")
        made.append(types.SimpleNamespace(name=name, sources=sources, directory=Path(build_directory)))
        library = Path(build_directory) / f"{name}.so"
        library.write_bytes(b"")
        return types.SimpleNamespace(__name__=name, __file__=str(library))

    monkeypatch.setattr(torch.utils.cpp_extension, "load", load)
    def import_extension(name, library):
        return types.SimpleNamespace(__name__=name, __file__=str(library))

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


def test_the_hub_codes_warning_is_one_short_sentence(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "KERNEL_DIRECTORY", "not_in_the_hub_code")
    compiled_kernels.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert compiled_kernels() is None
    finally:
        compiled_kernels.cache_clear()
    (warning,) = caught
    message = str(warning.message)
    assert "Hub code" in message and message.count(". ") == 0 and len(message) < 200, message


def test_the_build_module_runs_with_python_m():
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_KERNELS.parents[2])}
    result = subprocess.run(
        [sys.executable, "-W", "error", "-m", "hf_layerfusion.inference.build", "--help"],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "python -m hf_layerfusion.inference.build --force" in result.stdout
