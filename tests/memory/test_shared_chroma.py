"""SharedChroma: the client is reopened past a bound, and nothing is lost or misread."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from chroma_memory.community_store import CommunityEpisodeStore
from chroma_memory.embedding import FastMiniLML6V2, make_chroma_client
from chroma_memory.shared_chroma import SharedChroma
from sonality.memory.episodes import SEMANTIC, Episode

TOPICS = {
    "nuclear": (
        "Nuclear power plants are a safe, low-carbon source of electricity",
        "atomic energy",
    ),
    "bread": ("Sourdough bread needs a long, cold fermentation for flavour", "making bread rise"),
    "football": ("A high press with a back three suits modern football tactics", "soccer strategy"),
    "tax": ("A progressive income tax with fewer loopholes is fairer", "taxing the rich"),
    "cycling": ("Protected bike lanes make city cycling much safer", "riding a bicycle in town"),
}


def _stores(chroma: SharedChroma, ef: FastMiniLML6V2) -> dict[str, CommunityEpisodeStore]:
    return {
        name: CommunityEpisodeStore.for_community(
            f"test:{name}", chroma.persist_dir, client=chroma, embedding_function=ef
        )
        for name in TOPICS
    }


def test_reopens_past_the_bound_and_every_store_keeps_its_memories(
    persist_dir: Path, embedding_function: FastMiniLML6V2
) -> None:
    chroma = SharedChroma(persist_dir, max_open=2)
    first_client = chroma.client
    stores = _stores(chroma, embedding_function)
    for name, store in stores.items():
        store.store("m", "r", 0.5, [name], TOPICS[name][0], episode_id=f"{name}-1")
    assert chroma.reopens >= 2
    assert chroma.client is not first_client
    assert chroma.open_collections <= 3  # the bound, plus the one that tipped it over

    # Stores made before the reopens fetch fresh handles and find their own memory by
    # meaning; none sees another community's.
    for name, store in stores.items():
        summary, paraphrase = TOPICS[name]
        assert store.retrieve(paraphrase, min_relevance=-1.0) == [summary]
        assert store.count() == 1


def test_semantic_memories_survive_a_reopen(
    persist_dir: Path, embedding_function: FastMiniLML6V2
) -> None:
    chroma = SharedChroma(persist_dir, max_open=1)
    store = CommunityEpisodeStore(persist_dir, client=chroma, embedding_function=embedding_function)
    insight = "The community values evidence from field trials over anecdotes"
    store.store_many(
        [
            Episode(id="s1", user_message="", agent_response="", ess_score=0.0, topics=(),
                    summary=insight, memory_type=SEMANTIC),
            Episode(id="e1", user_message="m", agent_response="r", ess_score=0.5, topics=(),
                    summary=TOPICS["nuclear"][0]),
        ]
    )  # fmt: skip
    chroma.reopen_now()
    assert store.retrieve_typed("what evidence do people here trust?", min_relevance=-1.0)[0] == (
        insight
    )


def test_concurrent_stores_through_a_tiny_bound_never_fail(
    persist_dir: Path, embedding_function: FastMiniLML6V2
) -> None:
    """Five communities on four threads with room for two open collections: reopens
    happen while others are mid-call, and every call still succeeds with its own data."""
    chroma = SharedChroma(persist_dir, max_open=2)
    stores = _stores(chroma, embedding_function)

    def work(name: str) -> list[str]:
        store = stores[name]
        found: list[str] = []
        for i in range(4):
            store.store("m", "r", 0.5, [name], TOPICS[name][0], episode_id=f"{name}-{i % 2}")
            found = store.retrieve(TOPICS[name][1], min_relevance=-1.0)
        return found

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(zip(TOPICS, pool.map(work, TOPICS), strict=True))
    assert chroma.reopens >= 2
    for name, found in results.items():
        assert found == [TOPICS[name][0]] * 2


def test_a_reopen_waits_for_calls_in_flight(persist_dir: Path) -> None:
    chroma = SharedChroma(persist_dir, max_open=4)
    holding = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with chroma.use():
            holding.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    holding.wait(10)
    reopener = threading.Thread(target=chroma.reopen_now)
    reopener.start()
    reopener.join(0.3)
    assert reopener.is_alive() and chroma.reopens == 0  # still waiting for the holder
    release.set()
    holder.join(10)
    reopener.join(10)
    assert not reopener.is_alive() and chroma.reopens == 1


def test_starts_on_the_process_client_and_needs_a_positive_bound(persist_dir: Path) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        SharedChroma(persist_dir, max_open=0)
    assert SharedChroma(persist_dir).client is make_chroma_client(persist_dir)
