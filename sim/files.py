"""Writing output files so that a file which looks complete is complete; reading input files the same way everywhere.

Every writer of pipesim (CSV, JSON, Parquet, figures, traces, reports) goes through
:func:`atomic_path` (or :func:`atomic_paths` for a set of files that belong together):
the content is written to a hidden temporary file in the destination's folder and
renamed into place only when writing succeeded. An interrupted or failed write leaves
neither a partial file nor a stray temporary one, and a destination that cannot be
written (an existing folder, a read-only folder) is refused with one line naming it
before any work, not after.

    with atomic_path("reports/sweep.csv") as tmp:
        frame.to_csv(tmp, index=False)

A destination that is not a regular file is never replaced (as root, a rename onto ``/dev/null`` would put a
plain file in its place): a character device (``/dev/null``, a terminal) or a FIFO is written into, and a
path that names one of this process's open descriptors (``/dev/stdout``, ``/dev/fd/N``, ``/proc/self/fd/N``,
or a link to one) is written into that descriptor, after the content is complete, as the shell's ``>``
would. A FIFO that no process reads within :data:`FIFO_WAIT_S` seconds, a block device (a disk) and a
socket are refused with one line.
"""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import re
import stat
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from sim.errors import PipesimError, quote

__all__ = ["OutputError", "InputError", "atomic_path", "atomic_paths", "write_text", "check_writable",
           "check_output_dir", "check_writable_dir", "read_text", "read_json", "read_csv_rows", "read_spec",
           "preset_or_file", "FIFO_WAIT_S"]

FIFO_WAIT_S = 10.0
"""Seconds an output FIFO may wait for a reader before it is refused (the shell's ``>`` would wait forever)."""


class OutputError(PipesimError):
    """An output path that cannot be written: names the path and why."""


class InputError(PipesimError):
    """An input file that cannot be read as text: missing, a folder, or not UTF-8 (a binary file)."""


def read_text(path: str | os.PathLike, *, what: str = "file", error: type[PipesimError] = InputError) -> str:
    """The text of input file *path*, for every reader of pipesim: UTF-8, with or without the byte-order mark
    Excel writes (``utf-8-sig``). A missing, unreadable or binary file raises *error* naming *what* and the path."""
    path = Path(path)
    name = quote(str(path), 200)
    try:
        data = path.read_bytes()
    except IsADirectoryError:
        raise error(f"cannot read {what} {name}: it is a folder, not a file") from None
    except OSError as exc:
        raise error(f"cannot read {what} {name}: {exc.strerror or exc}") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(f"{what} {name} is not UTF-8 text (byte {exc.start} is {data[exc.start:exc.start + 1]!r}); "
                    f"is it a binary file? Give the text file") from None
    if "\0" in text:  # valid UTF-8, but no text file of ours holds NUL bytes; csv would choke on them
        raise error(f"{what} {name} holds NUL bytes; is it a binary file? Give the text file")
    return text



def read_json(path: str | os.PathLike, *, what: str, error: type[PipesimError], expected: str):
    """The JSON value of input file *path* (read as :func:`read_text`). An empty file, text that is not JSON
    (also an integer of more than 4300 digits) or nesting past Python's recursion limit raises *error*
    naming *what*; *expected* says what the file should hold."""
    name = quote(str(path), 200)
    text = read_text(path, what=what, error=error)
    if not text.strip():
        raise error(f"{what} {name} is empty; expected {expected}")
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError, or an integer of more than 4300 digits
        raise error(f"{what} {name} is not valid JSON: {exc}") from None
    except RecursionError:
        raise error(f"{what} {name} nests too deeply to be {expected}") from None



