"""Checks of what a user points the package at: local paths or Hub ids, checkpoints, input files, output files and
directories, and how a training script was launched. Shared by the models' saving and loading, the converters, the
training tools and the command-line scripts (the checks of the models' tensor inputs are in
`hf_layerfusion.modeling.input_checks`).

Every check raises an error that names the bad value, before any expensive work or any write: a wrong argument
must never give a silent wrong answer or overwrite a user's file. The writes that follow the checks go through
`write_file_atomically` (a failure leaves the previous file whole; a special file such as /dev/stdout is written in
place) and, for a run's output directory, `lock_output_dir` (two runs never write into one directory at once).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import secrets
import shlex
import shutil
import socket
import stat
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

# held by the run writing into an output dir (`lock_output_dir`); named with a leading '_' so that
# `Trainer.push_to_hub`, which leaves out `_*` files, does not upload the command line it holds
LOCK_FILE = "_run.lock"


def looks_like_local_path(name_or_path: str | os.PathLike) -> bool:
    """Whether `name_or_path` can only be a file-system path: a Hub id is `name` or `owner/name`, so an absolute
    path, `./`, `../`, `~`, a backslash, two or more `/`, or a first component that is a local directory mean a
    path."""
    text = os.fspath(name_or_path)
    first = text.split("/", 1)[0]
    return (
        os.path.isabs(text)
        or text.startswith((".", "~"))
        or "\\" in text
        or text.count("/") >= 2
        or ("/" in text and os.path.isdir(first))
    )


def check_local_or_hub(name_or_path, what: str, *, must_be_dir: bool = True) -> str:
    """`name_or_path` as a string after checking that a local one exists (`FileNotFoundError` naming it otherwise,
    instead of a Hub error about a bad repo id). Strings that may be Hub ids and are not local pass unchanged."""
    if not isinstance(name_or_path, (str, os.PathLike)):
        raise TypeError(f"{what} must be a path or Hub id, got {type(name_or_path).__name__} {name_or_path!r}.")
    text = os.fspath(name_or_path)
    if not text:
        raise ValueError(f"{what} is empty.")
    path = Path(text).expanduser()
    if path.exists():
        if must_be_dir and not path.is_dir():
            raise NotADirectoryError(f"{what} {text!r} is a file, not a model directory.")
        return str(path)
    if looks_like_local_path(text):
        raise FileNotFoundError(f"{what} {text!r}: no such local directory ({path.absolute()}).")
    return text


def reraise_hub_error(name_or_path: str, what: str, error: OSError):
    """Re-raise an `OSError` of a Hub lookup for something that was not found locally, saying both readings."""
    raise OSError(
        f"{what} {name_or_path!r} is not a local directory (none at {Path(name_or_path).absolute()}) and could not "
        f"be loaded as a Hugging Face Hub repo id: {error}"
    ) from error


def checkpoint_config(name_or_path) -> dict | None:
    """A local checkpoint's `config.json` as saved (None when there is no such local file)."""
    config_file = Path(os.fspath(name_or_path)).expanduser() / "config.json"
    if not config_file.is_file():
        return None
    try:
        return json.loads(config_file.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise ValueError(f"{config_file} is not a readable JSON config: {error}") from error


def checkpoint_model_type(name_or_path) -> str | None:
    """The `model_type` of a local checkpoint's `config.json` (None when there is no such local file)."""
    return (checkpoint_config(name_or_path) or {}).get("model_type")


def check_not_an_adapter(name_or_path, what: str) -> None:
    """Refuse a local directory that holds a PEFT adapter (`adapter_config.json`) and no model (`config.json`),
    naming its base model and how to merge the two, instead of transformers' "Unrecognized model ... should have a
    `model_type` key". Hub ids and other directories pass."""
    directory = Path(os.fspath(name_or_path)).expanduser()
    adapter_config = directory / "adapter_config.json"
    if not adapter_config.is_file() or (directory / "config.json").is_file():
        return
    try:
        base = json.loads(read_utf8(adapter_config, "Adapter config")).get("base_model_name_or_path")
    except ValueError:  # a damaged adapter config: the advice holds without its base model's name
        base = None
    raise ValueError(
        f"{what} {str(directory)!r} holds a PEFT adapter (adapter_config.json; base model {base or 'not recorded'}), "
        "not a model: merge it into its base model and save the result with the tokenizer, e.g. `peft.PeftModel."
        f"from_pretrained(AutoModelForSeq2SeqLM.from_pretrained({base or '<base model>'!r}), {str(directory)!r})."
        "merge_and_unload().save_pretrained(merged_dir)`, then point the command at merged_dir."
    )


def check_weight_files(name_or_path) -> dict[str, str]:
    """Every safetensors weight file of a local model directory opens: a file cut short (an interrupted copy or
    download) or with damaged bytes in its header is an error naming the file, instead of a `SafetensorError`
    naming none. Returns `{tensor name: safetensors dtype}` of the tensors of the files transformers loads the model
    from (`model.safetensors`, shards `model-00001-of-00002.safetensors`) that are not floating-point, for the load
    check to refuse where they would be cast into a model's floating weight (`CheckedSaveLoadMixin`). Hub ids pass
    (the Hub client checks its downloads)."""
    from safetensors import SafetensorError, safe_open  # only where weights are loaded

    directory = Path(os.fspath(name_or_path)).expanduser() if isinstance(name_or_path, (str, os.PathLike)) else None
    if directory is None or not directory.is_dir():
        return {}
    not_floating = {}
    for weights in sorted(directory.glob("*.safetensors")):
        try:
            # reads the header and checks that the tensors it lists cover the file exactly; no tensor is loaded
            with safe_open(weights, framework="pt") as handle:
                dtypes = {name: handle.get_slice(name).get_dtype() for name in handle.keys()}
        except SafetensorError as error:
            raise ValueError(
                f"Weight file {str(weights)!r} is damaged or incomplete ({error}; {weights.stat().st_size} bytes): "
                "copy, download or save the model again."
            ) from error
        # others beside the model's files (a test's expected outputs, say) are no weights
        if weights.name == "model.safetensors" or weights.name.startswith("model-"):
            # safetensors' dtype names: F64, F32, F16, BF16, F8_E4M3, ... floating; I64, U8, BOOL, C64, ... not
            not_floating |= {name: dtype for name, dtype in dtypes.items() if not dtype.startswith(("F", "BF"))}
    return not_floating


def check_tokenizer_files(name_or_path, what: str = "tokenizer") -> None:
    """A local tokenizer directory holds a tokenizer (`tokenizer.json` or `tokenizer_config.json`; without them
    transformers answers "install sentencepiece or tiktoken"), and its JSON files parse (a file cut short is an
    error naming it, not a bare `JSONDecodeError`). Hub ids pass."""
    directory = Path(os.fspath(name_or_path)).expanduser()
    if not directory.is_dir():
        return
    names = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
    if not any((directory / name).is_file() for name in names[:2]):
        raise FileNotFoundError(
            f"{what} {str(directory)!r} holds no tokenizer (no tokenizer.json or tokenizer_config.json; it has "
            f"{sorted(child.name for child in directory.iterdir())[:8]}): save the tokenizer there "
            "(`tokenizer.save_pretrained`), or name the directory that holds it."
        )
    for name in names:
        file = directory / name
        if file.is_file():
            try:
                json.loads(read_utf8(file, "Tokenizer file"))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"Tokenizer file {str(file)!r} is not valid JSON ({error}): it is damaged or was cut short; "
                    "save or copy the tokenizer again."
                ) from error


