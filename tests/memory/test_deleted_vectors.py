"""A deleted memory's vector is in none of Chroma's files.

Chroma's HNSW index only marks a deleted record: before `delete_wiped`, the vector of a
memory taken by forget-me stayed in the saved index (`data_level0.bin`) for good
(checked 2026-11-29 with the scan below). The scan compares floats, not bytes: the
index keeps each vector normalised, so its bytes differ from the stored vector's in
the last bits.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from chromadb.api.models.Collection import Collection

from chroma_memory import community_store
from chroma_memory.community_store import CommunityEpisodeStore
from chroma_memory.embedding import FastMiniLML6V2, close_chroma_client
from chroma_memory.server import ServerMemory
from chroma_memory.shared_chroma import SharedChroma
from sonality.memory.episodes import delete_wiped
from sonality.store import Episode
from tests.chroma_server import ChromaServer

TOPICS = ["bread", "trains", "tides", "chess", "moss", "kites", "jazz", "glaciers"]


def _episodes(tag: str = "") -> list[Episode]:
    return [
        Episode(
            id=f"e{i}",
            user_message=f"message {i}",
            summary=f"Member {i}{tag} argued about {TOPICS[i % len(TOPICS)]} and example {i}",
        )
        for i in range(40)
    ]


def copies_in_files(directory: Path, vector: np.ndarray, *, skip: str | None = None) -> int:
    """How many places in the directory's files (but those whose name starts with
    `skip`) hold `vector` as float32, to 1e-5."""
    vector = (vector / np.linalg.norm(vector)).astype(np.float32)
    found = 0
    for path in directory.rglob("*"):
        if not path.is_file() or (skip is not None and path.name.startswith(skip)):
            continue
        raw = path.read_bytes()
        for shift in range(4):
            usable = (len(raw) - shift) // 4 * 4
            floats = np.frombuffer(raw[shift : shift + usable], dtype=np.float32)
            if len(floats) < len(vector):
                continue
            with np.errstate(invalid="ignore"):
                starts = np.nonzero(
                    np.abs(floats[: len(floats) - len(vector) + 1] - vector[0]) < 1e-5
                )[0]
                for start in starts:
                    if np.abs(floats[start : start + len(vector)] - vector).max() < 1e-5:
                        found += 1
    return found


def _vector(embed: FastMiniLML6V2, episode: Episode) -> np.ndarray:
    return np.asarray(embed([episode.summary])[0], dtype=np.float32)


@pytest.mark.parametrize("wiped", [True, False], ids=["delete", "collection.delete alone"])
def test_the_bots_store_leaves_no_forgotten_vector_in_its_files(
    tmp_path: Path,
    embedding_function: FastMiniLML6V2,
    monkeypatch: pytest.MonkeyPatch,
    wiped: bool,
) -> None:
    """The store's delete (forget-me, a deleted message) saves the index and rebuilds
    Chroma's SQLite file; with Chroma's plain delete in place of `delete_wiped`, the
    control, the vector is still in the saved index afterwards."""
    if not wiped:
        monkeypatch.setattr(
            community_store, "delete_wiped", lambda c, ids, **_: c.delete(ids=list(ids))
        )
    directory = tmp_path / "chroma"
    chroma = SharedChroma(directory)
    store = CommunityEpisodeStore.for_community(
        "discord:1", None, client=chroma, embedding_function=embedding_function
    )
    episodes = _episodes()
    for episode in episodes:  # one write each: the index is saved along the way
        store.store_many([episode])
    forgotten, kept = episodes[3], episodes[4]
    chroma.reopen_now()
    assert copies_in_files(directory, _vector(embedding_function, forgotten)) == 1

    store.delete([forgotten.id, "never-stored"])
    close_chroma_client(directory)

    left = copies_in_files(directory, _vector(embedding_function, forgotten))
    assert left == (0 if wiped else 1)
    assert copies_in_files(directory, _vector(embedding_function, kept)) == 1  # the scan works
    reopened = CommunityEpisodeStore.for_community(
        "discord:1", None, client=SharedChroma(directory), embedding_function=embedding_function
    )
    assert reopened.count() == len(episodes) - 1
    assert reopened.stored([forgotten.id]) == []
    close_chroma_client(directory)


def test_a_recall_during_the_delete_sees_no_blanked_memory(
    tmp_path: Path, embedding_function: FastMiniLML6V2, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between `delete_wiped`'s overwrite and its delete, the memory is a blank vector
    with an empty document; a recall or reflection running in that moment (another
    thread) must not hand the prompt an empty memory, nor the summary an older memory
    kept in its metadata. The delete is stopped after the overwrite to hold that
    moment."""
    directory = tmp_path / "chroma"
    chroma = SharedChroma(directory)
    store = CommunityEpisodeStore.for_community(
        "discord:1", None, client=chroma, embedding_function=embedding_function
    )
    episodes = _episodes()[:6]
    store.store_many(episodes)
    older = "An older memory kept its summary in the metadata"
    with chroma.use():  # the layout of memories stored before summaries were documents
        chroma.client.get_collection(store.collection_name).upsert(
            ids=["older"],
            embeddings=embedding_function([older]),
            documents=["the member's own words"],
            metadatas=[{"summary": older, "interaction": 0}],
        )
    assert older in store.retrieve(older, n_results=10)

    def stalled(self: object, **kwargs: object) -> None:
        raise RuntimeError("stopped between the overwrite and the delete")

    monkeypatch.setattr(Collection, "delete", stalled)
    with pytest.raises(RuntimeError, match="stopped"):
        store.delete([episodes[2].id, "older"])
    blanked = store.stored([episodes[2].id, "older"])
    assert [row["document"] for row in blanked] == ["", ""]  # the moment is held

    everything = store.retrieve("argued", n_results=10, min_relevance=-1.0)
    recent = store.recent_summaries(0, limit=10)
    for recalled in (everything, recent):
        assert "" not in recalled and older not in recalled
        assert len(recalled) == len(episodes) - 1 and episodes[3].summary in recalled
    close_chroma_client(directory)


