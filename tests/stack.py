"""Which engines a test's bot runs on: the embedded default or the scale-out stack.

The embedded default is one SQLite file and a local Chroma directory in the data
directory. The scale-out stack is the session's real PostgreSQL (tests/pg.py) for state
and the session's real Chroma server (`chroma run`, tests/chroma_server.py) for
episodes, both on 127.0.0.1. A test opts in with `on_every_stack` (or a module with
`pytestmark = on_every_stack`): it then runs once per stack, and every settings object
`make_settings` builds, and every bot process started with `stack.env(...)`, uses that
stack.

Each data directory gets its own PostgreSQL database and its own Chroma database, made
on first use and kept for the test, so a restart in the same directory (a new runtime,
or a killed and restarted process) finds its state and episodes again, and two bots in
two directories stay apart as two SQLite files would.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.chroma_server import ChromaServer
from tests.pg import PostgresServer

EMBEDDED = "sqlite+embedded"
SCALE_OUT = "postgresql+chroma-server"
#: Only the Chroma server, state in SQLite: what SONALITY_TEST_CHROMA=server selects.
CHROMA_SERVER_ONLY = "sqlite+chroma-server"

#: Run a test (or, as `pytestmark`, a module) on the embedded default and the scale-out
#: stack. Two stacks, not four: PostgreSQL with embedded Chroma is covered where the
#: test is about storage (tests/storage runs every storage test on both engines).
on_every_stack = pytest.mark.parametrize("stack", [EMBEDDED, SCALE_OUT], indirect=True)


@dataclass
class Stack:
    name: str
    postgres: PostgresServer | None = None
    chroma: ChromaServer | None = None
    _databases: dict[Path, str] = field(default_factory=dict)

    @property
    def on_chroma_server(self) -> bool:
        return self.chroma is not None

    def settings(self, data_dir: Path) -> dict[str, str]:
        """The settings that put a bot with this data directory on this stack."""
        key = data_dir.resolve()
        values: dict[str, str] = {}
        if self.postgres is not None:
            if key not in self._databases:
                self._databases[key] = self.postgres.new_database()
            values["DATABASE_URL"] = self._databases[key]
        if self.chroma is not None:
            values["CHROMA_URL"] = self.chroma.url
            values["SONALITY_CHROMA_DATABASE"] = (
                "t" + hashlib.sha256(str(key).encode()).hexdigest()[:32]
            )
        return values

    def database_url(self, data_dir: Path) -> str | None:
        return self.settings(data_dir).get("DATABASE_URL")

    def needs_embedded_memory(self) -> None:
        """Skip a test about the embedded Chroma directory: with a Chroma server the
        bot has none (episodes live in the server)."""
        if self.on_chroma_server:
            pytest.skip(
                f"checks the embedded Chroma directory; on {self.name} episodes live in "
                "the Chroma server"
            )

    def close(self) -> None:
        if self.postgres is not None:
            for url in self._databases.values():
                self.postgres.drop(url)
        self._databases.clear()


def open_stack(name: str, request: pytest.FixtureRequest) -> Stack:
    """The stack called `name`, its servers the session's (started on first use)."""
    if name == EMBEDDED:
        return Stack(name)
    chroma: ChromaServer = request.getfixturevalue("chroma_server")
    if name == CHROMA_SERVER_ONLY:
        return Stack(name, chroma=chroma)
    if name == SCALE_OUT:
        postgres: PostgresServer = request.getfixturevalue("postgres_server")
        return Stack(name, postgres=postgres, chroma=chroma)
    raise ValueError(
        f"unknown test stack {name!r} (SONALITY_TEST_STACK?): "
        f"one of {EMBEDDED}, {SCALE_OUT}, {CHROMA_SERVER_ONLY}"
    )