def check_input_file(path, what: str) -> Path:
    """An existing regular file (`FileNotFoundError` / `IsADirectoryError` naming it)."""
    path = Path(os.fspath(path)).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"{what} {str(path)!r} does not exist.")
    if not path.is_file():
        raise IsADirectoryError(f"{what} {str(path)!r} is not a file.")
    return path


def decode_utf8(data: bytes, where: str) -> str:
    """`data` as text with universal newlines, as Python reads a text file: `\\r\\n` and a lone `\\r` end a line as
    `\\n` does, so that a file and the same bytes on stdin give the same lines. Bytes that are not UTF-8 are refused
    naming `where` (e.g. "--input 'a.txt'", "stdin") and the byte offset."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ValueError(
            f"{where} is not UTF-8 text (byte {error.start}: {data[error.start:error.start + 4]!r}): convert it, e.g. "
            "`iconv -f latin1 -t utf-8`."
        ) from error
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_utf8(path, what: str = "File") -> str:
    """The text of `path` (`decode_utf8`: universal newlines); a file that is not UTF-8 is refused with its name and
    the byte offset."""
    return decode_utf8(Path(path).read_bytes(), f"{what} {str(path)!r}")


def _same_path(a: Path, b: Path) -> bool:
    if a.exists() and b.exists():
        return os.path.samefile(a, b)
    return a.resolve() == b.resolve()


def _check_writable(directory: Path, what: str, path: Path) -> None:
    """A directory we may create files in (a read-only mount or missing permission fails here, before the work
    whose result would be lost)."""
    if not os.access(directory, os.W_OK | os.X_OK):
        raise PermissionError(
            f"{what} {str(path)!r}: the directory {str(directory)!r} is not writable (read-only file system or no "
            "permission); choose a location you may write to."
        )


def _descriptor_named(path: Path) -> int | None:
    """The open descriptor of this process that `path` names through /proc/self/fd (`/dev/stdout`, `/dev/fd/1`,
    `/proc/self/fd/1`, or a link to one of them); None for any other path. Opening such a path would open the file
    behind the descriptor anew, at offset 0 and without the shell's `>>` (append), and replacing it would replace
    the file that stdout was redirected to."""
    own_descriptors = os.path.realpath("/proc/self/fd")
    current = os.path.abspath(path)
    for _ in range(40):  # the kernel's limit of links followed in one lookup
        name = os.path.basename(current)
        if name.isdigit() and os.path.realpath(os.path.dirname(current)) == own_descriptors:
            return int(name)
        if not os.path.islink(current):
            return None
        current = os.path.join(os.path.dirname(current), os.readlink(current))
    return None


def writes_in_place(path) -> bool:
    """Whether `path` is an output that cannot be replaced by a new file and is written in place: an open descriptor
    named by a path such as `/dev/stdout` (whatever the shell redirected it to: a pipe, a terminal, a file appended
    to with `>>`), a FIFO, or a character device (a terminal, /dev/null)."""
    path = Path(os.fspath(path)).expanduser()
    if _descriptor_named(path) is not None:
        return True
    try:
        mode = path.stat().st_mode
    except OSError:  # missing: a new regular file
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISCHR(mode)


def _file_kind(path: Path) -> str:
    mode = path.stat().st_mode
    kinds = {stat.S_ISBLK: "a block device", stat.S_ISSOCK: "a socket", stat.S_ISFIFO: "a FIFO", stat.S_ISCHR:
             "a character device"}
    return next((kind for test, kind in kinds.items() if test(mode)), "a special file")


def _check_in_place_writable(path: Path, what: str) -> None:
    """A special output (`writes_in_place`) that a write will reach: an open descriptor opened for writing, or a
    FIFO / device this process may write to."""
    descriptor = _descriptor_named(path)
    if descriptor is None:
        if not os.access(path, os.W_OK):
            raise PermissionError(f"{what} {str(path)!r} ({_file_kind(path)}) is not writable for this user.")
        return
    try:
        flags = fcntl.fcntl(descriptor, fcntl.F_GETFL)
    except OSError:
        raise FileNotFoundError(
            f"{what} {str(path)!r} names descriptor {descriptor}, which this process does not have open; write to a "
            "file, or redirect that descriptor in the shell."
        ) from None
    if flags & os.O_ACCMODE == os.O_RDONLY:
        raise PermissionError(f"{what} {str(path)!r} names descriptor {descriptor}, which is open for reading only.")


def _write_in_place(path: Path, payload: bytes, what: str) -> Path:
    """Write `payload` into a special output (`writes_in_place`): into the open descriptor a path like /dev/stdout
    names (where the shell's redirection asked: at the end of a file opened with `>>`), or into a FIFO or device
    opened for writing without creating anything (a FIFO waits for its reader)."""
    descriptor = _descriptor_named(path)
    try:
        if descriptor is None:
            file = open(os.open(path, os.O_WRONLY), "wb")  # no O_CREAT: a FIFO removed meanwhile is not recreated
        else:
            for stream in (sys.stdout, sys.stderr):  # what Python holds for the standard streams goes first
                if stream is not None:
                    stream.flush()
            file = open(descriptor, "wb", closefd=False)
        with file:
            file.write(payload)
    except OSError as error:
        message = f"Could not write {what} {str(path)!r} (a special file, written in place): {error.strerror or error}."
        raise (OSError(error.errno, message) if error.errno else OSError(message)) from error
    return path


def check_output_file(path, inputs: Iterable = (), what: str = "Output file") -> Path:
    """A file we may write: not one of `inputs`, nor an existing file inside an input directory (a file of a model
    the command reads), not a directory, not a read-only file, in a directory that exists and is writable (checked
    before any work, so that a typo or a read-only destination does not cost a whole run). A special file that
    `write_file_atomically` writes in place (`writes_in_place`) must be open for writing or writable; a block
    device or a socket is refused."""
    path = Path(os.fspath(path)).expanduser()
    for source in inputs:
        if source is None:
            continue
        source_path = Path(os.fspath(source)).expanduser()
        if _same_path(path, source_path):
            raise ValueError(f"{what} {str(path)!r} is the input {os.fspath(source)!r}: writing it would destroy it.")
        # resolved: a symbolic link to a model's file, or `..` in the path, is caught too
        if source_path.is_dir() and path.exists() and path.resolve().is_relative_to(source_path.resolve()):
            raise ValueError(
                f"{what} {str(path)!r} is a file of {os.fspath(source)!r}, which this command reads: writing it would "
                "destroy it. Write to a new file, or outside that directory."
            )
    if writes_in_place(path):
        _check_in_place_writable(path, what)
        return path
    if path.exists() and not path.is_file() and not path.is_dir():
        raise ValueError(
            f"{what} {str(path)!r} is {_file_kind(path)}: an output goes to a regular file, or is written in place "
            "into a FIFO, a terminal, /dev/null or the shell's redirection (/dev/stdout); choose one of those."
        )
    if path.is_dir():
        raise IsADirectoryError(f"{what} {str(path)!r} is a directory.")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{what} {str(path)!r}: directory {str(path.parent)!r} does not exist.")
    _check_writable(path.parent, what, path)
    if path.exists() and not os.access(path, os.W_OK):
        raise PermissionError(f"{what} {str(path)!r} is read-only; make it writable or choose another file.")
    return path


def write_file_atomically(path, data: str | bytes, what: str = "Output file") -> Path:
    """Write `data` (a string as UTF-8) to `path` through a temporary file in the same directory renamed into place
    (`os.replace`), so that a failure (a full disk, a read-only directory, a kill) leaves the previous file whole
    instead of replaced by a partial one; the error names the path and the reason. A symbolic link is written through
    (its target is replaced), and a replaced file keeps its permission bits. Only a regular file can be replaced: a
    special file (`writes_in_place`: /dev/stdout and the like, a FIFO, a terminal) is written in place."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if writes_in_place(path):
        return _write_in_place(Path(os.fspath(path)).expanduser(), payload, what)
    target = Path(os.path.realpath(Path(os.fspath(path)).expanduser()))
    # hidden, and unique to this call: a temporary file left by a killed process is never reused or clobbered
    temporary = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        # created as any new file is (0o666 less the umask), not mkstemp's 0o600
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(payload)
                file.flush()
                os.fsync(file.fileno())  # the data is on disk before the name points at it
            if target.exists():
                os.chmod(temporary, stat.S_IMODE(target.stat().st_mode))
            os.replace(temporary, target)
        except BaseException:
            temporary.unlink(missing_ok=True)
            raise
    except OSError as error:
        message = (
            f"Could not write {what} {str(path)!r}: {error.strerror or error}; the previous file, if any, is "
            "unchanged."
        )
        raise (OSError(error.errno, message) if error.errno else OSError(message)) from error
    return target


def check_output_dir(output_dir, inputs: Iterable = (), *, overwrite: bool = False, what: str = "output_dir",
                     overwrite_option: str | None = "--overwrite_output_dir") -> Path:
    """A directory we may write into: not a file, neither one of `inputs` nor inside / around one, writable (or
    creatable), and empty (or missing; a lock file of an earlier run does not count) unless `overwrite` (a bool, which
    the public functions that take it from a user check: `"no"` would be truthy). The refusal of a non-empty directory names `overwrite_option`, how the caller's user
    asks to write there anyway; None for a caller without one (the refusal then says to empty the directory)."""
    if not isinstance(output_dir, (str, os.PathLike)) or not os.fspath(output_dir):
        raise ValueError(f"{what} must be a non-empty path, got {output_dir!r}.")
    path = Path(os.fspath(output_dir)).expanduser()
    resolved = path.resolve()
    for source in inputs:
        source_path = Path(os.fspath(source)).expanduser().resolve()
        if resolved == source_path or source_path in resolved.parents or resolved in source_path.parents:
            raise ValueError(
                f"{what} {str(path)!r} overlaps the input {os.fspath(source)!r}: writing there would overwrite it."
            )
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"{what} {str(path)!r} is a file, not a directory.")
    # the directory, or the nearest existing one above it, in which it will be created
    existing = next(directory for directory in (resolved, *resolved.parents) if directory.exists())
    if existing.is_dir():
        _check_writable(existing, what, path)
    content = sorted(child.name for child in path.iterdir() if child.name != LOCK_FILE) if path.is_dir() else []
    if not overwrite and content:
        remedy = f"pass {overwrite_option}" if overwrite_option else "empty it"
        raise FileExistsError(
            f"{what} {str(path)!r} already exists and is not empty ({content[:5]}); choose another directory or "
            f"{remedy}."
        )
    return path


