"""A real Chroma server (`chroma run`, shipped in the chromadb package) on 127.0.0.1.

One server per test session (`chroma_server`); each test keeps apart from the others in
a Chroma database of its own (`ChromaServer.fresh_database`). A test that stops or
kills its server starts one of its own with `running_chroma_server`.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sonality.memory.freed_memory import scrubbing_environment

START_TIMEOUT_SECONDS = 60.0


@dataclass
class ChromaServer:
    url: str
    process: subprocess.Popen[bytes]
    path: Path
    log: Path

    @staticmethod
    def fresh_database() -> str:
        """A database name no other test uses (the server creates it on first use)."""
        return f"t{uuid.uuid4().hex}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _chroma_cli() -> str:
    beside = Path(sys.executable).with_name("chroma")
    if beside.exists():
        return str(beside)
    found = shutil.which("chroma")
    if found is None:
        raise RuntimeError("the `chroma` command (from the chromadb package) is not installed")
    return found


def start_chroma_server(path: Path, port: int | None = None) -> ChromaServer:
    """Start `chroma run` on `path` and wait until its heartbeat answers."""
    port = port or free_port()
    path.mkdir(parents=True, exist_ok=True)
    log = path.parent / f"{path.name}-{port}.log"
    # glibc settings as the bot's and docker-compose.scale.yml's: no freed memory in files
    env = scrubbing_environment({**os.environ, "ANONYMIZED_TELEMETRY": "False", "NO_COLOR": "1"})
    with log.open("ab") as out:
        process = subprocess.Popen(
            [_chroma_cli(), "run", "--path", str(path), "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
    server = ChromaServer(f"http://127.0.0.1:{port}", process, path, log)
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    # One client for every try: each `httpx.get` would build a TLS context (65 ms).
    with httpx.Client(timeout=2) as client:
        while True:
            if process.poll() is not None:
                raise RuntimeError(f"chroma run exited with {process.returncode}: {_tail(log)}")
            try:
                if client.get(f"{server.url}/api/v2/heartbeat").status_code == 200:
                    return server
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                stop_chroma_server(server)
                raise RuntimeError(f"chroma run did not answer in time: {_tail(log)}")
            time.sleep(0.05)


def stop_chroma_server(server: ChromaServer) -> None:
    if server.process.poll() is None:
        os.kill(server.process.pid, signal.SIGCONT)  # in case a test left it stopped
        server.process.terminate()
        try:
            server.process.wait(10)
        except subprocess.TimeoutExpired:
            server.process.kill()
            server.process.wait(10)


def _tail(log: Path) -> str:
    try:
        return " | ".join(log.read_text(errors="replace").splitlines()[-5:])
    except OSError:
        return "(no log)"


@contextmanager
def running_chroma_server(path: Path, port: int | None = None) -> Iterator[ChromaServer]:
    server = start_chroma_server(path, port)
    try:
        yield server
    finally:
        stop_chroma_server(server)


@pytest.fixture(scope="session")
def chroma_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChromaServer]:
    with running_chroma_server(tmp_path_factory.mktemp("chroma-server") / "data") as server:
        yield server
