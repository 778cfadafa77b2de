"""Episodic and semantic memory, recalled by meaning and reranked by evidence.

The agent depends only on `EpisodeMemory`. `EpisodeStore` is the seed's plain Chroma
store; `chroma_memory` has the bot's faster one, which uses the helpers below so both
rank and hide memories alike. Chroma keeps no member text besides the summary.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, cast

import chromadb
from chromadb.api.models.Collection import Collection
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Metadata, Where
from chromadb.config import Settings

from sonality.config import MIN_EPISODE_RELEVANCE
from sonality.memory.embedding import bundled_embedding_function
from sonality.memory.freed_memory import scrub_freed_memory
from sonality.store import EPISODIC, SEMANTIC, Episode, HiddenRange

#: Index candidates fetched per requested result, for the rerank.
CANDIDATE_FACTOR = 3
#: The seed's retrieval defaults, for every store's signatures.
N_RESULTS = 5
EPISODIC_N = 3
SEMANTIC_N = 2
MIN_RELEVANCE = MIN_EPISODE_RELEVANCE
RECENT_N = 20

__all__ = [
    "EPISODIC",
    "SEMANTIC",
    "Episode",
    "EpisodeMemory",
    "EpisodeStore",
    "SeedStoreMethods",
    "document_of",
    "with_vectors",
]

#: A reranked candidate: (score, similarity, summary).
Scored = tuple[float, float, str]


class EpisodeMemory(Protocol):
    """A community's memories as the agent, commands and benchmarks use them."""

    def embed_many(self, texts: Sequence[str]) -> Embeddings: ...

    def store_many(self, episodes: Sequence[Episode]) -> None: ...

    def delete(self, ids: Sequence[str]) -> None:
        """Ids not stored are ignored, so a resumed forget-me can run it again."""

    def retrieve_typed(
        self,
        query: str,
        episodic_n: int = EPISODIC_N,
        semantic_n: int = SEMANTIC_N,
        min_relevance: float = MIN_RELEVANCE,
        *,
        query_embedding: Embeddings | None = None,
        hidden: Sequence[HiddenRange] = (),
    ) -> list[str]: ...

    def retrieve(
        self,
        query: str,
        n_results: int = N_RESULTS,
        min_relevance: float = MIN_RELEVANCE,
        where: dict[str, Any] | None = None,
        *,
        query_embedding: Embeddings | None = None,
    ) -> list[str]: ...

    def recent_summaries(
        self, since_interaction: int, limit: int = RECENT_N, hidden: Sequence[HiddenRange] = ()
    ) -> list[str]: ...

    def count(self) -> int: ...

    def stored(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        """These memories as the store holds them (document and metadata, no vector),
        for a member's data export; ids not stored are left out."""

    def semantic_ids(self, documents: Sequence[str]) -> list[str]:
        """Ids of the insights (semantic memories) whose text is one of `documents`:
        how a forget-me finds those drawn from a member's messages."""


class SeedStoreMethods:
    """The seed's one-episode `store`, and batch embedding, over `store_many`."""

    _embed: EmbeddingFunction[Documents]

    def store_many(self, episodes: Sequence[Episode]) -> None:
        raise NotImplementedError

    def store(
        self,
        user_message: str,
        agent_response: str,
        ess_score: float,
        topics: Sequence[str],
        summary: str,
        interaction_count: int = 0,
        memory_type: str = EPISODIC,
        *,
        episode_id: str | None = None,
    ) -> str:
        """Store one episode and return its id; the same `episode_id` overwrites."""
        episode = Episode(
            id=episode_id or uuid.uuid4().hex,
            user_message=user_message,
            agent_response=agent_response,
            ess_score=ess_score,
            topics=tuple(topics),
            summary=summary,
            interaction=interaction_count,
            memory_type=memory_type,
        )
        self.store_many([episode])
        return episode.id

    def embed_many(self, texts: Sequence[str]) -> Embeddings:
        return self._embed(list(texts))


class EpisodeStore(SeedStoreMethods):
    """One community's memories in one Chroma collection (the seed's store).

    Without an `embedding_function`, the seed's model (all-MiniLM-L6-v2), built from
    the bundled weights into `config.MODEL_CACHE_DIR`: `EpisodeStore(path)` works offline.
    """

    def __init__(
        self,
        persist_dir: str | Path,
        *,
        collection: str = "episodes",
        embedding_function: EmbeddingFunction[Documents] | None = None,
    ) -> None:
        self.persist_dir = Path(persist_dir)
        self._embed = embedding_function or bundled_embedding_function()
        scrub_freed_memory()  # before the index holds a buffer: see that module
        client = chromadb.PersistentClient(
            path=str(self.persist_dir), settings=Settings(anonymized_telemetry=False)
        )
        self._collection = client.get_or_create_collection(
            name=collection,
            embedding_function=self._embed,  # type: ignore[arg-type]
            configuration={"hnsw": {"space": "cosine"}},
        )

    def store_many(self, episodes: Sequence[Episode]) -> None:
        upsert(self._collection, with_vectors(episodes, self._embed))

    def delete(self, ids: Sequence[str]) -> None:
        if ids:
            delete_wiped(self._collection, ids)

    def count(self) -> int:
        return self._collection.count()

    def stored(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        if not ids:
            return []
        return stored_in(self._collection, ids)

    def semantic_ids(self, documents: Sequence[str]) -> list[str]:
        wanted = set(documents)
        if not wanted:
            return []
        got = self._collection.get(where={"memory_type": SEMANTIC}, include=["documents"])
        return ids_with(got["ids"], got.get("documents") or [], wanted)

    def retrieve(
        self,
        query: str,
        n_results: int = N_RESULTS,
        min_relevance: float = MIN_RELEVANCE,
        where: dict[str, Any] | None = None,
        *,
        query_embedding: Embeddings | None = None,
    ) -> list[str]:
        """Summaries of the most relevant memories, best first."""
        vector = query_embedding if query_embedding is not None else self._embed([query])
        scored, _ = scored_matches(self._collection, vector, n_results, where, min_relevance)
        return best(scored, n_results)

    def retrieve_typed(
        self,
        query: str,
        episodic_n: int = EPISODIC_N,
        semantic_n: int = SEMANTIC_N,
        min_relevance: float = MIN_RELEVANCE,
        *,
        query_embedding: Embeddings | None = None,
        hidden: Sequence[HiddenRange] = (),
    ) -> list[str]:
        """Insights first, then episodes, without repeats or `hidden` memories."""
        vector = query_embedding if query_embedding is not None else self._embed([query])
        hide = outside(hidden)
        found: list[str] = []
        for memory_type, n in ((SEMANTIC, semantic_n), (EPISODIC, episodic_n)):
            where: dict[str, Any] = {"memory_type": memory_type}
            where = {"$and": [where, hide]} if hide else where
            scored, _ = scored_matches(self._collection, vector, n, where, min_relevance)
            found += best(scored, n)
        return list(dict.fromkeys(found))

    def recent_summaries(
        self, since_interaction: int, limit: int = RECENT_N, hidden: Sequence[HiddenRange] = ()
    ) -> list[str]:
        """Episode summaries from `since_interaction` on, oldest first."""
        if limit <= 0:
            return []
        where = {
            "$and": [
                {"memory_type": {"$ne": SEMANTIC}},
                {"interaction": {"$gte": int(since_interaction)}},
                *([hide] if (hide := outside(hidden)) else []),
            ]
        }
        got = self._collection.get(where=cast(Where, where), include=["metadatas", "documents"])
        return in_order(got["metadatas"] or [], got["documents"] or [], limit)


# -- shared by every EpisodeMemory implementation --------------------------------------


def relevance(similarity: float, ess_score: float) -> float:
    """Between equally similar memories, the stronger argument ranks first."""
    return similarity * (1.0 + ess_score)


def metadata_of(episode: Episode, timestamp: str) -> Metadata:
    """Only what ranking, ordering and hiding read."""
    return {
        "ess_score": float(episode.ess_score),
        "memory_type": episode.memory_type,
        "timestamp": timestamp,
        "interaction": int(episode.interaction),
        "version": int(episode.version),
    }


def stored_in(collection: Collection, ids: Sequence[str]) -> list[dict[str, Any]]:
    """Documents and metadata of these ids, without vectors."""
    got = collection.get(ids=list(ids), include=["documents", "metadatas"])
    documents: Sequence[str | None] = got.get("documents") or [None] * len(got["ids"])
    metadatas: Sequence[Mapping[str, Any] | None] = got.get("metadatas") or [None] * len(got["ids"])
    return [
        {"id": i, "document": d, "metadata": dict(m or {})}
        for i, d, m in zip(got["ids"], documents, metadatas, strict=True)
    ]


def ids_with(ids: Sequence[str], documents: Sequence[str | None], wanted: set[str]) -> list[str]:
    """The ids whose document is one of `wanted`, sorted."""
    return sorted(i for i, text in zip(ids, documents, strict=True) if text in wanted)


def delete_wiped(collection: Collection, ids: Sequence[str], *, saved_after: int = 1) -> None:
    """Delete these ids from `collection`, overwriting their vectors first.

    Why not `collection.delete` alone: Chroma's HNSW index only marks a deleted record,
    and its vector stays in its slot of the saved index (`data_level0.bin`) until the
    slot is reused, which may be never. A vector of a forgotten member's memory is
    theirs too (it can be matched against guesses of their words). Writing the same id
    again puts a blank vector and document in that same slot (and an empty `summary`,
    where older memories kept theirs: Chroma merges metadata); then the delete marks it.
    Ids not stored are left alone. Recall leaves out empty summaries, so a query
    between the two steps gets nothing of the memory.

    The overwrite reaches the file only when Chroma next saves the index, after
    `sync_threshold` writes. Where nothing else makes it save (a Chroma server keeps
    the index loaded and takes no other hint), pass that threshold as `saved_after`:
    the blank is written that many times over, so a save falls after the first one.
    """
    present = list(collection.get(ids=list(ids), include=[])["ids"])
    if present:
        vectors = collection.get(ids=present[:1], include=["embeddings"])["embeddings"]
        assert vectors is not None, "embeddings were asked for"
        dimensions = len(vectors[0])  # one vector read, only for its length
        blank = [1.0 / math.sqrt(dimensions)] * dimensions  # a unit vector: cosine space
        for _ in range(math.ceil(max(saved_after, 1) / len(present))):
            collection.upsert(
                ids=present,
                embeddings=cast(Embeddings, [blank] * len(present)),
                documents=[""] * len(present),
                metadatas=[{"summary": ""}] * len(present),
            )
    collection.delete(ids=list(ids))


def upsert(collection: Collection, episodes: Sequence[Episode]) -> None:
    """Upsert episodes that carry vectors; a replay overwrites by id."""
    now = datetime.now(UTC).isoformat()
    collection.upsert(
        ids=[e.id for e in episodes],
        embeddings=cast(Embeddings, [list(e.embedding or ()) for e in episodes]),
        documents=[document_of(e) for e in episodes],
        metadatas=[metadata_of(e, now) for e in episodes],
    )


def scored_matches(
    collection: Collection,
    query_embedding: Embeddings,
    n_results: int,
    where: Mapping[str, Any] | None,
    min_relevance: float,
) -> tuple[list[Scored], set[str]]:
    """Reranked candidates at or above `min_relevance`, and the ids the index returned."""
    if n_results <= 0:
        return [], set()
    result = collection.query(
        query_embeddings=query_embedding,
        n_results=n_results * CANDIDATE_FACTOR,
        where=cast(Where | None, dict(where) if where else None),
        include=["metadatas", "documents", "distances"],
    )
    distances = (result["distances"] or [[]])[0]
    metadatas = (result["metadatas"] or [[]])[0]
    documents = (result["documents"] or [[]])[0]
    scored: list[Scored] = []
    for distance, meta, doc in zip(distances, metadatas, documents, strict=True):
        similarity = 1.0 - float(distance)  # Chroma's cosine distance is 1 - cos
        summary = summary_of(meta, doc)
        # An empty summary is a memory `delete_wiped` is deleting at this moment.
        if similarity >= min_relevance and summary:
            ess = _as_float(meta.get("ess_score"))
            scored.append((relevance(similarity, ess), similarity, summary))
    return scored, set(result["ids"][0] if result["ids"] else [])


def best(scored: list[Scored], n_results: int) -> list[str]:
    """The `n_results` best summaries; ties go to the more similar."""
    scored.sort(key=lambda item: (item[0], item[1]), reverse=True)
    return [summary for _, _, summary in scored[: max(n_results, 0)]]


def in_order(
    metadatas: Sequence[Mapping[str, Any]], documents: Sequence[str | None], limit: int
) -> list[str]:
    """The last `limit` summaries by interaction (then time), oldest first."""
    rows = sorted(
        zip(metadatas, documents, strict=True),
        key=lambda row: (_as_int(row[0].get("interaction")), str(row[0].get("timestamp", ""))),
    )
    summaries = [summary_of(meta, doc) for meta, doc in rows]
    return [summary for summary in summaries if summary][-limit:]  # "": being deleted


def outside(hidden: Sequence[HiddenRange]) -> dict[str, Any] | None:
    """A Chroma filter for memories no `HiddenRange` covers, or None."""
    conditions: list[dict[str, Any]] = [
        {
            "$or": [
                {"interaction": {"$lte": after}},
                {"interaction": {"$gt": upto}},
                {"version": {"$gte": from_version}},
            ]
        }
        for after, upto, from_version in hidden
    ]
    if not conditions:
        return None
    return conditions[0] if len(conditions) == 1 else {"$and": conditions}


def document_of(episode: Episode) -> str:
    """What recall returns and the vector is computed from."""
    return episode.summary or episode.user_message[:200]


def with_vectors(episodes: Sequence[Episode], embed: EmbeddingFunction[Documents]) -> list[Episode]:
    """The episodes, those without a vector given their document's in one batch."""
    missing = [i for i, e in enumerate(episodes) if e.embedding is None]
    ready = list(episodes)
    if missing:
        vectors = embed([document_of(episodes[i]) for i in missing])
        for i, vector in zip(missing, vectors, strict=True):
            ready[i] = episodes[i].model_copy(update={"embedding": tuple(float(x) for x in vector)})
    return ready


def summary_of(meta: Mapping[str, Any], document: str | None) -> str:
    """Older memories kept the summary in their metadata."""
    return str(meta.get("summary") or document or "")


def _as_float(value: object) -> float:
    return float(cast(float, value)) if isinstance(value, int | float) else 0.0


def _as_int(value: object) -> int:
    return int(value) if isinstance(value, int | float) else 0