def check_result_files(output_dir, names: Iterable[str], inputs: Iterable = (), *, overwrite: bool = False,
                       what: str = "--output_dir") -> Path:
    """The result files `names` that a run writes into `output_dir`, a directory that may hold other files (an
    evaluation may write its scores beside the model it reads): `output_dir` is a writable directory (or missing),
    no result file that exists is an input or a file of an input directory, and none exists unless `overwrite`."""
    path = check_output_dir(output_dir, overwrite=True, what=what)
    existing = [name for name in names if (path / name).exists()]
    if existing and not overwrite:
        raise FileExistsError(
            f"{what} {str(path)!r} already holds {existing}, which this run would replace; pass "
            f"--overwrite_output_dir True to replace them, or choose another {what}."
        )
    inputs = list(inputs)
    for name in existing:
        check_output_file(path / name, inputs, what="Result file")
    return path


def _lock(file, operation: int, directory: Path, what: str) -> None:
    """`flock(file, operation)` without waiting; held by another run: an error naming that run (the lock file's
    text)."""
    try:
        fcntl.flock(file, operation | fcntl.LOCK_NB)
    except BlockingIOError:
        file.seek(0)
        holder = file.read().strip() or "which has not written its name yet"
        raise RuntimeError(
            f"{what} {str(directory)!r} is in use by another run ({holder}); two runs writing there would replace "
            f"each other's files. Wait for that run to end, or choose another {what}."
        ) from None


