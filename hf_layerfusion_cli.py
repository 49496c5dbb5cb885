"""The console scripts of hf_layerfusion (setup.cfg `[options.entry_points]`), each with a `--help` that prints at once.

Every module of hf_layerfusion runs the package's `__init__` first, which imports torch and transformers (it registers
the model families with transformers' Auto classes): seconds before a command can print anything. This module sits
beside the package, not in it, and imports only the standard library. A command line that asks for help gets the text
the command's own parser printed for it last time, from a cache; any other command line runs the command, whose parser
then reads it as it always did.

A command line asks for help when `-h` or `--help` is one of its arguments before the first `--` (after it, every
argument is a value). That is when argparse prints the help: it never takes `-h` as the value of an option (`--input
-h` is an error, "expected one argument"), so it can only answer otherwise for an error it meets first, left of the
`-h` (`--num_beams x -h`), which the launcher leaves unread and prints the help. An abbreviation (`--hel`) goes to the
command, whose parser prints the same help the slow way.

The cache: `$XDG_CACHE_HOME/hf_layerfusion/help/<command>.json` (`~/.cache/hf_layerfusion/help/` by default), the text
and the key it was rendered under, which holds all that can change it: the program name of the usage line, the
installed versions of hf_layerfusion, transformers and torch, a hash of the package's sources and this file, the Python
version and the width argparse wraps to. Under another key the text is rendered anew, from the parser the command
itself uses (its module's `build_parser()`, imported then), and replaces the file. A cache file that cannot be read or
written costs the help its speed, never its text.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

PACKAGE = "hf_layerfusion"
# the installed distributions whose code writes the help texts
HELP_DISTRIBUTIONS = ("hf_layerfusion", "transformers", "torch")


class Command:
    """A console script: `name` (setup.cfg's), run by `function` of the package's `module`, which also has the
    command's parser (`build_parser()`). Calling it runs the command line `sys.argv`, as the script's wrapper does."""

    def __init__(self, name: str, module: str, function: str):
        self.name = name
        self.module = module
        self.function = function

    def __call__(self) -> object:
        if asks_for_help(sys.argv[1:]):
            sys.stdout.write(self.help_text())
            return None
        return getattr(importlib.import_module(self.module), self.function)()

    def help_text(self) -> str:
        """The command's `--help`: the cached text if its key is this process's, else rendered and cached."""
        path = help_cache_folder() / f"{self.name}.json"
        key = help_key()
        text = read_cached_help(path, key)
        if text is None:
            text = self.render_help()
            write_cached_help(path, key, text)
        return text

    def render_help(self) -> str:
        """What the command's parser prints for `--help` in this process (seconds: it imports the package)."""
        parser = importlib.import_module(self.module).build_parser()
        # Python 3.14's argparse colours help for a terminal: the cache keeps the plain text, which any output takes
        parser.color = False
        return parser.format_help()


def asks_for_help(arguments: list[str]) -> bool:
    """Whether argparse reads a help option in `arguments` (the module's docstring says when)."""
    options = arguments[: arguments.index("--")] if "--" in arguments else arguments
    return "-h" in options or "--help" in options


def help_cache_folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), PACKAGE, "help")


def help_key() -> dict:
    """All that can change a command's help text in this process but the command itself (one file per command)."""
    return {
        # argparse's default program name, the usage line's
        "prog": os.path.basename(sys.argv[0]),
        "versions": {name: installed_version(name) for name in HELP_DISTRIBUTIONS},
        "sources": sources_digest(),
        "python": sys.version,
        # the width argparse wraps to ($COLUMNS, else the terminal's): its HelpFormatter asks the same function
        "columns": shutil.get_terminal_size().columns,
    }


def installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:  # a checkout on the path, not installed: its sources still count
        return None


def sources_digest() -> str:
    """A hash of the package's Python files and this one. Not only the command's module: a help also shows what other
    modules hold (the family names, the parser both training commands share); and an editable install's sources
    change under one version. The package is found without running it (`find_spec` of a top-level package imports
    nothing)."""
    spec = importlib.util.find_spec(PACKAGE)
    folders = spec.submodule_search_locations if spec is not None else []
    digest = hashlib.sha256()
    for path in [Path(__file__), *sorted(path for folder in folders for path in Path(folder).rglob("*.py"))]:
        digest.update(f"{path}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def read_cached_help(path: Path, key: dict) -> str | None:
    """The help text cached at `path` under `key`; None when there is none, or the file cannot be read or is not one
    that `write_cached_help` wrote."""
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # ValueError: not UTF-8, not JSON
        return None
    if isinstance(cached, dict) and cached.get("key") == key and isinstance(cached.get("help"), str):
        return cached["help"]
    return None


def write_cached_help(path: Path, key: dict, text: str) -> None:
    """Caches `text` under `key` at `path`, whole or not at all (a temporary file renamed into place, so that a help
    printed meanwhile reads the old file or this one); a cache that cannot be written (a read-only home, a full disk)
    is left as it is."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps({"key": key, "help": text}), encoding="utf-8")
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)


train = Command("hf-layerfusion-train", "hf_layerfusion.cli.run_translation", "run")
train_multilingual = Command("hf-layerfusion-train-multilingual", "hf_layerfusion.cli.run_multilingual", "run")
translate = Command("hf-layerfusion-translate", "hf_layerfusion.cli.translate", "main")
average_checkpoints = Command(
    "hf-layerfusion-average-checkpoints", "hf_layerfusion.training.checkpoint_averaging", "main"
)
export_ctranslate2 = Command("hf-layerfusion-export-ctranslate2", "hf_layerfusion.inference.ctranslate2_export", "main")
build_kernels = Command("hf-layerfusion-build-kernels", "hf_layerfusion.inference.build", "main")
