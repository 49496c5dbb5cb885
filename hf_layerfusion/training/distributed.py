"""Leaving a data-parallel run (`accelerate launch`, `torchrun`) cleanly."""

import logging
import os
import sys
from collections.abc import Callable

import torch


def exit_distributed_process() -> None:
    """End this process once every process of a distributed run gets here; return at once where there is none.

    Called last by the example scripts, after their results are written. With the gloo backend (data-parallel on
    CPUs) neither way of tearing the process group down is safe: an explicit `destroy_process_group()` can deadlock
    (its destructor joins gloo's worker thread while holding the GIL that thread waits for to drop a finished
    collective's tensor: py-spy on one core, 3 hangs in 6 runs of tests/test_ddp.py) and leaving it to interpreter
    exit can abort a process that finished its work ("terminate called without an active exception", so the
    launcher reports the whole run as failed: it failed a CI run of tests/test_ddp.py; pytorch/pytorch#179291
    describes the teardown race). So every process waits at a barrier, flushes its output and logs, and exits
    without running destructors or `atexit` handlers (the trainer has already closed its own loggers at the end of
    training)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    torch.distributed.barrier()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def run_script(main: Callable[[], object]) -> None:
    """A training script's command line (its console script, `python -m`, `python examples/...`): `main()`, whose
    metrics are not handed back (a console script's return value becomes its exit status), then the exit above."""
    main()
    exit_distributed_process()
