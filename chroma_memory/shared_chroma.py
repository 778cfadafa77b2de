"""One Chroma client for every community, reopened before it holds too many indexes.

Why this exists (chromadb 1.5.9, embedded, measured on the bot's 2-core machines):

* The embedded client keeps every HNSW index it has opened in memory until the process
  ends: about 2.6 MB apiece even for a collection of five vectors. A bot that has talked
  with 100 communities carried 260 MB of indexes; one that talks with thousands over a
  week would grow without bound. The 2.6 MB is hnswlib's fixed table of 65,536 locks
  per index; no collection setting (``hnsw`` or ``spann``) makes it smaller.
* Chroma's own bound is a cache of ``RLIMIT_NOFILE // 5`` indexes, and it cannot safely
  be made small: an index evicted from that cache and opened again failed every later
  query with "Error creating hnsw segment reader: Nothing found on disk" (cache of 4,
  40 collections: about one re-read in five, always the same collections, retries did
  not help). ``chroma_memory_limit_bytes`` and the LRU policy are ignored by the Rust
  bindings.
* Closing the whole client does free the memory (100 collections: 391 MB down to
  130 MB, in about 60 ms) and reopening it finds every index and every vector intact.

So :class:`SharedChroma` counts the collections opened since the client started. Once
past ``max_open`` it closes and reopens the client as soon as no call is in flight; new
calls wait only for that reopen. Every Chroma call of the engine runs inside
:meth:`SharedChroma.use`, so no collection handle outlives the client it came from.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Protocol, TypeVar

from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.errors import NotFoundError

from chroma_memory.embedding import close_chroma_client, make_chroma_client

log = logging.getLogger(__name__)
T = TypeVar("T")
U = TypeVar("U")


class ChromaHandle(Protocol):
    """What an episode store needs of its client: :class:`SharedChroma` here, or
    :class:`chroma_memory.server.ServerChroma` for a Chroma server."""

    @property
    def client(self) -> ClientAPI: ...

    def use(self) -> AbstractContextManager[None]: ...

    def collection(
        self, name: str, *, create: bool, opener: Callable[[ClientAPI, str, bool], Collection]
    ) -> Collection | None: ...

    def drop(self, names: Sequence[str]) -> int: ...

    def both(self, first: Callable[[], T], second: Callable[[], U]) -> tuple[T, U]:
        """Two independent reads (a reply's semantic and episodic queries)."""
        ...


class SharedChroma:
    """The process's Chroma client for one directory, with a bound on open collections.

    ``max_open=None`` never reopens (tests, tools, a single community).
    """

    def __init__(self, persist_dir: str | Path, *, max_open: int | None = None) -> None:
        if max_open is not None and max_open < 1:
            raise ValueError("max_open must be at least 1")
        self.persist_dir = Path(persist_dir)
        self._client = make_chroma_client(self.persist_dir)
        self._max_open = max_open
        self._cond = threading.Condition()
        self._active = 0
        self._reopen_due = False
        self._open: dict[str, Collection] = {}
        #: How many times the client was reopened (shown by benchmarks and tests).
        self.reopens = 0

    @property
    def client(self) -> ClientAPI:
        return self._client

    @property
    def open_collections(self) -> int:
        with self._cond:
            return len(self._open)

    @contextmanager
    def use(self) -> Iterator[None]:
        """Hold the client for one store operation; it is not reopened meanwhile.

        Do not nest: a second ``use`` inside the first would wait for itself when a
        reopen is due.
        """
        with self._cond:
            while self._reopen_due:
                if self._active == 0:
                    self._reopen_locked()
                else:
                    self._cond.wait()
            self._active += 1
        try:
            yield
        finally:
            with self._cond:
                self._active -= 1
                if self._reopen_due and self._active == 0:
                    self._reopen_locked()
                self._cond.notify_all()

    def both(self, first: Callable[[], T], second: Callable[[], U]) -> tuple[T, U]:
        """One after the other: the embedded bindings hold the GIL while they work, so
        running the two at once would gain nothing."""
        return first(), second()

    def collection(
        self, name: str, *, create: bool, opener: Callable[[ClientAPI, str, bool], Collection]
    ) -> Collection | None:
        """The open handle for ``name``, opening it with ``opener`` if needed.

        Only call inside :meth:`use`. Returns None when ``create`` is false and the
        collection does not exist.
        """
        with self._cond:
            found = self._open.get(name)
        if found is not None:
            return found
        try:
            opened = opener(self._client, name, create)
        except NotFoundError:
            if create:
                raise
            return None
        with self._cond:
            found = self._open.setdefault(name, opened)
            if self._max_open is not None and len(self._open) > self._max_open:
                self._reopen_due = True
        return found

    def drop(self, names: Sequence[str]) -> int:
        """Delete these collections and forget their handles (a community the bot was
        removed from), then rebuild Chroma's SQLite file (`vacuum`); returns how many
        existed. Missing ones are fine: a community's
        semantic collection is only made on its first insight."""
        dropped = 0
        with self.use():
            for name in names:
                with self._cond:
                    self._open.pop(name, None)
                try:
                    self._client.delete_collection(name)
                except (NotFoundError, ValueError):
                    continue
                dropped += 1
        if dropped:
            # Chroma's SQLite keeps the dropped documents' text in free pages.
            vacuum(self.persist_dir)
        return dropped

    def reopen_now(self) -> None:
        """Close and reopen the client once no call is in flight (housekeeping, tests)."""
        with self._cond:
            self._reopen_due = True
            while self._active:
                self._cond.wait()
            if self._reopen_due:
                self._reopen_locked()

    def _reopen_locked(self) -> None:
        start = time.perf_counter()
        held = len(self._open)
        self._open.clear()
        close_chroma_client(self.persist_dir)
        _return_free_heap()
        self._client = make_chroma_client(self.persist_dir)
        self._reopen_due = False
        self.reopens += 1
        self._cond.notify_all()
        log.info(
            "reopened Chroma after %d open collections in %.0f ms",
            held,
            (time.perf_counter() - start) * 1000,
        )


def _return_free_heap() -> None:
    """Ask glibc to hand freed heap back to the OS (no-op elsewhere).

    The indexes Chroma just dropped were many small allocations; without this the
    process keeps most of that memory as free heap.
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


def vacuum(persist_dir: Path, *, timeout_seconds: int = 60) -> None:
    """Rebuild Chroma's SQLite file with Chroma's own ``chroma vacuum`` command.

    Why: Chroma's SQLite does not overwrite deleted rows, so a deleted memory's text
    stays in the file's free pages until the file is rebuilt. The command runs in a
    child process because it prints to the process's standard output (the terminal
    community's screen); it waits up to ``timeout_seconds`` for Chroma's write lock.
    Raises RuntimeError if it fails, so a forget-me is retried rather than reported done.
    """
    import subprocess
    import sys

    command = [
        sys.executable,
        "-c",
        "import sys, chromadb_rust_bindings; chromadb_rust_bindings.cli(sys.argv[1:])",
        "chroma",
        "vacuum",
        "--path",
        str(persist_dir),
        "--force",
        "--timeout",
        str(timeout_seconds),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_seconds + 60)
    if done.returncode != 0 or "Vacuum complete" not in done.stdout:
        detail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"chroma vacuum of {persist_dir} failed: {detail[0]}")
