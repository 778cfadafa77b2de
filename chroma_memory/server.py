"""Episodes in a Chroma server (``CHROMA_URL``), reached through chromadb's HttpClient.

Why a server: several bot processes (Discord shards, Slack workers) cannot share one
embedded Chroma directory; a `chroma run` server can serve them all. Embedded Chroma
stays the default for one process.

What stays in the bot: the embedding model. Every vector is computed here (the
embedding lane batches them) and sent with its document; queries send their vector too.
Collections are opened with the bot's embedding function only so that Chroma records
which function made their vectors, as the embedded path does; the server never embeds.

Why Chroma's writes run in the server here: the embedded Rust bindings hold the GIL
while they write, and while the client is closed and reopened to bound the memory of
open indexes. With a server both happen in the server's process. The bot only sends
HTTP requests, and httpx waits on its socket without holding the GIL. Nothing needs
reopening either, as the indexes live in the server's memory.

Why a community's store opens lazily (:class:`ServerCommunityEpisodeStore`): loading a
community must not need the server. If the server is down when a community first
writes, the agent still answers; the memory calls fail, and the engine deals with them
as it does for embedded Chroma: no memories in that reply, and episodes kept in the
outbox until a later write works. The collections are opened by the first call that
reaches the server.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import TypeVar
from urllib.parse import urlsplit

import chromadb
import httpx
from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.api.types import Documents, EmbeddingFunction
from chromadb.config import DEFAULT_DATABASE, DEFAULT_TENANT, Settings
from chromadb.errors import ChromaError, InternalError, NotFoundError

from chroma_memory.community_store import (
    CommunityEpisodeStore,
    ForwardingStore,
    community_collections,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
U = TypeVar("U")

#: How long one request may take before it fails (connect, send, wait, read).
DEFAULT_TIMEOUT_SECONDS = 10.0
#: Threads for the second of two queries a reply makes at once (see ServerChroma.both).
QUERY_THREADS = 4

#: What the server answers (an InternalError) when a read reaches a collection whose
#: vector index it cannot load yet, seen moments after a write (chroma-core/chroma#4212).
INDEX_NOT_READY = "Error creating hnsw segment reader: Nothing found on disk"
#: The pauses before the second and later tries of such a read: short, as a reply waits.
INDEX_RETRY_PAUSES = (0.05, 0.15, 0.4)


class ServerUnreachable(Exception):
    """The server could not be reached, or is no Chroma server: the start-up message."""


def _client_settings(host: str, port: int, ssl: bool) -> Settings:
    return Settings(
        chroma_api_impl="chromadb.api.fastapi.FastAPI",
        chroma_server_host=host,
        chroma_server_http_port=port,
        chroma_server_ssl_enabled=ssl,
        anonymized_telemetry=False,
    )


class ServerChroma:
    """One HTTP client for every community, with the surface of
    :class:`~chroma_memory.shared_chroma.SharedChroma` that episode stores use.

    Collection handles over HTTP are only names and ids, so they are kept for the life
    of the process; nothing is ever reopened (``reopens`` stays 0).
    """

    reopens = 0

    def __init__(
        self,
        url: str,
        *,
        database: str = DEFAULT_DATABASE,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        """Connects at once (chromadb's client checks the server and database as it is
        made): raises :class:`ServerUnreachable` with a one-line reason if it cannot."""
        parts = urlsplit(url)
        ssl = parts.scheme == "https"
        host = parts.hostname or "localhost"
        port = parts.port or (443 if ssl else 8000)
        self.url = url
        self.database = database
        try:
            if database != DEFAULT_DATABASE:
                self._ensure_database(host, port, ssl, database)
            self._client = chromadb.HttpClient(
                host=host,
                port=port,
                ssl=ssl,
                settings=_client_settings(host, port, ssl),
                tenant=DEFAULT_TENANT,
                database=database,
            )
        except Exception as err:  # httpx's ConnectError, a 404 from another server, ...
            raise ServerUnreachable(_reason(err)) from err
        _bound_waits(self._client, timeout)
        self._lock = threading.Lock()
        self._open: dict[str, Collection] = {}
        self._side = ThreadPoolExecutor(QUERY_THREADS, thread_name_prefix="chroma-query")
        self._side_free = threading.BoundedSemaphore(QUERY_THREADS)

    @staticmethod
    def _ensure_database(host: str, port: int, ssl: bool, database: str) -> None:
        """Several bots (or test runs) can share one server, each in its own database."""
        admin = chromadb.AdminClient(_client_settings(host, port, ssl))
        try:
            admin.get_database(database, tenant=DEFAULT_TENANT)
        except NotFoundError:
            try:
                admin.create_database(database, tenant=DEFAULT_TENANT)
            except ChromaError as err:
                # Two bots starting together both found it missing; the other made it.
                try:
                    admin.get_database(database, tenant=DEFAULT_TENANT)
                except ChromaError:
                    raise err from None

    @property
    def client(self) -> ClientAPI:
        return self._client

    @contextmanager
    def use(self) -> Iterator[None]:
        """No reopen ever waits on calls in flight here, so there is nothing to hold."""
        yield

    @property
    def open_collections(self) -> int:
        with self._lock:
            return len(self._open)

    def collection(
        self, name: str, *, create: bool, opener: Callable[[ClientAPI, str, bool], Collection]
    ) -> Collection | None:
        """The handle for ``name``, opened with ``opener`` on first use; None when
        ``create`` is false and the collection does not exist."""
        with self._lock:
            found = self._open.get(name)
        if found is not None:
            return found
        try:
            opened = opener(self._client, name, create)
        except NotFoundError:
            if create:
                raise
            return None
        with self._lock:
            return self._open.setdefault(name, opened)

    def both(self, first: Callable[[], T], second: Callable[[], U]) -> tuple[T, U]:
        """At once: each is a round trip to the server, and httpx waits on its socket
        without holding the GIL, so a community with insights pays for one wait, not
        two, before its reply. With every side thread busy (many replies at once) the
        two run one after the other here, rather than queue behind other replies."""
        if not self._side_free.acquire(blocking=False):
            return first(), second()
        try:
            future = self._side.submit(first)
        except BaseException:
            self._side_free.release()
            raise
        future.add_done_callback(lambda _: self._side_free.release())
        try:
            later = second()
        except BaseException:
            wait([future])
            raise
        return future.result(), later

    def forget(self, names: Sequence[str]) -> None:
        """Drop the cached handles of these collections (see ServerCommunityEpisodeStore._call)."""
        with self._lock:
            for name in names:
                self._open.pop(name, None)

    def drop(self, names: Sequence[str]) -> int:
        """Delete these collections; returns how many existed (see SharedChroma.drop)."""
        dropped = 0
        for name in names:
            self.forget([name])
            try:
                self._client.delete_collection(name)
            except (NotFoundError, ValueError):
                continue
            dropped += 1
        return dropped

    def close(self) -> None:
        self._side.shutdown(wait=True)
        self._client.close()  # type: ignore[attr-defined]  # the concrete Client has it


def _bound_waits(client: ClientAPI, seconds: float) -> None:
    """Give every request a deadline.

    chromadb's HTTP client waits without limit (``httpx.Client(timeout=None)``) and
    offers no setting for it; a server that accepts connections but stops answering
    would then hold a reply's memory lookup, and its worker thread, forever. With a
    deadline the lookup fails and the reply goes out without memories.
    """
    session = getattr(getattr(client, "_server", None), "_session", None)
    if isinstance(session, httpx.Client):
        session.timeout = httpx.Timeout(seconds)
    else:  # a chromadb that changed its internals: say so rather than wait forever
        log.warning("cannot set a timeout on Chroma's HTTP client; requests may wait forever")


def _reason(err: BaseException) -> str:
    """One line: refused connections and timeouts by name, anything else by its text."""
    inner = err
    while not isinstance(inner, httpx.HTTPError):  # chromadb rewords httpx's errors
        cause = inner.__cause__ or inner.__context__
        if cause is None:
            break
        inner = cause
    if isinstance(inner, httpx.HTTPError):
        err = inner
    if isinstance(err, httpx.ConnectError):
        return "connection refused" if "refused" in str(err).lower() else f"cannot connect: {err}"
    if isinstance(err, httpx.TimeoutException):
        return "no answer in time"
    text = " ".join(str(err).split())[:160]
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


class ServerMemory:
    """The memory host for ``CHROMA_URL``: one :class:`ServerChroma`, a lazy store per
    community (see the module's docstring for why lazy)."""

    def __init__(
        self,
        url: str,
        *,
        database: str = DEFAULT_DATABASE,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
    ) -> None:
        self.chroma = ServerChroma(url, database=database, timeout=timeout)

    def store_for(
        self, community_id: str, embedding_function: EmbeddingFunction[Documents]
    ) -> ServerCommunityEpisodeStore:
        """Contacts no server: the store opens its collections on first use."""
        return ServerCommunityEpisodeStore(self.chroma, community_id, embedding_function)

    def reopens(self) -> int:
        return 0

    def drop_community(self, community_id: str) -> int:
        return self.chroma.drop(community_collections(community_id))

    def close(self) -> None:
        self.chroma.close()


class ServerCommunityEpisodeStore(ForwardingStore):
    """One community's memories on the server: a :class:`CommunityEpisodeStore` made on
    the first call that reaches the server, and made again by a later call if that failed.

    Vectors missing from episodes are computed here by the store, never by the server.
    """

    def __init__(
        self,
        chroma: ServerChroma,
        community_id: str,
        embedding_function: EmbeddingFunction[Documents],
    ) -> None:
        self._chroma = chroma
        self._community_id = community_id
        self._embed = embedding_function
        self._store: CommunityEpisodeStore | None = None
        self._lock = threading.Lock()

    def _opened(self) -> CommunityEpisodeStore:
        with self._lock:
            if self._store is None:
                self._store = CommunityEpisodeStore.for_community(
                    self._community_id,
                    None,
                    client=self._chroma,
                    embedding_function=self._embed,
                    # Other bot processes write the same collections.
                    shared=True,
                )
            return self._store

    def _call(self, operation: Callable[[CommunityEpisodeStore], T]) -> T:
        """Run `operation` on the store; once more on a freshly opened one if a
        collection it held is gone.

        Why: another bot process sharing the server may have erased this community
        (the bot was removed from it) and, if it came back, created its collections
        anew under new ids. The handles kept here would then fail every call until a
        restart; opening them again finds whatever the server holds now.
        """
        store = self._opened()
        try:
            return operation(store)
        except NotFoundError:
            with self._lock:
                if self._store is store:
                    self._store = None
            self._chroma.forget(community_collections(self._community_id))
            log.info(
                "%s: its Chroma collections changed on the server; reopened", self._community_id
            )
            return operation(self._opened())

    def _read(self, operation: Callable[[CommunityEpisodeStore], T]) -> T:
        """`_call` for a query, tried again a few times, briefly, when the server cannot
        load the collection's index yet (`INDEX_NOT_READY`).

        Why: that answer is transient (the index of a collection written moments earlier
        is not on the server's disk yet) but, without a retry, it costs the reply its
        memories. Any other error is raised at once; after the last pause the error is
        raised as well, and the reply goes out without memories as before. The caller
        is a worker thread (never the event loop), so sleeping here blocks no one else.
        """
        for pause in INDEX_RETRY_PAUSES:
            try:
                return self._call(operation)
            except InternalError as err:
                if INDEX_NOT_READY not in str(err):
                    raise
                log.info(
                    "%s: the Chroma server cannot read the index yet; trying again in %.2fs",
                    self._community_id,
                    pause,
                )
            time.sleep(pause)
        return self._call(operation)


__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "INDEX_NOT_READY",
    "ServerChroma",
    "ServerCommunityEpisodeStore",
    "ServerMemory",
    "ServerUnreachable",
]