def check_not_in_use(output_dir, what: str = "--output_dir") -> None:
    """Refuse an output dir that a running run holds (`lock_output_dir`), naming it, without writing anything: a
    run started while another writes there learns so first, before the other checks of the directory."""
    lock_path = Path(os.fspath(output_dir)).expanduser() / LOCK_FILE
    if lock_path.is_file():
        # a shared lock: two runs checking at once do not take each other for the holder
        with open(lock_path, encoding="utf-8") as file:
            _lock(file, fcntl.LOCK_SH, lock_path.parent, what)


@contextlib.contextmanager
def lock_output_dir(output_dir, what: str = "--output_dir") -> Iterator[Path]:
    """Hold an exclusive lock on `output_dir` (created if missing) for the body: a second run into the same
    directory is refused at once, naming this one (pid, host, start time, command). The lock is `flock` on
    `output_dir/_run.lock`, which the kernel releases however the process ends, so a killed run leaves no stale
    lock; the file stays, and `check_output_dir` does not count it as content."""
    directory = Path(os.fspath(output_dir)).expanduser()
    directory.mkdir(parents=True, exist_ok=True)
    # "a+": opened without truncating, so that the holder's name is still there for a refused run to read
    with open(directory / LOCK_FILE, "a+", encoding="utf-8") as file:
        _lock(file, fcntl.LOCK_EX, directory, what)
        file.truncate(0)
        file.write(
            f"pid {os.getpid()} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}: "
            f"{shlex.join(sys.argv)}\n"
        )
        file.flush()
        yield directory


