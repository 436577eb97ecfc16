"""``--executor dask=ADDR`` with addresses that are not a Dask scheduler (issue 26.3): one line, exit 2, in time.

Every server here is a fake on 127.0.0.1 (an HTTP server answering 400, a listener that never speaks, one
that greets with an HTTP status line, one that speaks Dask's framing): no other address is contacted.
Before the fix, the silent listener and the HTTP server hung distributed.Client for good (its connect
timeout does not cover the handshake) and the greeting one asked numpy for 3.07 EiB.
"""

from __future__ import annotations

import http.server
import os
import socket
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import sim.cli
from sim.search import batch
from sim.search.batch import BatchError

pytest.importorskip("distributed")

ROOT = Path(__file__).resolve().parent.parent


class _Server:
    """A TCP server on 127.0.0.1 that hands every connection to *serve* in a thread."""

    def __init__(self, serve):
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.received: list[bytes] = []
        self._serve = serve
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(self, conn), daemon=True).start()

    def close(self):
        self.sock.close()


def _silent(server, conn):
    conn.recv(1 << 16)  # waits for a request that never comes; the connection stays open


def _greets_with_http(server, conn):
    conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")


def _speaks_dask(server, conn):
    """A handshake framed as distributed does: 8 bytes of length, then a frame count, their lengths, the frames."""
    frames = [b"\x82\xa4name\xa4fake", b""]
    body = struct.pack(f"<Q{len(frames)}Q", len(frames), *map(len, frames)) + b"".join(frames)
    conn.sendall(struct.pack("<Q", len(body)) + body)
    server.received.append(conn.recv(1 << 16))


@pytest.fixture
def server(request):
    made = _Server(request.param)
    yield made
    made.close()


@pytest.fixture
def http_server():
    class Answer400(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_error(400)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answer400)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"tcp://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def _sweep(address: str, tmp_path: Path, capsys) -> tuple[int, str]:
    code = sim.cli.main(["sweep", "-K", "2", "-M", "2", "--schedules", "gpipe", "--no-plots", "--no-progress",
                         "-o", str(tmp_path / "out"), "--executor", f"dask={address}"])
    return code, capsys.readouterr().err


def test_an_http_server_is_refused_in_time(http_server, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(batch, "_CONNECT_TIMEOUT_S", 1.0)
    code, err = _sweep(http_server, tmp_path, capsys)
    assert code == 2 and err.count("\n") == 1 and "did not answer as one within 1 s" in err
    assert not (tmp_path / "out").exists()  # a failed Dask run leaves no empty folder


@pytest.mark.parametrize("server", [_silent], indirect=True)
def test_a_silent_listener_is_refused_in_time(server, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(batch, "_CONNECT_TIMEOUT_S", 1.0)
    code, err = _sweep(server.address, tmp_path, capsys)
    assert code == 2 and err.count("\n") == 1 and "did not answer" in err


@pytest.mark.parametrize("server", [_greets_with_http], indirect=True)
def test_a_server_greeting_in_http_is_not_read_as_a_3_eib_frame(server, tmp_path):
    """As a process: one line on stderr, exit 2, no traceback (neither the MemoryError nor Client.__del__'s)."""
    out = subprocess.run([sys.executable, "-m", "sim", "sweep", "-K", "2", "-M", "2", "--schedules", "gpipe",
                          "--no-plots", "--no-progress", "-o", str(tmp_path / "out"),
                          "--executor", f"dask={server.address}"],
                         capture_output=True, text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "is not a Dask scheduler" in out.stderr and "8786" in out.stderr
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr


@pytest.mark.parametrize("server", [_speaks_dask], indirect=True)
def test_a_server_speaking_dask_passes_the_probe_and_gets_its_handshake_back(server):
    host, port = batch._scheduler_address(server.address)
    batch._probe_scheduler(server.address, host, port, timeout=5.0)
    for _ in range(100):  # the server thread records what came back
        if server.received:
            break
        threading.Event().wait(0.02)
    assert server.received and struct.unpack_from("<Q", server.received[0])[0] == len(server.received[0]) - 8


def test_nothing_listening_is_one_line():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # bound, never listening: connections are refused
        with pytest.raises(BatchError, match="cannot reach"):
            batch._probe_scheduler(f"tcp://127.0.0.1:{port}", "127.0.0.1", port, timeout=2.0)


@pytest.mark.parametrize("address, says", [
    ("inproc://somewhere", "inproc:// reaches only a scheduler inside this same process"),
    ("ucx://127.0.0.1:8786", "ucx:// needs UCX"),
    ("tls://127.0.0.1:8786", "tls:// needs certificates"),
    ("file:///tmp/scheduler.json", "file:// is no Dask transport"),
    ("ws://127.0.0.1:8786", "websocket"),
    ("127.0.0.1:8786", "give the scheduler's address as dask=tcp://HOST:PORT"),
    ("tcp://127.0.0.1", "port from 1 to 65535"),
    ("tcp://127.0.0.1:0", "port from 1 to 65535"),
    ("tcp://127.0.0.1:65536", "port from 1 to 65535"),
    ("tcp://:8786", "port from 1 to 65535"),
    ("tcp://host name:8786", "port from 1 to 65535"),
])
def test_schemes_and_forms_are_refused_before_any_work(address, says, capsys, tmp_path):
    code, err = _sweep(address, tmp_path, capsys)
    assert code == 2 and err.count("\n") == 1 and says in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("address, expected", [("tcp://127.0.0.1:8786", ("127.0.0.1", 8786)),
                                               ("TCP://scheduler.example:1", ("scheduler.example", 1)),
                                               ("tcp://[::1]:8786", ("::1", 8786))])
def test_tcp_addresses_are_parsed(address, expected):
    assert batch._scheduler_address(address) == expected
