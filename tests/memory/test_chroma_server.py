"""What only the Chroma server path has: lazy stores, dropping a community over HTTP,
an unreachable or hung server, and a server restarted on the same directory.

Real `chroma run` servers on 127.0.0.1, real MiniLM vectors computed in this process.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from chromadb.errors import InternalError, NotFoundError

from chroma_memory import server as server_module
from chroma_memory.community_store import collection_name_for
from chroma_memory.embedding import FastMiniLML6V2
from chroma_memory.server import (
    INDEX_NOT_READY,
    ServerChroma,
    ServerMemory,
    ServerUnreachable,
)
from sonality.memory.episodes import SEMANTIC, Episode
from tests.chroma_server import ChromaServer, free_port, running_chroma_server

NUCLEAR = "Nuclear power plants are a safe, low-carbon source of electricity"
TAX = "A progressive income tax with fewer loopholes is fairer"
QUERY = "Is atomic energy dangerous?"


def _episode(episode_id: str, summary: str, memory_type: str = "episodic") -> Episode:
    return Episode(
        id=episode_id, summary=summary, ess_score=0.5, user_message="m", memory_type=memory_type
    )


def test_a_store_opens_on_first_use_and_recalls_what_it_was_given(
    chroma_server: ChromaServer, embedding_function: FastMiniLML6V2
) -> None:
    memory = ServerMemory(chroma_server.url, database=chroma_server.fresh_database())
    try:
        store = memory.store_for("discord:1", embedding_function)
        assert memory.chroma.open_collections == 0  # loading a community asks nothing
        store.store_many([_episode("e1", NUCLEAR), _episode("s1", TAX, SEMANTIC)])
        assert store.count() == 2
        assert store.retrieve_typed(QUERY) == [NUCLEAR]
        (row,) = store.stored(["e1"])
        assert row["document"] == NUCLEAR
        # The vector on the server is the one computed here from the summary.
        raw = memory.chroma.client.get_collection(collection_name_for("discord:1"))
        vector = raw.get(ids=["e1"], include=["embeddings"])["embeddings"][0]  # type: ignore[index]
        assert list(vector) == pytest.approx(list(embedding_function([NUCLEAR])[0]), abs=1e-6)
        store.delete(["e1", "never-stored"])
        assert store.count() == 1
    finally:
        memory.close()


def test_dropping_a_community_deletes_both_its_collections_and_nothing_else(
    chroma_server: ChromaServer, embedding_function: FastMiniLML6V2
) -> None:
    memory = ServerMemory(chroma_server.url, database=chroma_server.fresh_database())
    try:
        gone = memory.store_for("slack:T1", embedding_function)
        kept = memory.store_for("slack:T2", embedding_function)
        gone.store_many([_episode("a", NUCLEAR), _episode("b", TAX, SEMANTIC)])
        kept.store_many([_episode("c", NUCLEAR)])
        assert memory.drop_community("slack:T1") == 2
        assert memory.drop_community("slack:T1") == 0  # a re-run after a crash is fine
        names = {c.name for c in memory.chroma.client.list_collections()}
        assert names == {collection_name_for("slack:T2")}
        assert kept.retrieve(QUERY) == [NUCLEAR]
        # The community can come back later and starts empty.
        assert memory.store_for("slack:T1", embedding_function).count() == 0
    finally:
        memory.close()


def test_a_community_erased_and_recreated_by_another_process_is_found_again(
    chroma_server: ChromaServer, embedding_function: FastMiniLML6V2
) -> None:
    """Two bot processes share the server: one erases a community (the bot was removed)
    and, when the community comes back, stores into collections made anew. The other,
    holding handles to the old collections, reads and writes the new ones."""
    database = chroma_server.fresh_database()
    here, there = (ServerMemory(chroma_server.url, database=database) for _ in range(2))
    try:
        mine = here.store_for("slack:T7", embedding_function)
        mine.store_many([_episode("old", TAX), _episode("insight", TAX, SEMANTIC)])
        assert mine.count() == 2  # handles to both collections are held now
        assert there.drop_community("slack:T7") == 2
        there.store_for("slack:T7", embedding_function).store_many([_episode("new", NUCLEAR)])
        assert mine.retrieve_typed(QUERY) == [NUCLEAR]
        assert mine.count() == 1
        mine.store_many([_episode("later", TAX)])
        assert there.store_for("slack:T7", embedding_function).count() == 2
    finally:
        here.close()
        there.close()


def test_insights_another_process_writes_later_are_recalled_found_and_deleted_here(
    chroma_server: ChromaServer, embedding_function: FastMiniLML6V2
) -> None:
    """Issue 22, finding 14: a store asked once, on first use, whether its community's
    insight collection existed; when another process created it later, this one never
    recalled those insights, and a forget-me here (finding them by text, then deleting
    by id) left them on the server."""
    database = chroma_server.fresh_database()
    here, there = (ServerMemory(chroma_server.url, database=database) for _ in range(2))
    insight = "Atomic energy worries people more than its record warrants"
    try:
        mine = here.store_for("slack:T8", embedding_function)
        mine.store_many([_episode("e1", NUCLEAR)])
        assert mine.retrieve_typed(QUERY) == [NUCLEAR]  # no insight collection yet
        there.store_for("slack:T8", embedding_function).store_many(
            [_episode("s1", insight, SEMANTIC)]
        )
        assert mine.retrieve_typed(QUERY) == [insight, NUCLEAR]
        assert mine.count() == 2
        assert mine.semantic_ids([insight]) == ["s1"]
        mine.delete(["s1"])
        assert there.store_for("slack:T8", embedding_function).retrieve_typed(QUERY) == [NUCLEAR]
    finally:
        here.close()
        there.close()


def test_databases_keep_bots_sharing_a_server_apart(
    chroma_server: ChromaServer, embedding_function: FastMiniLML6V2
) -> None:
    one = ServerMemory(chroma_server.url, database=chroma_server.fresh_database())
    two = ServerMemory(chroma_server.url, database=chroma_server.fresh_database())
    try:
        one.store_for("discord:1", embedding_function).store_many([_episode("e", NUCLEAR)])
        assert two.store_for("discord:1", embedding_function).count() == 0
    finally:
        one.close()
        two.close()


def test_bots_starting_together_on_a_new_database_all_start(chroma_server: ChromaServer) -> None:
    """Each finds the database missing and creates it; all but one are told it exists
    (a two-process test failed on that, 2026-11-29). Every one of them must start."""
    database = chroma_server.fresh_database()
    ready = threading.Barrier(4)
    admins: list[_LookTogether] = []
    started: list[ServerChroma] = []
    failed: list[BaseException] = []
    real_admin = server_module.chromadb.AdminClient

    def admin(*args: Any, **kwargs: Any) -> _LookTogether:
        admins.append(_LookTogether(real_admin(*args, **kwargs), ready))
        return admins[-1]

    def start() -> None:
        try:
            started.append(ServerChroma(chroma_server.url, database=database))
        except BaseException as err:
            failed.append(err)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(server_module.chromadb, "AdminClient", admin)
        threads = [threading.Thread(target=start) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert failed == [] and len(started) == 4
    assert [a.creates for a in admins] == [1, 1, 1, 1]  # each of them tried to create it
    for client in started:
        client.close()


class _LookTogether:
    """An admin client whose first look finds the database missing once every bot has
    looked, as when each looks before any creates it."""

    def __init__(self, inner: Any, ready: threading.Barrier) -> None:
        self.inner, self.ready, self.looks, self.creates = inner, ready, 0, 0

    def get_database(self, name: str, tenant: str) -> Any:
        self.looks += 1
        if self.looks == 1:
            self.ready.wait(timeout=30)
            raise NotFoundError(f"Database {name} not found")
        return self.inner.get_database(name, tenant=tenant)

    def create_database(self, name: str, tenant: str) -> None:
        self.creates += 1
        self.inner.create_database(name, tenant=tenant)


def test_nothing_listening_is_one_clear_reason() -> None:
    with pytest.raises(ServerUnreachable, match=r"^connection refused$"):
        ServerChroma(f"http://127.0.0.1:{free_port()}")


def test_a_hung_server_fails_calls_instead_of_holding_them_and_a_restart_loses_nothing(
    tmp_path: Path, embedding_function: FastMiniLML6V2
) -> None:
    """A stopped (SIGSTOP) server accepts connections but never answers: each call
    fails after the timeout, and works again once the server does. Stopped for good and
    started again on the same directory, the server still holds every episode."""
    path = tmp_path / "server"
    with running_chroma_server(path) as server:
        memory = ServerMemory(server.url, timeout=1.0)
        store = memory.store_for("discord:9", embedding_function)
        store.store_many([_episode("e1", NUCLEAR)])
        os.kill(server.process.pid, signal.SIGSTOP)
        try:
            with pytest.raises(Exception, match=r"(?i)timed out"):
                store.retrieve_typed(QUERY)
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
        assert store.retrieve_typed(QUERY) == [NUCLEAR]
        memory.close()
        port = int(server.url.rsplit(":", 1)[1])
    with running_chroma_server(path, port) as again:
        memory = ServerMemory(again.url)
        try:
            assert memory.store_for("discord:9", embedding_function).retrieve(QUERY) == [NUCLEAR]
        finally:
            memory.close()


class IndexNotReadyYet(httpx.BaseTransport):
    """The HTTP transport under chromadb's client: the next `failures` queries get the
    answer the server gives when it cannot load a collection's index yet (chroma-core/
    chroma#4212: status 500, the JSON chromadb turns into its InternalError); every other
    request goes on to the real server."""

    def __init__(self, inner: httpx.BaseTransport, message: str, failures: int) -> None:
        self.inner = inner
        self.message = message
        self.failures = failures
        self.queries = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path.endswith("/query"):
            self.queries += 1
            if self.failures > 0:
                self.failures -= 1
                body = {"error": "InternalError", "message": self.message}
                return httpx.Response(500, json=body, request=request)
        return self.inner.handle_request(request)


def _flaky(memory: ServerMemory, message: str, failures: int) -> IndexNotReadyYet:
    session = memory.chroma.client._server._session  # type: ignore[attr-defined]
    assert isinstance(session, httpx.Client)
    flaky = IndexNotReadyYet(session._transport, message, failures)
    session._transport = flaky
    return flaky


PLAN_FAILED = f"Error executing plan: Internal error: {INDEX_NOT_READY}"


@pytest.fixture
def no_pauses(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_module, "INDEX_RETRY_PAUSES", (0.0, 0.0, 0.0))


@pytest.mark.usefixtures("no_pauses")
def test_a_query_the_server_cannot_read_yet_is_tried_again_and_recalls(
    chroma_server: ChromaServer, embedding_function: FastMiniLML6V2
) -> None:
    memory = ServerMemory(chroma_server.url, database=chroma_server.fresh_database())
    try:
        store = memory.store_for("discord:3", embedding_function)
        store.store_many([_episode("e1", NUCLEAR)])
        flaky = _flaky(memory, PLAN_FAILED, failures=2)
        assert store.retrieve(QUERY) == [NUCLEAR]
        assert flaky.queries == 3
        # Never readable: a few tries, then the error, as before (no memories).
        flaky.failures, flaky.queries = 100, 0
        with pytest.raises(InternalError, match="Nothing found on disk"):
            store.retrieve(QUERY)
        assert flaky.queries == len(server_module.INDEX_RETRY_PAUSES) + 1
    finally:
        memory.close()


def test_a_community_with_insights_asks_for_both_kinds_of_memory_at_once(
    chroma_server: ChromaServer,
    embedding_function: FastMiniLML6V2,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each query is a round trip to the server: the reply waits for one, not two. Both
    queries meet at a barrier, which only two at once can pass."""
    from chromadb.api.models.Collection import Collection

    memory = ServerMemory(chroma_server.url, database=chroma_server.fresh_database())
    try:
        store = memory.store_for("discord:both", embedding_function)
        insight = "Atomic energy worries people more than its record warrants"
        store.store_many([_episode("e1", NUCLEAR), _episode("s1", insight, SEMANTIC)])
        barrier = threading.Barrier(2, timeout=30)  # broken, not hung, if they never meet
        original = Collection.query

        def meeting(self: Collection, *args: Any, **kwargs: Any) -> Any:
            barrier.wait()
            return original(self, *args, **kwargs)

        monkeypatch.setattr(Collection, "query", meeting)
        assert store.retrieve_typed(QUERY) == [insight, NUCLEAR]  # insights first, as ever
    finally:
        memory.close()


