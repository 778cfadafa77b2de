"""Episodic and semantic memory in Chroma, retrieved by meaning and weighted by evidence.

Why it looks like this:

* Each interaction that mattered is stored as one embedded summary. Retrieval ranks by
  cosine similarity times ``1 + ess_score`` so that, between two equally relevant
  memories, the one backed by stronger arguments surfaces first.
* Reranking only matters if there is something to rerank, so more candidates than
  asked for are fetched from the index first.
* The product hosts one personality per Discord guild / Slack workspace. Each gets its
  own collection (see :func:`collection_name_for`) inside one shared PersistentClient,
  so communities can never read each other's memories.
* Chroma is synchronous; callers on an event loop use ``asyncio.to_thread``. Nothing
  here holds state besides the collection handle, and the embedding function is
  thread-safe, so concurrent calls (even on different collections) are safe.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Where

from sonality.memory.embedding import default_embedding_function, make_chroma_client

#: How many index candidates to fetch per requested result before reranking.
CANDIDATE_FACTOR = 3
EPISODIC = "episodic"
SEMANTIC = "semantic"

_SLUG_MAX = 64
_HASH_CHARS = 16


def collection_name_for(community_id: str) -> str:
    """Map a community id ("discord:1234", "slack:T0A1", ...) to a Chroma collection name.

    The readable slug makes the data directory inspectable; the hash of the *exact* id
    makes the mapping collision-free even when two ids slugify alike ("a:b" vs "a-b")
    and keeps the name within Chroma's rules (3-512 chars of ``[a-zA-Z0-9._-]``,
    alphanumeric at both ends).
    """
    digest = hashlib.sha256(community_id.encode("utf-8")).hexdigest()[:_HASH_CHARS]
    slug = re.sub(r"[^a-zA-Z0-9]+", "-", community_id).strip("-")[:_SLUG_MAX].strip("-")
    return f"episodes-{slug}-{digest}" if slug else f"episodes-{digest}"


class EpisodeStore:
    """One community's memories: store, retrieve by meaning, list recent ones.

    ``EpisodeStore(persist_dir)`` works as the seed API describes; the keyword arguments
    let the bot share one client and one embedding function across all communities.
    """

    def __init__(
        self,
        persist_dir: str | Path,
        *,
        collection: str = "episodes",
        client: ClientAPI | None = None,
        embedding_function: EmbeddingFunction[Documents] | None = None,
        model_cache_dir: Path | None = None,
    ) -> None:
        self.persist_dir = Path(persist_dir)
        if embedding_function is None:
            if model_cache_dir is None:
                from sonality import config

                model_cache_dir = config.DATA_DIR / "models"
            embedding_function = default_embedding_function(model_cache_dir)
        self._embed = embedding_function
        self._client = client if client is not None else make_chroma_client(self.persist_dir)
        self._collection: Collection = self._client.get_or_create_collection(
            name=collection,
            embedding_function=embedding_function,  # type: ignore[arg-type]
            configuration={"hnsw": {"space": "cosine"}},
        )
        space = (self._collection.configuration_json.get("hnsw") or {}).get("space")
        if space not in (None, "cosine"):
            # A pre-existing collection in another space would make 1 - distance wrong.
            raise ValueError(f"collection {collection!r} uses {space!r} space, not cosine")

    @classmethod
    def for_community(
        cls,
        community_id: str,
        persist_dir: str | Path,
        *,
        client: ClientAPI | None = None,
        embedding_function: EmbeddingFunction[Documents] | None = None,
        model_cache_dir: Path | None = None,
    ) -> EpisodeStore:
        """The store of one Discord guild / Slack workspace / terminal session."""
        return cls(
            persist_dir,
            collection=collection_name_for(community_id),
            client=client,
            embedding_function=embedding_function,
            model_cache_dir=model_cache_dir,
        )

    @property
    def collection_name(self) -> str:
        return self._collection.name

    # -- writing -----------------------------------------------------------------------

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
        """Store (or overwrite) one episode and return its id.

        ``upsert`` keyed by ``episode_id`` makes a replayed interaction (retry after a
        crash, duplicate platform event) overwrite rather than duplicate its memory.
        """
        episode_id = episode_id or uuid.uuid4().hex
        document = summary or user_message[:200]
        metadata: dict[str, str | int | float | bool] = {
            "ess_score": float(ess_score),
            "topics": ",".join(topics),
            "summary": summary,
            "memory_type": memory_type,
            "user_message": user_message[:500],
            "agent_response": agent_response[:500],
            "timestamp": datetime.now(UTC).isoformat(),
            "interaction": int(interaction_count),
        }
        self._collection.upsert(ids=[episode_id], documents=[document], metadatas=[metadata])
        return episode_id

    # -- reading -----------------------------------------------------------------------

    def count(self) -> int:
        return self._collection.count()

    def embed_query(self, query: str) -> Embeddings:
        """Embed a query once so several filtered passes can reuse the vector."""
        return self._embed.embed_query([query])

    def retrieve(
        self,
        query: str,
        n_results: int = 5,
        min_relevance: float = 0.3,
        where: dict[str, Any] | None = None,
    ) -> list[str]:
        """Summaries of the most relevant episodes, best first.

        Cosine similarity (``1 - distance``) below ``min_relevance`` is dropped; the rest
        is ranked by ``similarity * (1 + ess_score)``. ``where`` filters on metadata,
        e.g. ``{"interaction": {"$gte": 40}}``.
        """
        if n_results <= 0 or self.count() == 0:
            return []
        return self._ranked(self.embed_query(query), n_results, min_relevance, where)

    def retrieve_typed(
        self,
        query: str,
        episodic_n: int = 3,
        semantic_n: int = 2,
        min_relevance: float = 0.3,
    ) -> list[str]:
        """Semantic memories (distilled knowledge) first, then episodes, without repeats."""
        if self.count() == 0:
            return []
        vector = self.embed_query(query)
        semantic = self._ranked(vector, semantic_n, min_relevance, {"memory_type": SEMANTIC})
        episodic = self._ranked(vector, episodic_n, min_relevance, {"memory_type": EPISODIC})
        return list(dict.fromkeys([*semantic, *episodic]))

    def recent_summaries(self, since_interaction: int, limit: int = 20) -> list[str]:
        """Summaries of episodes from ``since_interaction`` on, oldest first, newest last.

        Used by reflection, which wants what happened since it last ran, in order.
        """
        if limit <= 0:
            return []
        got = self._collection.get(
            where=cast(Where, {"interaction": {"$gte": int(since_interaction)}}),
            include=["metadatas", "documents"],
        )
        metadatas = got["metadatas"] or []
        documents = got["documents"] or []
        rows = sorted(
            zip(metadatas, documents, strict=True),
            key=lambda row: (_as_int(row[0].get("interaction")), str(row[0].get("timestamp", ""))),
        )
        return [_summary_of(meta, doc) for meta, doc in rows[-limit:]]

    def _ranked(
        self,
        query_embedding: Embeddings,
        n_results: int,
        min_relevance: float,
        where: dict[str, Any] | None,
    ) -> list[str]:
        if n_results <= 0:
            return []
        result = self._collection.query(
            query_embeddings=query_embedding,
            n_results=n_results * CANDIDATE_FACTOR,
            where=where,
            include=["metadatas", "documents", "distances"],
        )
        distances = (result["distances"] or [[]])[0]
        metadatas = (result["metadatas"] or [[]])[0]
        documents = (result["documents"] or [[]])[0]
        scored: list[tuple[float, float, str]] = []
        for distance, meta, doc in zip(distances, metadatas, documents, strict=True):
            similarity = 1.0 - float(distance)
            if similarity < min_relevance:
                continue
            ess = _as_float(meta.get("ess_score"))
            scored.append((similarity * (1.0 + ess), similarity, _summary_of(meta, doc)))
        scored.sort(key=lambda item: (item[0], item[1]), reverse=True)
        return [summary for _, _, summary in scored[:n_results]]


def _summary_of(meta: Mapping[str, Any], document: str | None) -> str:
    """The stored summary, or the document (truncated user message) if there was none."""
    return str(meta.get("summary") or document or "")


def _as_float(value: object) -> float:
    return float(cast(float, value)) if isinstance(value, int | float) else 0.0


def _as_int(value: object) -> int:
    return int(value) if isinstance(value, int | float) else 0
