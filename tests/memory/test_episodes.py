"""The bot's CommunityEpisodeStore against a real Chroma and the real MiniLM model:
meaning, not keywords.

Tests taking `store` or `chroma` run on embedded Chroma and on a Chroma server.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from chroma_memory.community_store import (
    SYNC_THRESHOLD,
    CommunityEpisodeStore,
    collection_name_for,
)
from chroma_memory.embedding import FastMiniLML6V2, close_chroma_client, make_chroma_client
from chroma_memory.shared_chroma import ChromaHandle, SharedChroma
from sonality.memory.episodes import EPISODIC, SEMANTIC, Episode

NUCLEAR = "Nuclear power plants are a safe, low-carbon source of electricity"
SOURDOUGH = "Sourdough bread needs a long, cold fermentation for flavour"
FOOTBALL = "A high press with a back three suits modern football tactics"
TAX = "A progressive income tax with fewer loopholes is fairer"
SOLAR = "Solar panels keep getting cheaper every year"
WIND = "Wind turbines keep getting cheaper every year"

PROJECT_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def store(
    persist_dir: Path, chroma: ChromaHandle, embedding_function: FastMiniLML6V2
) -> CommunityEpisodeStore:
    return CommunityEpisodeStore(persist_dir, client=chroma, embedding_function=embedding_function)


def _fill(store: CommunityEpisodeStore) -> None:
    for i, summary in enumerate((NUCLEAR, SOURDOUGH, FOOTBALL, TAX)):
        store.store(f"message {i}", f"reply {i}", 0.5, ["topic"], summary, interaction_count=i)


def _name_is_valid(name: str) -> bool:
    return (
        3 <= len(name) <= 512
        and re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9._-]*[a-zA-Z0-9]", name) is not None
        and ".." not in name
    )


# -- retrieval by meaning ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("Is atomic energy dangerous?", NUCLEAR),
        ("how do I make my bread rise", SOURDOUGH),
        ("should rich people pay higher taxes", TAX),
    ],
)
def test_retrieves_by_meaning_and_filters_the_rest(
    store: CommunityEpisodeStore, query: str, expected: str
) -> None:
    _fill(store)
    assert store.retrieve(query) == [expected]


def test_atomic_energy_finds_the_nuclear_episode_first(store: CommunityEpisodeStore) -> None:
    _fill(store)
    results = store.retrieve("atomic energy", n_results=4, min_relevance=-1.0)
    assert results[0] == NUCLEAR
    assert sorted(results) == sorted([NUCLEAR, SOURDOUGH, FOOTBALL, TAX])
    # A terse two-word query scores ~0.28 with MiniLM; unrelated topics score ~0.
    assert store.retrieve("atomic energy", min_relevance=0.2) == [NUCLEAR]


def test_min_relevance_drops_unrelated_episodes(store: CommunityEpisodeStore) -> None:
    _fill(store)
    assert store.retrieve("my cat likes to sleep in the sun") == []
    assert store.retrieve("my cat likes to sleep in the sun", min_relevance=-1.0) != []


@pytest.mark.parametrize(("solar_ess", "wind_ess", "first"), [(0.9, 0.1, SOLAR), (0.1, 0.9, WIND)])
def test_evidence_strength_decides_between_equally_relevant_episodes(
    store: CommunityEpisodeStore, solar_ess: float, wind_ess: float, first: str
) -> None:
    store.store("u", "a", solar_ess, ["energy"], SOLAR)
    store.store("u", "a", wind_ess, ["energy"], WIND)
    store.store("u", "a", 0.0, ["food"], SOURDOUGH)
    assert store.retrieve("renewable energy costs") == [first, SOLAR if first == WIND else WIND]
    # With one slot, the over-fetched candidate with stronger evidence still wins.
    assert store.retrieve("renewable energy costs", n_results=1) == [first]


def test_where_filter_is_applied(store: CommunityEpisodeStore) -> None:
    store.store("old", "a", 0.5, [], NUCLEAR, interaction_count=1)
    store.store(
        "new", "a", 0.5, [], "Nuclear reactors are safer than coal plants", interaction_count=9
    )
    got = store.retrieve("Is atomic energy dangerous?", where={"interaction": {"$gte": 5}})
    assert got == ["Nuclear reactors are safer than coal plants"]


def test_typed_retrieval_puts_semantic_first_and_deduplicates(store: CommunityEpisodeStore) -> None:
    store.store("u", "a", 0.0, [], NUCLEAR, memory_type="episodic")
    store.store(
        "u", "a", 0.9, [], "Reactors are safer than their reputation", memory_type="episodic"
    )
    store.store(
        "u",
        "a",
        0.1,
        [],
        "Nuclear energy has a very low death rate per TWh",
        memory_type="semantic",
    )
    store.store("u", "a", 0.1, [], NUCLEAR, memory_type="semantic")  # same text in both types
    store.store("u", "a", 0.9, [], SOURDOUGH, memory_type="semantic")
    got = store.retrieve_typed("Is atomic energy dangerous?", episodic_n=3, semantic_n=2)
    semantic = {"Nuclear energy has a very low death rate per TWh", NUCLEAR}
    assert set(got[:2]) == semantic
    assert got[2:] == ["Reactors are safer than their reputation"]
    assert len(got) == len(set(got))


def test_typed_retrieval_embeds_the_query_once(
    store: CommunityEpisodeStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fill(store)
    calls: list[str] = []
    real = store.embed_query

    def counting(query: str) -> Any:
        calls.append(query)
        return real(query)

    monkeypatch.setattr(store, "embed_query", counting)
    store.retrieve_typed("Is atomic energy dangerous?")
    assert calls == ["Is atomic energy dangerous?"]


def test_empty_store_returns_nothing(store: CommunityEpisodeStore) -> None:
    assert store.count() == 0
    assert store.retrieve("anything") == []
    assert store.retrieve_typed("anything") == []
    assert store.recent_summaries(0) == []


# -- writing ------------------------------------------------------------------------------


def test_store_keeps_only_what_recall_and_hiding_need(store: CommunityEpisodeStore) -> None:
    episode_id = store.store("u" * 900, "r" * 900, 0.42, ["energy", "policy"], NUCLEAR, 7)
    raw = store.chroma.client.get_collection(store.collection_name)
    got = raw.get(ids=[episode_id], include=["metadatas", "documents"])
    meta = got["metadatas"][0]  # type: ignore[index]
    assert got["documents"] == [NUCLEAR]
    # No message or reply text (members' data), no speaker, no copy of the summary.
    assert set(meta) == {"ess_score", "memory_type", "timestamp", "interaction", "version"}
    assert meta["ess_score"] == pytest.approx(0.42)
    assert meta["memory_type"] == "episodic"
    assert meta["interaction"] == 7
    assert str(meta["timestamp"]).endswith("+00:00")
    assert store.recent_summaries(0) == [NUCLEAR]


def test_without_a_summary_the_document_is_the_message_head(store: CommunityEpisodeStore) -> None:
    episode_id = store.store("u" * 900, "r" * 900, 0.42, [], "", 7)
    raw = store.chroma.client.get_collection(store.collection_name)
    assert raw.get(ids=[episode_id], include=["documents"])["documents"] == ["u" * 200]


def test_upsert_with_same_id_never_duplicates(store: CommunityEpisodeStore) -> None:
    first = store.store("m", "r", 0.3, [], NUCLEAR, episode_id="guild-1:msg-42")
    second = store.store("m", "r", 0.3, [], "Nuclear plants are safe", episode_id="guild-1:msg-42")
    assert first == second == "guild-1:msg-42"
    assert store.count() == 1
    assert store.retrieve("Is atomic energy dangerous?") == ["Nuclear plants are safe"]
    assert store.store("m", "r", 0.3, [], TAX) != first  # default ids are fresh
    assert store.count() == 2


def test_recent_summaries_are_oldest_first_and_limited(store: CommunityEpisodeStore) -> None:
    for i in (5, 1, 4, 2, 3):
        store.store("m", "r", 0.1, [], f"summary {i}", interaction_count=i)
    assert store.recent_summaries(3) == ["summary 3", "summary 4", "summary 5"]
    assert store.recent_summaries(0, limit=2) == ["summary 4", "summary 5"]
    assert store.recent_summaries(6) == []


# -- communities --------------------------------------------------------------------------


def test_collection_names_are_valid_distinct_and_stable() -> None:
    ids = [
        "discord:1234",
        "slack:T0A1",
        "terminal:local",
        "a:b",
        "a-b",
        "A:B",
        "::",
        "ü" * 600,
        "x" * 1000,
        "discord:1234 ",
    ]
    names = [collection_name_for(i) for i in ids]
    assert all(_name_is_valid(n) for n in names), names
    assert len(set(names)) == len(ids)
    assert collection_name_for("discord:1234") == names[0]
    assert names[0].startswith("episodes-discord-1234-")


def test_communities_never_see_each_others_episodes(
    persist_dir: Path, chroma: ChromaHandle, embedding_function: FastMiniLML6V2
) -> None:
    client = chroma
    a = CommunityEpisodeStore.for_community(
        "discord:1", persist_dir, client=client, embedding_function=embedding_function
    )
    b = CommunityEpisodeStore.for_community(
        "slack:T1", persist_dir, client=client, embedding_function=embedding_function
    )
    a.store("m", "r", 0.5, [], NUCLEAR)
    assert a.count() == 1 and b.count() == 0
    assert b.retrieve("Is atomic energy dangerous?", min_relevance=-1.0) == []
    b.store("m", "r", 0.5, [], TAX)
    assert a.retrieve("should rich people pay higher taxes", min_relevance=-1.0) == [NUCLEAR]


def test_concurrent_use_of_different_communities(
    persist_dir: Path, chroma: ChromaHandle, embedding_function: FastMiniLML6V2
) -> None:
    client = chroma
    topics = {"c0": NUCLEAR, "c1": SOURDOUGH, "c2": FOOTBALL, "c3": TAX}

    def work(community: str) -> list[str]:
        s = CommunityEpisodeStore.for_community(
            community, persist_dir, client=client, embedding_function=embedding_function
        )
        for i in range(3):
            s.store("m", "r", 0.5, [], topics[community], episode_id=f"{community}-{i % 2}")
        return s.retrieve("anything at all", min_relevance=-1.0)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(zip(topics, pool.map(work, topics), strict=True))
    for community, got in results.items():
        assert got == [topics[community]] * 2


# -- persistence ----------------------------------------------------------------------------


def test_a_directory_alone_gives_the_default_client_and_model_dir(
    tmp_path: Path, model_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sonality import config

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    (data_dir / "models").symlink_to(model_cache_dir)  # reuse the built model
    monkeypatch.setattr(config, "DATA_DIR", data_dir)
    persist = tmp_path / "chroma"
    try:
        s = CommunityEpisodeStore(str(persist))
        assert s.collection_name == "episodes"
        s.store("m", "r", 0.5, [], NUCLEAR)
        assert s.retrieve("Is atomic energy dangerous?") == [NUCLEAR]
        assert make_chroma_client(persist) is s.chroma.client
    finally:
        close_chroma_client(persist)


def test_non_cosine_collection_is_refused(
    persist_dir: Path, chroma: ChromaHandle, embedding_function: FastMiniLML6V2
) -> None:
    chroma.client.create_collection(
        "episodes",
        embedding_function=embedding_function,  # type: ignore[arg-type]
        configuration={"hnsw": {"space": "l2"}},
    )
    with pytest.raises(ValueError, match="cosine"):
        CommunityEpisodeStore(persist_dir, client=chroma, embedding_function=embedding_function)


def test_episodes_survive_reopening_in_a_new_process(
    persist_dir: Path, embedding_function: FastMiniLML6V2, model_cache_dir: Path
) -> None:
    s = CommunityEpisodeStore.for_community(
        "discord:77", persist_dir, embedding_function=embedding_function
    )
    s.store("m", "r", 0.5, [], NUCLEAR, interaction_count=3)
    s.store("m", "r", 0.5, [], TAX, interaction_count=4)
    close_chroma_client(persist_dir)

    script = (
        "import json, sys\n"
        "from pathlib import Path\n"
        "from chroma_memory.community_store import CommunityEpisodeStore\n"
        "s = CommunityEpisodeStore.for_community(\n"
        "    'discord:77', sys.argv[1], model_cache_dir=Path(sys.argv[2])\n"
        ")\n"
        "print(json.dumps([s.count(), s.retrieve('Is atomic energy dangerous?'),"
        " s.recent_summaries(0)]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, str(persist_dir), str(model_cache_dir)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PROJECT_ROOT,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == [2, [NUCLEAR], [NUCLEAR, TAX]]

    # And in this process, with a fresh client on the same path.
    reopened = CommunityEpisodeStore.for_community(
        "discord:77", persist_dir, embedding_function=embedding_function
    )
    assert reopened.count() == 2


def test_unwritten_episodes_are_ranked_with_stored_ones(store: CommunityEpisodeStore) -> None:
    """Episodes waiting for a batched write compete by the same score, semantic ones in
    the semantic slots, and one that has just been stored is not counted twice."""
    store.store("m", "r", 0.5, [], NUCLEAR, episode_id="stored")

    def waiting(episode_id: str, summary: str, memory_type: str = EPISODIC) -> Episode:
        vector = store.embed_query(summary)[0]
        return Episode(
            id=episode_id,
            user_message="m",
            agent_response="r",
            ess_score=0.5,
            topics=(),
            summary=summary,
            memory_type=memory_type,
            embedding=tuple(float(x) for x in vector),
        )

    unwritten = [
        waiting("bread", SOURDOUGH),
        waiting("insight", TAX, SEMANTIC),
        waiting("stored", NUCLEAR),  # written while the caller's snapshot was taken
    ]
    assert store.retrieve_typed("how do I make my bread rise", unwritten=unwritten) == [SOURDOUGH]
    assert store.retrieve_typed("should rich people pay higher taxes", unwritten=unwritten) == [TAX]
    everything = store.retrieve_typed(
        "anything", episodic_n=5, semantic_n=5, min_relevance=-1.0, unwritten=unwritten
    )
    assert everything[0] == TAX  # semantic first
    assert sorted(everything[1:]) == sorted([NUCLEAR, SOURDOUGH])  # NUCLEAR once


# -- how often an index is saved --------------------------------------------------------


def _unsaved_writes(persist_dir: Path, shared: SharedChroma, name: str) -> int:
    """Writes in Chroma's log for collection ``name`` that no saved index holds yet:
    each load of the index inserts them into the graph again. (Read from Chroma's own
    SQLite file; no API tells it.)"""
    with shared.use():
        collection = shared.client.get_collection(name)
    with closing(sqlite3.connect(persist_dir / "chroma.sqlite3")) as con:
        [(count,)] = con.execute(
            "SELECT count(*) FROM embeddings_queue WHERE topic LIKE ?", (f"%{collection.id}",)
        ).fetchall()
    return int(count)


def test_a_collection_saves_its_index_every_few_writes(
    persist_dir: Path, embedding_function: FastMiniLML6V2
) -> None:
    """With Chroma's default (a save every 1,000 writes) all 40 writes would stay in the
    log, to be inserted again at every load of the index after a client reopen."""
    shared = SharedChroma(persist_dir)
    store = CommunityEpisodeStore(persist_dir, client=shared, embedding_function=embedding_function)
    for i in range(40):
        store.store(f"message {i}", f"reply {i}", 0.5, [], f"memory number {i}")
    assert _unsaved_writes(persist_dir, shared, "episodes") < SYNC_THRESHOLD < 40
    shared.reopen_now()
    assert store.count() == 40


def test_a_collection_made_with_chromas_default_is_lowered_once_and_keeps_its_memories(
    persist_dir: Path, embedding_function: FastMiniLML6V2
) -> None:
    shared = SharedChroma(persist_dir)
    store = CommunityEpisodeStore(persist_dir, client=shared, embedding_function=embedding_function)
    _fill(store)
    with shared.use():  # as a collection made by an older release is
        shared.client.get_collection("episodes").modify(
            configuration={"hnsw": {"sync_threshold": 1000}}
        )
    shared.reopen_now()

    reopened = CommunityEpisodeStore(
        persist_dir, client=shared, embedding_function=embedding_function
    )
    with shared.use():
        hnsw = shared.client.get_collection("episodes").configuration_json["hnsw"]
    assert hnsw["sync_threshold"] == SYNC_THRESHOLD
    assert reopened.retrieve("Is atomic energy dangerous?")[0] == NUCLEAR
    for i in range(40):
        reopened.store(f"message {i}", f"reply {i}", 0.5, [], f"memory number {i}")
    assert _unsaved_writes(persist_dir, shared, "episodes") < SYNC_THRESHOLD
    shared.reopen_now()
    assert reopened.count() == 44
