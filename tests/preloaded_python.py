"""A Python that has imported the bot's libraries once and forks a child per request.

Why: a bot process the tests start spends about 4.5 of its 6 s of CPU importing the
Anthropic SDK, Chroma, onnxruntime and the platform SDKs; the suite starts over a
hundred of them. A child forked from this process has those libraries in memory
already and imports only the project's own modules, after it has taken the test's
working directory, environment, arguments and standard streams, so the project code
runs as it would in a fresh interpreter (each `.env` read, each setting looked up,
from that child's place). Nothing of the project is imported here.

Run as `python -m tests.preloaded_python SOCKET` (tests/forked_bot.py does, once per
test process). A request on the socket (SOCK_SEQPACKET) is one JSON message
{"module", "args", "cwd", "env", "umask"} carrying three descriptors for stdin, stdout and
stderr; the answer is `pid N` once forked and `exit CODE` when that child ends (the
code negative for a signal, as `asyncio` gives it). End of input on this program's
stdin (the test process is gone) ends it and kills the children still running.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import runpy
import select
import selectors
import signal
import socket
import sys
from typing import Any

#: What the bot imports that costs most; anything missed is imported by the child.
PRELOADED = (
    "anthropic",
    "openai",
    "chromadb",
    "chromadb.api",
    "chromadb.api.client",
    "numpy",
    "tokenizers",
    "discord",
    "discord.app_commands",
    "discord.ext.commands",
    "slack_bolt",
    "slack_bolt.async_app",
    "slack_sdk",
    "slack_sdk.web.async_client",
    "aiohttp",
    "aiohttp.web",
    "aiosqlite",
    "apscheduler.schedulers.asyncio",
    "pydantic",
    "pydantic_settings",
    "psycopg",
    "psycopg_pool",
    "prompt_toolkit",
    "httpx",
    "dotenv",
)

#: The largest request: a JSON of the environment the test gives the child.
MAX_REQUEST = 1 << 20


def preload() -> None:
    """Import `PRELOADED`, then make sure a child forked from here can end normally.

    Not every library survives a fork: onnxruntime's import starts threads, and a
    child forked after it hangs at exit or aborts, so it is not preloaded (numpy's
    OpenBLAS pool stops itself around a fork). A trial child checks this each time.
    """
    for name in PRELOADED:
        with contextlib.suppress(ImportError):  # an optional extra not installed
            importlib.import_module(name)
    pid = os.fork()
    if pid == 0:
        raise SystemExit(0)  # the interpreter's normal exit, atexit and all
    pidfd = os.pidfd_open(pid)
    ended, _, _ = select.select([pidfd], [], [], TRIAL_SECONDS)
    if not ended:
        os.kill(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"a child forked after preloading did not exit cleanly ({status})")


#: How long the trial child may take to exit.
TRIAL_SECONDS = 30


def serve(path: str) -> dict[str, Any]:
    """Answer requests until stdin ends (then exit); returns only in a forked child."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # the socket appears only once everything is loaded
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    while True:
        for key, _ in selector.select():
            if key.data == "parent":  # the test process closed its end: it is gone
                for pid, _conn in running.values():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                os._exit(0)
            if key.data == "accept":
                conn, _ = listener.accept()
                fds: list[int] = []
                try:
                    message, fds, _flags, _addr = socket.recv_fds(conn, MAX_REQUEST, 3)
                    job = json.loads(message)
                except (OSError, ValueError):
                    for fd in fds:  # a request that cannot be read keeps no descriptor
                        os.close(fd)
                    conn.close()
                    continue
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    listener.close()
                    for pidfd, (_pid, other) in running.items():
                        os.close(pidfd)
                        other.close()
                    conn.close()
                    for target, fd in enumerate(fds):
                        os.dup2(fd, target)
                    for fd in fds:
                        os.close(fd)
                    return dict(job)
                for fd in fds:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                running[pidfd] = (pid, conn)
                selector.register(pidfd, selectors.EVENT_READ, "child")
                conn.send(f"pid {pid}".encode())
            else:  # a child ended
                pid, conn = running.pop(key.fd)
                selector.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                with contextlib.suppress(OSError):  # the test stopped listening
                    conn.send(f"exit {os.waitstatus_to_exitcode(status)}".encode())
                conn.close()


def become(job: dict[str, Any]) -> None:
    """Take the request's place, environment, arguments and streams, as `-m` would."""
    os.chdir(job["cwd"])
    if job.get("umask", -1) >= 0:  # as asyncio's `umask=`: else this program's own
        os.umask(job["umask"])
    os.environ.clear()
    os.environ.update(job["env"])
    sys.path[0] = os.getcwd()  # `python -m` puts the working directory first
    sys.orig_argv = [sys.executable, "-m", job["module"], *job["args"]]
    sys.argv = [job["module"], *job["args"]]  # run_module puts the file's path first
    # New stream objects, as the interpreter makes them at its start: the old ones were
    # made for this program's own streams (seekable or not, a terminal or not).
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    _REPLACED.extend((sys.stdin, sys.stdout, sys.stderr))  # kept: they would close 0-2
    sys.stdin = _stream(0, "r", "strict", unbuffered)
    sys.stdout = _stream(1, "w", "strict", unbuffered)
    sys.stderr = _stream(2, "w", "backslashreplace", unbuffered)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr  # type: ignore[misc]


_REPLACED: list[Any] = []


def _stream(fd: int, mode: str, errors: str, unbuffered: bool) -> io.TextIOWrapper:
    raw = io.FileIO(fd, mode, closefd=False)
    buffer: Any = raw
    if mode == "r":
        buffer = io.BufferedReader(raw)
    elif not unbuffered:
        buffer = io.BufferedWriter(raw)
    tty = raw.isatty()
    return io.TextIOWrapper(
        buffer,
        # PYTHONIOENCODING's, else the locale's, as this program's own streams got it
        encoding=os.environ.get("PYTHONIOENCODING", "").split(":")[0] or _REPLACED[fd].encoding,
        errors=errors,
        line_buffering=tty or fd == 2,  # stderr is line-buffered since Python 3.9
        write_through=unbuffered and mode == "w",
    )


if __name__ == "__main__":
    preload()
    child = serve(sys.argv[1])
    become(child)
    # At the top level, so the module's exit is this interpreter's normal one: its
    # exit code, traceback, atexit handlers and thread joins are a fresh process's.
    runpy.run_module(child["module"], run_name="__main__", alter_sys=True)