def read_spec(path: str | os.PathLike, cls, *, what: str, error: type[PipesimError], required: Sequence[str]):
    """An instance of dataclass *cls* from the JSON object in *path* (read as :func:`read_json`): unknown
    and missing keys (*required*) are refused by name, ``name`` defaults to the file's stem, and *cls*'s
    own validation error is prefixed with the file."""
    from dataclasses import fields

    name = quote(str(path), 200)
    data = read_json(path, what=what, error=error, expected=f"a JSON object with {', '.join(required)}")
    if not isinstance(data, dict):
        raise error(f"{what} {name} must hold a JSON object with {', '.join(required)}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise error(f"{what} {name} has unknown keys {quote(unknown, 200)}; known: {sorted(known)}")
    missing = [k for k in required if k not in data]
    if missing:
        raise error(f"{what} {name} lacks {missing}; it needs {', '.join(required)}")
    data.setdefault("name", Path(path).stem)
    try:
        return cls(**data)
    except error as exc:
        raise error(f"{what} {name}: {exc}") from None
    except TypeError as exc:  # e.g. a value of a type the dataclass cannot take
        raise error(f"{what} {name}: {exc}") from None

def preset_or_file(name_or_path: str, presets: dict, load, *, what: str, error: type[PipesimError]):
    """``presets[name_or_path]()`` for a preset's name, else ``load(name_or_path)`` for a JSON file (a name
    ending in .json or naming an existing file); anything else is an *error* listing the presets."""
    if name_or_path in presets:
        return presets[name_or_path]()
    if name_or_path.endswith(".json") or Path(name_or_path).is_file():
        return load(name_or_path)
    raise error(f"unknown {what} {name_or_path!r}; choose one of: {', '.join(presets)}, or give a .json file")


def read_csv_rows(path: str | os.PathLike, *, what: str, error: type[PipesimError], expected: str) -> list[list[str]]:
    """The rows of CSV input file *path* (read as :func:`read_text`), blank lines and ``#`` comment lines left out.
    A file with no rows, or one csv cannot parse (e.g. a field past its size limit), raises *error*."""
    name = quote(str(path), 200)
    text = read_text(path, what=what, error=error)
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    if not lines:
        raise error(f"{what} {name} is empty; expected {expected}")
    try:
        return list(csv.reader(io.StringIO("\n".join(lines))))
    except csv.Error as exc:
        raise error(f"{what} {name} is not a readable CSV: {exc}") from None

def check_writable(path: str | os.PathLike) -> Path:
    """Refuse, before any work, an output *file* path that cannot be written; return it as a Path.

    The folder is created if missing (as every writer does); an existing folder at the path, or a
    folder we may not write to, is an :class:`OutputError`.
    """
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"cannot write {path}: it is an existing folder; give a file name")
    if _stream_target(path) is not None:  # a device, a FIFO, an open descriptor: written into, not replaced
        return path
    check_output_dir(path.parent if str(path.parent) else Path("."))
    if path.exists() and not os.access(path, os.W_OK):
        raise OutputError(f"cannot write {path}: the file is not writable")
    return path