# the file system's refusals of written data: a full disk, a quota, a file above the file system's or the
# process's size limit (FAT32's 4 GiB, `ulimit -f`)
_REFUSALS = {
    errno.ENOSPC: "the disk is full or a quota is reached",
    errno.EDQUOT: "the disk is full or a quota is reached",
    errno.EFBIG: "a file grew larger than the file system or this process's file size limit (`ulimit -f`) allows",
}
# what the savers say without an errno: torch.save "unexpected pos 191616 vs 191504" / "file write failed" on a full
# disk, safetensors "I/O error: No space left on device (os error 28)" / "File too large (os error 27)"
_FULL_DISK_MESSAGES = ("unexpected pos", "file write failed")


def refused_write(error: BaseException) -> int | None:
    """The errno of `error` when it is the file system refusing written data (`_REFUSALS`), also where a saver's
    error names only the reason; None for any other error."""
    if isinstance(error, OSError) and error.errno is not None:
        return error.errno if error.errno in _REFUSALS else None
    text = str(error)
    for code in _REFUSALS:
        if os.strerror(code) in text:
            return code
    return errno.ENOSPC if any(message in text for message in _FULL_DISK_MESSAGES) else None


def check_write_error(error: BaseException, path, what: str, *, removed: bool = False) -> None:
    """Called with the error of a failed save of `path`: when the file system refused the data (`refused_write`:
    ENOSPC, EDQUOT, EFBIG), raise an `OSError` of that errno naming `path`, the reason, the free space and what to
    do; any other error is the caller's to re-raise. `removed`: the caller deleted what the save left there."""
    code = refused_write(error)
    if code is None:
        return
    target = Path(os.fspath(path)).absolute()
    free = shutil.disk_usage(next(p for p in (target, *target.parents) if p.exists())).free
    remedy = (
        "write to another file system, raise the limit (`ulimit -f unlimited`) or save smaller files "
        "(`save_pretrained(max_shard_size=...)`)" if code == errno.EFBIG
        else "free space (e.g. fewer checkpoints: --save_total_limit) or write to a larger disk"
    )
    left = ("Nothing of it is left there: the incomplete files were removed" if removed
            else "Its files there are incomplete: delete them")
    raise OSError(
        code,
        f"Could not save {what} {os.fspath(path)!r}: {_REFUSALS[code]} ({free / 2**20:.0f} MiB free there now; the "
        f"write failed with: {str(error).strip()[:200]}). {left}; {remedy}, and run again.",
    ) from error


