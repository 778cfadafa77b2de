"""A real PostgreSQL server for the tests, started in a temporary directory.

Why pgserver's binaries and not a mock: the PostgreSQL storage engine must be tested
against what PostgreSQL really does (serialization failures, trigger functions, the
"C" collation, psycopg's placeholders). The PyPI package ``pgserver`` ships PostgreSQL
16 server binaries in its wheel, so a fresh clone needs nothing but pip. Its own
start-up code wants to add a system user and loosen the modes of every parent
directory when run as root, so only its binaries are used here: ``initdb`` and
``pg_ctl`` run as ``nobody`` when the tests run as root (PostgreSQL refuses root), the
server listens on 127.0.0.1 on a free port, fsync off (a test server needs no
durability), and is stopped at the end of the session.

Each test gets a database of its own, copied from a template: ``migrated`` (the
current schema, which `Database.open_url` then finds up to date) or ``empty``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from itertools import count
from pathlib import Path

import pytest


def _bin_dir() -> Path | None:
    # Found without importing it: its __init__ sets up runtime directories it is not
    # asked to use here.
    spec = importlib.util.find_spec("pgserver")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "pginstall" / "bin"
    return path if (path / "pg_ctl").exists() else None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PostgresServer:
    """One server for the session; `new_database` makes each test its own database."""

    def __init__(self, base: Path, bindir: Path) -> None:
        self.base = base
        self.bindir = bindir
        self.data = base / "data"
        self.port = _free_port()
        self._names = count(1)
        self._user: pwd.struct_passwd | None = None
        if os.geteuid() == 0:
            self._user = pwd.getpwnam("nobody")

    def _run(self, *args: str) -> None:
        command = [str(self.bindir / args[0]), *args[1:]]
        if self._user is not None:
            command = [
                "setpriv",
                f"--reuid={self._user.pw_uid}",
                f"--regid={self._user.pw_gid}",
                "--clear-groups",
                *command,
            ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            log = self.data / "server.log"
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise RuntimeError(
                f"{args[0]} failed ({done.returncode}): {done.stderr.strip()[-2000:]}\n{tail}"
            )

    def start(self) -> None:
        self.base.chmod(0o755)
        self.data.mkdir(mode=0o700)
        if self._user is not None:
            os.chown(self.data, self._user.pw_uid, self._user.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "--auth=trust",
            "--encoding=UTF8",
            "--locale=C.UTF-8",
            "--no-sync",
        )
        self._run(
            "pg_ctl",
            "-D",
            str(self.data),
            "-w",
            "-l",
            str(self.data / "server.log"),
            "-o",
            f"-h 127.0.0.1 -p {self.port} -k {self.data} -F -c max_connections=300",
            "start",
        )

    def stop(self) -> None:
        with contextlib.suppress(subprocess.SubprocessError, OSError, RuntimeError):
            self._run("pg_ctl", "-D", str(self.data), "-w", "-m", "immediate", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(sql)

    def new_database(self, template: str = "template0") -> str:
        """A fresh database copied from `template`; returns its URL."""
        name = f"t{next(self._names)}"
        self.admin(f'CREATE DATABASE "{name}" TEMPLATE "{template}" STRATEGY FILE_COPY')
        return self.url(name)

    def drop(self, url: str) -> None:
        name = url.rsplit("/", 1)[1]
        with contextlib.suppress(Exception):
            self.admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def running_postgres(bindir: Path, prefix: str) -> Iterator[PostgresServer]:
    """A started server in a new temporary directory, stopped and removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix=prefix))
    server = PostgresServer(base, bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bindir = _bin_dir()
    if bindir is None:
        pytest.fail("pgserver is not installed: `pip install -e .[dev]` installs it")
    if os.geteuid() == 0 and shutil.which("setpriv") is None:
        pytest.fail("the tests run as root and setpriv (util-linux) is missing")
    with running_postgres(bindir, "sonality-pg-") as server:
        yield server