def check_writable_dir(folder: str | os.PathLike) -> Path:
    """Refuse, before a long run, an output *folder* that could not be created or written (``validate -o DIR``).

    Nothing is created: a run stopped before it writes leaves no empty folder behind. The folder, or its
    nearest existing ancestor (where it would be created), must be a folder we may write into.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"cannot write into {folder}: it is a file, not a folder")
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputError(f"cannot create the folder {folder}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write into {folder}: permission denied on {existing}")
    return folder


def check_output_dir(folder: str | os.PathLike) -> Path:
    """Create *folder* if needed and check that files can be created in it; return it as a Path."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"cannot write into {folder}: it is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"cannot create the folder {folder}: {exc.strerror or exc}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"cannot write into {folder}: permission denied")
    return folder


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to *path*; rename it onto *path* when the block succeeds.

    The temporary name keeps *path*'s suffix (``.name.XXXX.tmp.png``) so writers that pick a
    format from the suffix (matplotlib, pandas' Parquet) still do. On any exception the
    temporary file is removed and the exception propagates; *path* is untouched.
    """
    with atomic_paths([path]) as (tmp,):
        yield tmp


@contextmanager
def atomic_paths(paths: Sequence[str | os.PathLike]) -> Iterator[list[Path]]:
    """:func:`atomic_path` for several files that belong together: all renamed into place, or none.

    A destination that is a character device, a FIFO or an open descriptor (module docstring) gets a private
    temporary file instead, poured into it once every file of the set is complete."""
    finals = [check_writable(p) for p in paths]
    streams = [_stream_target(p) for p in finals]
    temps: list[Path] = []
    try:
        for final, stream in zip(finals, streams):
            where = None if stream is not None else final.parent  # a stream's temporary file: the temp folder
            fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=f".tmp{final.suffix}", dir=where)
            os.close(fd)
            temps.append(Path(name))
            if stream is None:
                os.chmod(name, 0o666 & ~_umask())  # mkstemp makes 0600; the result should look like any other file
        try:
            yield list(temps)
            for tmp, final, stream in zip(temps, finals, streams):
                if stream is None:
                    os.replace(tmp, final)
                else:
                    _pour(tmp, final, stream)
        except OSError as exc:  # a full disk, a quota: the writer names its temporary file, or nothing at all
            if isinstance(exc, BrokenPipeError) or exc.errno not in _STORAGE_ERRNOS:
                raise
            named = [str(f) for t, f in zip(temps, finals) if exc.filename in (str(t), t)] or [str(f) for f in finals]
            raise OutputError(f"cannot write {', '.join(named)}: {exc.strerror or exc}") from None
    finally:
        for tmp in temps:
            tmp.unlink(missing_ok=True)


# errors of the storage itself while writing: the disk or quota is full, the file too large, the disk failing
_STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS}


# ------------------------------------------------------------------------------------- non-regular destinations
# /proc/self/fd/N, /proc/<our pid>/fd/N, /dev/fd/N: this process's descriptor N (proc(5), "/proc/pid/fd/")
_FD_PATH = re.compile(r"/(?:proc/(self|thread-self|\d+)|dev)/fd/(\d+)")


def _stream_target(path: Path) -> int | Path | None:
    """Where a non-regular destination is written: our open descriptor (an int), a character device or FIFO
    to open (its Path), or None for a regular file (or none yet: replaced atomically). Block devices and
    sockets raise :class:`OutputError`."""
    hop = Path(os.path.abspath(path))
    for _ in range(40):  # the kernel's own limit on a chain of links (ELOOP after 40)
        match = _FD_PATH.fullmatch(str(hop))
        if match and match.group(1) in (None, "self", "thread-self", str(os.getpid())):
            fd = int(match.group(2))
            try:
                mode = os.fstat(fd).st_mode
                flags = _fd_flags(fd)
            except OSError:
                raise OutputError(f"cannot write {path}: descriptor {fd} is not open in this process") from None
            if flags & os.O_ACCMODE not in (os.O_WRONLY, os.O_RDWR):
                raise OutputError(f"cannot write {path}: descriptor {fd} is open for reading only")
            _refuse_special(path, mode)
            return fd
        if not hop.is_symlink():
            break
        hop = Path(os.path.abspath(hop.parent / os.readlink(hop)))
    try:
        mode = os.stat(path).st_mode
    except OSError:  # nothing there yet (or a dangling link): an ordinary new file
        return None
    _refuse_special(path, mode)
    return None if stat.S_ISREG(mode) or stat.S_ISDIR(mode) else Path(path)


def _fd_flags(fd: int) -> int:
    import fcntl

    return fcntl.fcntl(fd, fcntl.F_GETFL)


def _refuse_special(path: Path, mode: int) -> None:
    if stat.S_ISBLK(mode):
        raise OutputError(f"cannot write {path}: it is a block device (a disk); pipesim writes files, character "
                          f"devices such as /dev/null, and FIFOs")
    if stat.S_ISSOCK(mode):
        raise OutputError(f"cannot write {path}: it is a socket; give a file, a character device or a FIFO")


def _pour(tmp: Path, final: Path, stream: int | Path) -> None:
    """Copy the finished temporary file *tmp* into *stream*: our descriptor, or a device or FIFO opened here."""
    if isinstance(stream, int):
        for std in (sys.stdout, sys.stderr):  # what was printed before comes before the file, as with `>`
            if std is not None:
                std.flush()
        out = os.dup(stream)
    else:
        out = _open_stream(final, stream)
    try:
        with open(tmp, "rb") as src:
            while chunk := src.read(1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(out, view):]
    except BrokenPipeError:
        raise  # the reader left (`| head`): the command line treats it as it treats stdout
    except OSError as exc:
        raise OutputError(f"cannot write {final}: {exc.strerror or exc}") from None
    finally:
        os.close(out)


def _open_stream(final: Path, path: Path) -> int:
    """A descriptor open for writing on device or FIFO *path*, never blocking forever: a FIFO opened without a
    reader fails at once (ENXIO, fifo(7)), so it is retried until :data:`FIFO_WAIT_S` has passed."""
    deadline = time.monotonic() + FIFO_WAIT_S
    while True:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
        except OSError as exc:
            if exc.errno == errno.ENXIO and time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            if exc.errno == errno.ENXIO:
                raise OutputError(f"cannot write {final}: it is a FIFO and no process read it within "
                                  f"{FIFO_WAIT_S:g} s; start its reader first") from None
            raise OutputError(f"cannot write {final}: {exc.strerror or exc}") from None
        os.set_blocking(fd, True)  # from here on, a slow reader slows the writer, as a pipe does
        return fd


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text(path: str | os.PathLike, text: str) -> Path:
    """Write *text* (UTF-8) to *path* atomically; return the path."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def strict_json(value):
    """*value* as strict JSON data: numpy scalars and arrays to plain numbers and lists, non-finite floats to
    None (null), keys to strings (``json.dumps(..., allow_nan=False)`` then never fails on them)."""
    if hasattr(value, "tolist"):  # numpy scalars and arrays
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value