@pytest.mark.usefixtures("no_pauses")
def test_any_other_server_error_on_a_query_is_not_tried_again(
    chroma_server: ChromaServer, embedding_function: FastMiniLML6V2
) -> None:
    memory = ServerMemory(chroma_server.url, database=chroma_server.fresh_database())
    try:
        store = memory.store_for("discord:4", embedding_function)
        store.store_many([_episode("e1", NUCLEAR)])
        flaky = _flaky(memory, "Error executing plan: something else broke", failures=1)
        with pytest.raises(InternalError, match="something else broke"):
            store.retrieve_typed(QUERY)
        assert flaky.queries == 1
        assert store.retrieve_typed(QUERY) == [NUCLEAR]
    finally:
        memory.close()


def test_with_every_side_thread_busy_the_two_queries_run_one_after_the_other(
    chroma_server: ChromaServer,
) -> None:
    """Many replies at once: a query never queues behind other replies' side queries."""
    from chroma_memory.server import QUERY_THREADS

    chroma = ServerChroma(chroma_server.url, database=chroma_server.fresh_database())
    try:
        assert chroma.both(threading.current_thread, threading.current_thread)[0] is not (
            threading.current_thread()
        )
        for _ in range(QUERY_THREADS):  # every side thread taken by other replies
            assert chroma._side_free.acquire(blocking=False)
        first, second = chroma.both(threading.current_thread, threading.current_thread)
        assert first is second is threading.current_thread()
    finally:
        chroma.close()