def check_save_directory(save_directory) -> None:
    """`save_pretrained` target: refuse an existing file (transformers only logs an error and saves nothing)."""
    if not isinstance(save_directory, (str, os.PathLike)) or not os.fspath(save_directory):
        raise ValueError(f"save_directory must be a non-empty path, got {save_directory!r}.")
    if os.path.isfile(save_directory):
        raise FileExistsError(
            f"save_directory {os.fspath(save_directory)!r} is an existing file; save_pretrained needs a directory."
        )


def check_distributed_launch(use_cpu: bool, script: str) -> None:
    """Refuse a multi-process launch (`accelerate launch`, `torchrun`: `LOCAL_WORLD_SIZE` > 1) on a machine with
    fewer GPUs than processes, unless the run is on CPUs (`--use_cpu True`, `accelerate launch --cpu`). Without a GPU
    each process sets itself up as a single-process run (accelerate only logs a warning), so N processes would
    train N separate models into the same output dir and exit successfully."""
    processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    on_cpu = use_cpu or os.environ.get("ACCELERATE_USE_CPU", "false").lower() in ("1", "true", "yes")
    if processes <= 1 or on_cpu:
        return
    gpus = torch.accelerator.device_count()
    if gpus < processes:
        raise ValueError(
            f"Launched as {processes} processes on this machine (LOCAL_WORLD_SIZE={processes}, e.g. by `accelerate "
            f"launch --config_file examples/accelerate_multigpu.yaml`) but {gpus} GPU(s) are visible: the processes "
            f"would not form one distributed run but train {processes} separate models into the same --output_dir. "
            f"Launch one process per GPU (`accelerate launch --num_processes N`), or train data-parallel on CPUs: "
            f"`CUDA_VISIBLE_DEVICES= accelerate launch --multi_gpu --num_processes {processes} {script} ... "
            "--use_cpu True`."
        )