@pytest.mark.parametrize("saved", [True, False], ids=["delete", "overwritten once"])
def test_on_a_chroma_server_no_forgotten_vector_stays_in_its_files(
    chroma_server: ChromaServer,
    embedding_function: FastMiniLML6V2,
    monkeypatch: pytest.MonkeyPatch,
    saved: bool,
) -> None:
    """A server keeps the index loaded and saves it only every `sync_threshold` writes,
    and the bot cannot reopen it there. Checked in the server's own directory, with the
    server still running: with the blank written once (the control), the forgotten
    vector stays in the saved index. The server's SQLite file is left out: on a server,
    clearing its free pages is the operator's `chroma vacuum` (docs/privacy.md), and a
    test found the vector's bytes there while other tests wrote to the same server."""
    if not saved:
        monkeypatch.setattr(
            community_store, "delete_wiped", lambda c, ids, **_: delete_wiped(c, ids)
        )
    memory = ServerMemory(chroma_server.url, database=chroma_server.fresh_database())
    try:
        store = memory.store_for("discord:1", embedding_function)
        episodes = _episodes(tag=f" on the server ({saved})")
        for episode in episodes:  # one write each: the server saves the index on the way
            store.store_many([episode])
        forgotten, kept = episodes[3], episodes[4]

        def in_index(episode: Episode) -> int:
            vector = _vector(embedding_function, episode)
            return copies_in_files(chroma_server.path, vector, skip="chroma.sqlite3")

        assert in_index(forgotten) == 1

        store.delete([forgotten.id])

        assert in_index(forgotten) == (0 if saved else 1)
        assert in_index(kept) == 1  # the scan finds vectors
        assert store.count() == len(episodes) - 1
        recalled = store.retrieve(forgotten.summary, n_results=40, min_relevance=-1.0)
        assert forgotten.summary not in recalled and kept.summary in recalled
    finally:
        memory.close()
