"""Builds the CPU kernels of fast translation for this machine ahead of the first translation, or finds them built.

The kernels (hf_layerfusion/inference/kernels) are compiled once per machine and source hash into a folder under
the torch extensions root (`TORCH_EXTENSIONS_DIR`, else ~/.cache/torch_extensions) named by that hash, which every
checkout and installation of the same sources shares. Without this command the first fast translation of a process
compiles them (under a minute on 2 idle cores). Prints what it built or found, where and how long the build took, and
while compiling, its progress. `--force` builds into a new folder beside the build and swaps it in once built: a
build that fails leaves the one there as it was.

examples:
  python -m hf_layerfusion.inference.build
  python -m hf_layerfusion.inference.build --force    # compile again, e.g. after a failed load
  TORCH_EXTENSIONS_DIR=/opt/kernels python -m hf_layerfusion.inference.build
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .cpu_kernels import KERNEL_DIRECTORY, build_kernels


def build_parser() -> argparse.ArgumentParser:
    """The command's parser: it parses the command line and prints `--help` (the console script's too, which
    `hf_layerfusion_cli` caches)."""
    parser = argparse.ArgumentParser(
        prog="python -m hf_layerfusion.inference.build",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--force", action="store_true", help="compile even if a build of these sources exists")
    return parser


def main(argv: list[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    sources = Path(__file__).parent / KERNEL_DIRECTORY
    try:
        build = build_kernels(sources, force=arguments.force, implicit=False)
    except Exception as error:  # whatever the compiler, ninja or the file system raised, in full
        # a forced build that fails leaves the build it was to replace, which fast translation goes on loading
        fallback = "with the build already there if there is one, else " if arguments.force else ""
        print(
            f"hf_layerfusion: the CPU kernels of {sources} could not be built ({type(error).__name__}: {error})\n"
            f"Translation still works, {fallback}on the slower PyTorch path.",
            file=sys.stderr,
        )
        return 1
    if build.built:
        print(f"built the CPU kernels {build.module.__name__} from {sources} in {build.seconds:.0f} s: {build.library}")
    else:
        print(
            f"found the CPU kernels {build.module.__name__} already built for these sources on this machine "
            f"(a {build.seconds:.0f} s build): {build.library}; --force compiles them again"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
