"""Start `python -m app` for a test as a child forked from a preloaded Python.

A bot process costs about 6 s of CPU, 4.5 s of it importing libraries
(tests/preloaded_python.py); a forked one about 1.3 s. The child still imports and runs
the project's code from the test's working directory, environment, arguments and
streams, exits the way a fresh interpreter exits, and its exit code reaches the test.

What it does not show is the interpreter's own start: tests about that (the restart
under glibc settings, `--help` before heavy imports, the start-up lock, the exit of a
program without a key) start a fresh interpreter with `asyncio.create_subprocess_exec`
or `subprocess.run`. So does this module, whenever the test's environment would make
the preloaded Python a different one: another PYTHONPATH, other glibc settings, or a
machine without `pidfd_open` (Linux before 5.3).

`ForkedProcess` has the part of `asyncio.subprocess.Process` the tests use.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from asyncio.streams import FlowControlMixin
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from sonality.memory.freed_memory import scrubbing_environment
from tests.checkout import REPO, importing_this_checkout

PIPE = asyncio.subprocess.PIPE
DEVNULL = asyncio.subprocess.DEVNULL
#: asyncio's own limit for a subprocess's stream readers.
STREAM_LIMIT = 2**16

Stream = int | IO[str] | IO[bytes] | None


@dataclass(eq=False)
class ForkedProcess:
    """A forked child the preloaded Python reports on: pid, streams, exit code."""

    pid: int
    ended: asyncio.Future[int]  # its exit code, from the preloaded Python's report
    watcher: asyncio.Task[None]  # reads that report (held here: asyncio holds tasks weakly)
    stdin: asyncio.StreamWriter | None
    stdout: asyncio.StreamReader | None
    stderr: asyncio.StreamReader | None

    @property
    def returncode(self) -> int | None:
        return self.ended.result() if self.ended.done() else None

    async def wait(self) -> int:
        return await asyncio.shield(self.ended)

    async def communicate(self, input: bytes | None = None) -> tuple[bytes, bytes]:
        if self.stdin is not None and input is not None:  # as asyncio: None leaves it open
            self.stdin.write(input)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                await self.stdin.drain()
            self.stdin.close()
        out, err = await asyncio.gather(_read_all(self.stdout), _read_all(self.stderr))
        await self.wait()
        return out, err

    def send_signal(self, sig: int) -> None:
        if self.ended.done():
            raise ProcessLookupError(self.pid)  # as asyncio says of an ended process
        os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __del__(self) -> None:
        # asyncio kills a child whose transport is dropped while it runs; so do we.
        if not self.ended.done():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)


#: What `start_module` gives: forked, or spawned where it cannot fork.
ChildProcess = ForkedProcess | asyncio.subprocess.Process


async def _read_all(stream: asyncio.StreamReader | None) -> bytes:
    return b"" if stream is None else await stream.read()


class _Preloaded:
    """The preloaded Python of this test process, started at its first use."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="preloaded-"))
        self.socket = self.folder / "socket"
        env = scrubbing_environment(importing_this_checkout(os.environ))
        env["PYTHONUNBUFFERED"] = "1"
        self.pythonpath = env["PYTHONPATH"]
        self.tunables = env.get("GLIBC_TUNABLES", "")
        self.log = self.folder / "log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.preloaded_python", str(self.socket)],
                cwd=REPO,
                env=env,
                stdin=subprocess.PIPE,  # its end tells the preloaded Python we are gone
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        atexit.register(self.close)

    def wait_ready(self, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while not self.socket.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the preloaded Python did not start: {self.log.read_text()}")
            time.sleep(0.05)

    def takes(self, env: Mapping[str, str]) -> bool:
        """Whether a child with `env` is the same Python as a fresh `python` would be."""
        return (
            env.get("PYTHONPATH") == self.pythonpath
            and env.get("GLIBC_TUNABLES", "") == self.tunables
        )

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(10)
        shutil.rmtree(self.folder, ignore_errors=True)


_preloaded: _Preloaded | None = None


def _the_preloaded() -> _Preloaded | None:
    global _preloaded
    if _preloaded is None:
        if not _can_fork_here():
            return None
        _preloaded = _Preloaded()
    return _preloaded


def _can_fork_here() -> bool:
    """Linux 5.3 or later (pidfd_open), where the preloaded Python can watch its children."""
    if not hasattr(os, "pidfd_open") or not hasattr(socket, "send_fds"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:  # an older kernel: ENOSYS
        return False
    return True


async def start_module(
    module: str,
    *args: str,
    cwd: Path,
    env: Mapping[str, str],
    stdin: Stream = PIPE,
    stdout: Stream = PIPE,
    stderr: Stream = PIPE,
    umask: int = -1,
) -> ChildProcess:
    """`python -m module args` with these streams (and `umask`, as asyncio takes it):
    forked when it can be, else spawned."""
    preloaded = _the_preloaded()
    # What a fresh `python -m app` runs under once it has restarted itself scrubbed.
    scrubbed = scrubbing_environment(env)
    if preloaded is None or not preloaded.takes(scrubbed):
        return await asyncio.create_subprocess_exec(
            sys.executable, "-m", module, *args,
            cwd=cwd, env=dict(env), stdin=stdin, stdout=stdout, stderr=stderr, umask=umask,
        )  # fmt: skip
    await asyncio.to_thread(preloaded.wait_ready)
    loop = asyncio.get_running_loop()
    given: list[int] = []  # the child's descriptors, sent to the preloaded Python
    made: list[int] = []  # those opened here, closed once sent
    ours: list[int] = []  # our ends of the pipes (-1: none)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    try:
        for index, stream in enumerate((stdin, stdout, stderr)):
            child_end, our_end = _ends(stream, reading=index == 0)
            given.append(child_end)
            ours.append(our_end)
            if stream in (PIPE, DEVNULL):
                made.append(child_end)
        request = {
            "module": module,
            "args": list(args),
            "cwd": str(cwd),
            "env": scrubbed,
            "umask": umask,
        }
        conn.connect(str(preloaded.socket))
        socket.send_fds(conn, [json.dumps(request).encode()], given)
        answer = conn.recv(64).decode()
    except BaseException:
        conn.close()
        for fd in ours:
            if fd >= 0:
                os.close(fd)
        raise
    finally:
        for fd in made:
            os.close(fd)
    if not answer.startswith("pid "):
        conn.close()
        raise RuntimeError(f"the preloaded Python did not fork: {answer!r}")
    pid = int(answer.split()[1])
    conn.setblocking(False)
    ended: asyncio.Future[int] = loop.create_future()

    async def watch() -> None:
        try:
            report = (await loop.sock_recv(conn, 64)).decode()
        finally:
            conn.close()
        if report.startswith("exit "):
            ended.set_result(int(report.split()[1]))
        else:
            ended.set_exception(RuntimeError(f"no exit code for pid {pid}: {report!r}"))

    watcher = loop.create_task(watch())
    writer = await _writer(loop, ours[0]) if ours[0] >= 0 else None
    reader_out = await _reader(loop, ours[1]) if ours[1] >= 0 else None
    reader_err = await _reader(loop, ours[2]) if ours[2] >= 0 else None
    return ForkedProcess(pid, ended, watcher, writer, reader_out, reader_err)


def _ends(stream: Stream, *, reading: bool) -> tuple[int, int]:
    """(the child's descriptor, ours or -1) for one of the child's standard streams."""
    if stream == PIPE:
        read_end, write_end = os.pipe()
        return (read_end, write_end) if reading else (write_end, read_end)
    if stream == DEVNULL:
        return os.open(os.devnull, os.O_RDONLY if reading else os.O_WRONLY), -1
    if isinstance(stream, int):
        return stream, -1
    if stream is None:
        raise ValueError("pass the stream to inherit explicitly (sys.stdin.fileno())")
    return stream.fileno(), -1


async def _reader(loop: asyncio.AbstractEventLoop, fd: int) -> asyncio.StreamReader:
    reader = asyncio.StreamReader(limit=STREAM_LIMIT, loop=loop)
    await loop.connect_read_pipe(
        lambda: asyncio.StreamReaderProtocol(reader, loop=loop), os.fdopen(fd, "rb", 0)
    )
    return reader


async def _writer(loop: asyncio.AbstractEventLoop, fd: int) -> asyncio.StreamWriter:
    transport, protocol = await loop.connect_write_pipe(
        lambda: FlowControlMixin(loop=loop), os.fdopen(fd, "wb", 0)
    )
    return asyncio.StreamWriter(transport, protocol, None, loop)
