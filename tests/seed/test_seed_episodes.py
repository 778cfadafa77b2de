"""`sonality.memory.episodes.EpisodeStore` as 002 and 003 describe it: Chroma with
cosine similarity, recall reranked by evidence, typed recall semantic-first, and (the
point of the seed's one-argument constructor) working on its own, offline."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from sonality.memory.embedding import bundled_embedding_function
from sonality.memory.episodes import EpisodeStore
from tests.seed.seed_process import run_seed_code

QUERY = "Is nuclear power dangerous?"
SAFE = "The sender argues that nuclear power plants are safe and clean."
REACTORS = "The sender says reactors rarely cause accidents."
BREAD = "The sender shares a recipe for rye bread with caraway."

SEED_SHAPED = """
import json
import chromadb
from chromadb.config import Settings
from sonality.memory.episodes import EpisodeStore

store = EpisodeStore("memories")
if store.count() == 0:
    store.store(
        "Nuclear plants have the lowest deaths per terawatt-hour.", "Noted.",
        0.7, ["nuclear_energy"], "The sender argues that nuclear power plants are safe.", 1,
    )
client = chromadb.PersistentClient(path="memories", settings=Settings(anonymized_telemetry=False))
[collection] = client.list_collections()
print(json.dumps({
    "found": store.retrieve("Is atomic energy dangerous?"),
    "count": store.count(),
    "collection": collection.name,
    "space": (collection.configuration_json.get("hnsw") or {}).get("space"),
}))
"""


def test_the_one_argument_store_works_offline_and_persists(tmp_path: Path) -> None:
    """A fresh machine without network: no model in any cache, `$HOME` empty."""
    first = run_seed_code(tmp_path, SEED_SHAPED)
    assert first == {
        "found": ["The sender argues that nuclear power plants are safe."],
        "count": 1,
        "collection": "episodes",
        "space": "cosine",
    }
    again = run_seed_code(tmp_path, SEED_SHAPED)  # a second process reopens it
    assert again == first


@pytest.fixture
def store(tmp_path: Path, model_dir: Path) -> Iterator[EpisodeStore]:
    yield EpisodeStore(str(tmp_path / "chroma"))


def similarity(a: str, b: str) -> float:
    """Cosine similarity under the store's own model (its vectors are normalised)."""
    va, vb = (np.asarray(v) for v in bundled_embedding_function()([a, b]))
    return float(va @ vb)


def test_the_documented_signatures() -> None:
    params = inspect.signature(EpisodeStore.store).parameters
    assert list(params)[1:6] == ["user_message", "agent_response", "ess_score", "topics", "summary"]
    assert params["interaction_count"].default == 0
    assert params["memory_type"].default == "episodic"
    recall = inspect.signature(EpisodeStore.retrieve).parameters
    assert (recall["n_results"].default, recall["min_relevance"].default) == (5, 0.3)
    assert recall["where"].default is None
    typed = inspect.signature(EpisodeStore.retrieve_typed).parameters
    assert (typed["episodic_n"].default, typed["semantic_n"].default) == (3, 2)
    assert typed["min_relevance"].default == 0.3


def test_recall_prefers_stronger_evidence_among_similar_memories(store: EpisodeStore) -> None:
    sim_safe, sim_reactors = similarity(QUERY, SAFE), similarity(QUERY, REACTORS)
    assert sim_safe > sim_reactors >= 0.3, "the example needs two relevant, unequal memories"
    assert sim_reactors * (1 + 1.0) > sim_safe * (1 + 0.0), "and a rerank that swaps them"
    store.store("m1", "r1", 0.0, ["nuclear_energy"], SAFE, 1)
    store.store("m2", "r2", 1.0, ["nuclear_energy"], REACTORS, 2)
    # similarity x (1 + ess): the better-argued memory comes first.
    assert store.retrieve(QUERY) == [REACTORS, SAFE]


def test_recall_leaves_out_what_is_not_relevant(store: EpisodeStore) -> None:
    assert similarity(QUERY, BREAD) < 0.3
    store.store("m", "r", 1.0, ["baking"], BREAD, 1)
    store.store("m", "r", 0.2, ["nuclear_energy"], SAFE, 2)
    assert store.retrieve(QUERY) == [SAFE]
    assert store.retrieve(QUERY, min_relevance=-1.0) == [SAFE, BREAD]


def test_recall_honours_n_results_and_metadata_filters(store: EpisodeStore) -> None:
    for interaction, summary in enumerate([SAFE, REACTORS, SAFE + " Again."], start=1):
        store.store("m", "r", 0.5, ["nuclear_energy"], summary, interaction)
    assert len(store.retrieve(QUERY)) == 3
    assert len(store.retrieve(QUERY, n_results=2)) == 2
    late = store.retrieve(QUERY, where={"interaction": {"$gte": 2}})
    assert sorted(late) == sorted([REACTORS, SAFE + " Again."])


def test_the_document_is_the_summary_or_the_start_of_the_message(store: EpisodeStore) -> None:
    message = "Nuclear power is dangerous? " + "No, it is safe. " * 30
    store.store(message, "reply", 0.5, ["nuclear_energy"], "")
    assert store.retrieve(QUERY) == [message[:200]]


def test_typed_recall_puts_insights_first_without_repeats(store: EpisodeStore) -> None:
    store.store("m", "r", 0.4, ["nuclear_energy"], SAFE, 1)  # episodic by default
    store.store("", "", 0.9, [], REACTORS, 2, memory_type="semantic")
    store.store("", "", 0.9, [], SAFE, 3, memory_type="semantic")  # same text as an episode
    typed = store.retrieve_typed(QUERY)
    assert typed[0] in (REACTORS, SAFE) and set(typed) == {REACTORS, SAFE}
    assert len(typed) == 2  # the shared text appears once
    assert store.retrieve_typed(QUERY, episodic_n=3, semantic_n=0) == [SAFE]
    assert store.retrieve_typed(QUERY, episodic_n=0, semantic_n=1) in ([REACTORS], [SAFE])
