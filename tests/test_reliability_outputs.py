"""Outputs that are not regular files (issue 26.2): written into, never replaced.

As root (containers, CI) a rename onto a device node or a FIFO puts a plain file in its place; these
tests make the special files in a temporary folder (``os.mknod``: a copy of /dev/null, of /dev/full;
``os.mkfifo``) and check that after a write each is still what it was, and that the content reached
the reader. Each guard is also shown to matter: with it switched off the same write replaces the node.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import sim.cli
import sim.files
from sim.files import OutputError, atomic_paths, write_text

ROOT = Path(__file__).resolve().parent.parent
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="os.mknod of a character device needs root")


def _device(folder: Path, name: str, minor: int) -> Path:
    """A character device node in *folder*: minor 3 is /dev/null, 7 is /dev/full (devices.txt, major 1)."""
    path = folder / name
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
    return path


@root_only
def test_a_device_node_is_written_into_and_stays_a_device(tmp_path):
    null = _device(tmp_path, "null.csv", 3)
    write_text(null, "written into the device\n")
    assert stat.S_ISCHR(os.stat(null).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null.csv"]  # no temporary file left beside it


@root_only
def test_without_the_guard_the_device_node_would_be_replaced(tmp_path, monkeypatch):
    """The bug of issue 26.2, injected: treating every destination as a regular file renames over the node."""
    monkeypatch.setattr(sim.files, "_stream_target", lambda path: None)
    null = _device(tmp_path, "null.csv", 3)
    write_text(null, "x")
    assert stat.S_ISREG(os.stat(null).st_mode)  # what the guard prevents


def test_dev_null_works_and_stays_a_device(capsys):
    code = sim.cli.main(["export", "-s", "gpipe", "-K", "2", "-M", "2", "--format", "text", "-o", "/dev/null"])
    assert code == 0, capsys.readouterr().err
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


@root_only
def test_a_full_device_is_one_line_naming_the_file(tmp_path, capsys):
    full = _device(tmp_path, "full.csv", 7)
    code = sim.cli.main(["export", "-s", "gpipe", "-K", "2", "-M", "2", "-o", str(full)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "full.csv" in err and "No space left" in err
    assert stat.S_ISCHR(os.stat(full).st_mode)


def test_a_fifo_gets_the_content_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "timeline.csv"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_text()))
    reader.start()
    with atomic_paths([fifo, tmp_path / "other.csv"]) as (a, b):
        a.write_text("through the fifo\n")
        b.write_text("a regular file beside it\n")
    reader.join(timeout=30)
    assert got == ["through the fifo\n"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert (tmp_path / "other.csv").read_text() == "a regular file beside it\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.csv", "timeline.csv"]


def test_a_fifo_nobody_reads_is_refused_not_waited_on_forever(tmp_path, monkeypatch):
    monkeypatch.setattr(sim.files, "FIFO_WAIT_S", 0.2)
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="FIFO and no process read it"):
        write_text(fifo, "x")
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and list(tmp_path.iterdir()) == [fifo]


def test_a_link_to_our_stdout_writes_into_stdout_in_order(tmp_path):
    """``-o`` a symlink to /proc/self/fd/1 (and /dev/stdout itself): the file lands in the process's stdout,
    after what it printed before; the link stays a link."""
    link = tmp_path / "out.txt"
    link.symlink_to("/proc/self/fd/1")
    code = ("import sys; from sim.files import write_text; print('before', flush=True); "
            f"write_text({str(link)!r}, 'through the link\\n'); write_text('/dev/stdout', 'through /dev/stdout\\n'); "
            "print('after')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout == "before\nthrough the link\nthrough /dev/stdout\nafter\n"
    assert link.is_symlink() and os.readlink(link) == "/proc/self/fd/1"


def test_a_descriptor_that_is_not_open_is_one_line(tmp_path):
    unused = max(map(int, os.listdir("/proc/self/fd"))) + 1000  # above every descriptor open now
    with pytest.raises(OutputError, match="is not open"):
        write_text(f"/proc/self/fd/{unused}", "x")


def test_a_socket_is_refused(tmp_path):
    import socket

    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as server:
        server.bind(str(path))
        with pytest.raises(OutputError, match="socket"):
            write_text(path, "x")
    assert stat.S_ISSOCK(os.stat(path).st_mode)


@root_only
def test_a_block_device_is_refused(tmp_path):
    disk = tmp_path / "disk"
    os.mknod(disk, stat.S_IFBLK | 0o600, os.makedev(7, 0))  # loop0: refused before anything opens it
    with pytest.raises(OutputError, match="block device"):
        write_text(disk, "x")
    assert stat.S_ISBLK(os.stat(disk).st_mode)


def test_a_regular_file_is_still_replaced_atomically(tmp_path):
    path = tmp_path / "a.csv"
    path.write_text("old")
    inode = os.stat(path).st_ino
    write_text(path, "new")
    assert path.read_text() == "new" and os.stat(path).st_ino != inode  # renamed into place, not rewritten


@pytest.mark.parametrize("filename", ["temporary", None])
def test_a_full_disk_names_the_file_being_written(tmp_path, filename):
    """Issue 26.10: "No space left on device" alone did not say which output could not be written."""
    import errno

    final = tmp_path / "sweep.csv"
    with pytest.raises(OutputError, match=r"cannot write \S*sweep\.csv(, \S*columns\.json)?: No space left on device"):
        with atomic_paths([final, tmp_path / "sweep.columns.json"]) as (tmp, _):
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp) if filename else None)
    assert not list(tmp_path.iterdir())


def test_other_os_errors_of_a_writer_pass_through(tmp_path):
    with pytest.raises(PermissionError):
        with atomic_paths([tmp_path / "a.csv"]):
            raise PermissionError(13, "Permission denied")
    assert not list(tmp_path.iterdir())
