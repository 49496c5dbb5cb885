#!/usr/bin/env python
"""Refresh `tests/constraints.txt`, the exact versions the test suite last passed on.

    python tools/refresh_test_constraints.py                     # newest releases, whole suite, rewrite on success
    python tools/refresh_test_constraints.py --workdir /tmp/c --keep   # keep the environment

The README's test command and `.ci/run` install the `test` extra with `-c tests/constraints.txt`, so a release that
appears overnight cannot turn them red; users install with the package's ranges (setup.cfg), never with this file.
This tool moves the pins forward: in a new virtual environment (no system site-packages) it installs torch as the
README pins it and the checkout's `test` extra with whatever the package index has newest, runs the whole suite there
(`CI=true python -m pytest -q`, from the checkout), and only when it passes rewrites the file (through a temporary file
renamed into place) with every installed distribution but the package itself and pip, printing what changed. When the
suite fails, the file stays as it is, the tool prints the suite's last lines and the versions that differ (the suspects),
and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = REPO_ROOT / "tests" / "constraints.txt"
TORCH = "torch==2.13.0"  # the README's set-up commands pin the CPU wheel (a bare `torch` pulls CUDA's packages)
NOT_PINNED = {"hf-layerfusion", "pip"}
HEADER = """\
# The exact versions the whole test suite last passed on (`python tools/refresh_test_constraints.py` writes this file
# after running the suite on the newest releases; docs/testing.md, "The test environment"). The README's test command
# and .ci/run install with `-c tests/constraints.txt`; users install with the package's own ranges.
"""


def normalized(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def parse_constraints(text: str, source: str) -> dict[str, str]:
    """{normalized name: version} of a constraints file's `name==version` lines (comments and blank lines aside)."""
    pins = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, separator, version = line.partition("==")
        if not separator or not name.strip() or not version.strip():
            raise ValueError(f"{source}:{number}: {line!r} is not a `name==version` pin")
        pins[normalized(name.strip())] = version.strip()
    return pins


def read_constraints(path: Path) -> dict[str, str]:
    return parse_constraints(path.read_text(encoding="utf-8"), str(path))


def constraints_text(installed: dict[str, str]) -> str:
    """The file's text for `installed` ({name: version}): sorted pins, local version labels (`2.13.0+cpu`) dropped so
    that the pin matches the same release from any index."""
    lines = [
        f"{normalized(name)}=={version.split('+', 1)[0]}"
        for name, version in installed.items()
        if normalized(name) not in NOT_PINNED
    ]
    return HEADER + "\n".join(sorted(lines)) + "\n"


def differences(old: dict[str, str], new: dict[str, str]) -> list[str]:
    """What changed from `old` to `new` pins, one line each."""
    lines = []
    for name in sorted(set(old) | set(new)):
        if name not in new:
            lines.append(f"removed {name}=={old[name]}")
        elif name not in old:
            lines.append(f"added   {name}=={new[name]}")
        elif old[name] != new[name]:
            lines.append(f"changed {name} {old[name]} -> {new[name]}")
    return lines


def write_atomically(path: Path, text: str) -> None:
    """`text` into `path` through a temporary file renamed into place, on disk before the rename, with the file's
    permission bits (mkstemp's 0o600 would make a committed 0o644 file private). The package's
    `write_file_atomically` does the same, but importing it would import torch and transformers, the very releases
    this tool is about to replace."""
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as file:
            file.write(text)
            file.flush()
            os.fsync(file.fileno())
        if path.exists():
            mode = stat.S_IMODE(path.stat().st_mode)
        else:  # a new file, as open() would create it: 0o666 less the umask
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(temporary, mode)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    print(f"$ {' '.join(command)}", flush=True)
    return subprocess.run(command, text=True, capture_output=True, **kwargs)


def refresh(workdir: Path, constraints: Path, runner=run) -> int:
    """Install the newest releases into `workdir/env`, run the whole suite, rewrite `constraints` when it passes."""
    python = workdir / "env" / "bin" / "python"
    old = read_constraints(constraints) if constraints.exists() else {}
    steps = [
        ("environment", [sys.executable, "-m", "venv", str(workdir / "env")], {}),
        ("torch", [str(python), "-m", "pip", "install", "-q", TORCH], {}),
        ("the test extra, newest releases", [str(python), "-m", "pip", "install", "-q", "-e", f"{REPO_ROOT}[test]"], {}),
    ]
    for name, command, kwargs in steps:
        result = runner(command, **kwargs)
        if result.returncode:
            print(f"{name}: failed (exit {result.returncode})\n{(result.stdout + result.stderr)[-3000:]}")
            print(f"{constraints} is unchanged.")
            return 1
    listed = runner([str(python), "-m", "pip", "list", "--format=json", "--exclude-editable"])
    if listed.returncode:
        print(f"pip list failed (exit {listed.returncode})\n{listed.stderr[-2000:]}")
        return 1
    installed = {entry["name"]: entry["version"] for entry in json.loads(listed.stdout)}
    new = parse_constraints(constraints_text(installed), "the new environment")
    changes = differences(old, new)
    print("newest releases against the constraints:" if changes else "the newest releases are the pinned ones")
    for line in changes:
        print(f"  {line}")
    start = time.monotonic()
    suite = runner(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=REPO_ROOT, env=os.environ | {"CI": "true"}
    )
    minutes = (time.monotonic() - start) / 60
    tail = "\n".join((suite.stdout + suite.stderr).strip().splitlines()[-30:])
    print(f"the whole suite on the newest releases ({minutes:.1f} min), exit {suite.returncode}:\n{tail}")
    if suite.returncode:
        print(f"{constraints} is unchanged: the suite fails on the newest releases (the changes above are the suspects).")
        return 1
    write_atomically(constraints, constraints_text(installed))
    print(f"{constraints} rewritten ({len(changes)} change(s)).")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, help="Where the environment goes (default: a temporary folder).")
    parser.add_argument("--keep", action="store_true", help="Keep the work folder.")
    parser.add_argument("--constraints", type=Path, default=CONSTRAINTS, help=f"default: {CONSTRAINTS}")
    args = parser.parse_args(argv)
    if args.workdir is not None and args.workdir.exists() and not args.workdir.is_dir():
        parser.error(f"--workdir {args.workdir} is a file, not a folder: give a new or empty folder.")
    if args.workdir is not None and args.workdir.exists() and any(args.workdir.iterdir()):
        parser.error(f"--workdir {args.workdir} is not empty: give a new or empty folder (nothing there is replaced).")
    if not args.constraints.parent.is_dir():
        parser.error(f"--constraints {args.constraints}: its folder does not exist.")
    if args.constraints.is_dir():
        parser.error(f"--constraints {args.constraints} is a folder: give the constraints file (new or existing).")
    if args.constraints.exists():
        try:
            read_constraints(args.constraints)
        except ValueError as error:
            parser.error(f"--constraints: {error}; fix or delete the line first.")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="test-constraints-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        return refresh(workdir, args.constraints)
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
