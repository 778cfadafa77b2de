"""Episodic and semantic memory in Chroma, retrieved by meaning and weighted by evidence.

Why it looks like this:

* Each interaction is stored with its ESS summary as the document, and the vector is
  the document's too, for every memory (see :class:`Episode` for why not the raw
  message). Retrieval ranks by
  cosine similarity times ``1 + ess_score`` so that, between two equally relevant
  memories, the one backed by stronger arguments surfaces first.
* Reranking only matters if there is something to rerank, so more candidates than
  asked for are fetched from the index first.
* The product hosts one personality per Discord guild / Slack workspace. Each gets its
  own collections (see :func:`collection_name_for`): ``<name>`` for episodes and
  ``<name>-semantic`` for consolidated insights, created on first use. Separate
  collections instead of a ``memory_type`` filter: a filter matching most of a large
  collection made every query ~20x slower. All live in one shared client, so
  communities can never read each other's memories; :class:`SharedChroma` reopens it
  when too many collections are open, so every operation fetches its collection
  handles inside ``chroma.use()`` instead of keeping them.
* Chroma is synchronous; callers on an event loop use ``asyncio.to_thread``. The only
  state here is whether the semantic collection exists yet (it is made with
  get-or-create, so threads racing to create it is harmless), and the embedding
  function is thread-safe.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, cast

import numpy as np
from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Where
from chromadb.errors import NotFoundError

from sonality.memory.embedding import default_embedding_function
from sonality.memory.shared_chroma import SharedChroma
from sonality.store import EPISODIC, SEMANTIC, Episode, HiddenRange

#: How many index candidates to fetch per requested result before reranking.
CANDIDATE_FACTOR = 3
__all__ = [
    "EPISODIC",
    "SEMANTIC",
    "Episode",
    "EpisodeMemory",
    "EpisodeStore",
    "collection_name_for",
    "document_of",
    "with_vectors",
]

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


class EpisodeMemory(Protocol):
    """A community's memories as the agent, commands and benchmarks use them: an
    :class:`EpisodeStore` in this process, or a ``RemoteEpisodeStore`` kept by the
    memory process."""

    def embed_many(self, texts: Sequence[str]) -> Embeddings: ...

    def store_many(self, episodes: Sequence[Episode]) -> None: ...

    def retrieve_typed(
        self,
        query: str,
        episodic_n: int = 3,
        semantic_n: int = 2,
        min_relevance: float = 0.3,
        *,
        query_embedding: Embeddings | None = None,
        unwritten: Sequence[Episode] = (),
        hidden: Sequence[HiddenRange] = (),
    ) -> list[str]: ...

    def retrieve(
        self,
        query: str,
        n_results: int = 5,
        min_relevance: float = 0.3,
        where: dict[str, Any] | None = None,
        *,
        query_embedding: Embeddings | None = None,
    ) -> list[str]: ...

    def recent_summaries(
        self, since_interaction: int, limit: int = 20, hidden: Sequence[HiddenRange] = ()
    ) -> list[str]: ...

    def count(self) -> int: ...


class EpisodeStore:
    """One community's memories: store, retrieve by meaning, list recent ones.

    One embedding space: each memory's vector is its document's (an episode's ESS
    summary, an insight's text), given with the episode or computed here, so one
    ``min_relevance`` means the same for all of them.

    ``EpisodeStore(persist_dir)`` works as the seed API describes; the keyword arguments
    let the bot share one client and one embedding function across all communities.
    """

    def __init__(
        self,
        persist_dir: str | Path,
        *,
        collection: str = "episodes",
        client: SharedChroma | None = None,
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
        self.chroma = client if client is not None else SharedChroma(self.persist_dir)
        self._name = collection
        # Semantic memories (consolidated insights) are few and live in their own
        # collection, created on first use: a metadata filter that matches most of a large
        # collection costs Chroma tens of milliseconds, an unfiltered query about two.
        self._semantic_name = f"{collection}-semantic"
        self._has_semantic = True  # until the probe below says otherwise
        with self.chroma.use():
            self._episodic()
            self._has_semantic = self._semantic(create=False) is not None

    def _open(self, client: ClientAPI, name: str, create: bool) -> Collection:
        # Looking up first: after a SharedChroma reopen every active community opens its
        # collection again, and a get costs 0.5 ms of GIL against 1.4 ms for get-or-create.
        try:
            collection = client.get_collection(
                name=name,
                embedding_function=self._embed,  # type: ignore[arg-type]
            )
        except NotFoundError:
            if not create:
                raise
            collection = client.get_or_create_collection(
                name=name,
                embedding_function=self._embed,  # type: ignore[arg-type]
                configuration={"hnsw": {"space": "cosine"}},
            )
        space = (collection.configuration_json.get("hnsw") or {}).get("space")
        if space not in (None, "cosine"):
            # A pre-existing collection in another space would make 1 - distance wrong.
            raise ValueError(f"collection {name!r} uses {space!r} space, not cosine")
        return collection

    # Only inside ``self.chroma.use()``: handles are valid until the client is reopened.
    def _episodic(self) -> Collection:
        collection = self.chroma.collection(self._name, create=True, opener=self._open)
        assert collection is not None
        return collection

    def _semantic(self, *, create: bool) -> Collection | None:
        if not create and not self._has_semantic:
            return None
        collection = self.chroma.collection(self._semantic_name, create=create, opener=self._open)
        if collection is not None:
            self._has_semantic = True
        return collection

    @classmethod
    def for_community(
        cls,
        community_id: str,
        persist_dir: str | Path,
        *,
        client: SharedChroma | None = None,
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
        return self._name

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

    def store_many(self, episodes: Sequence[Episode]) -> None:
        """Upsert episodes, semantic ones into the ``-semantic`` collection.

        Vectors are computed from the document, in one batch, for episodes without
        ``embedding``; one that carries a vector must have it from the same text.
        """
        semantic = [e for e in episodes if e.memory_type == SEMANTIC]
        episodic = [e for e in episodes if e.memory_type != SEMANTIC]
        with self.chroma.use():
            if semantic:
                collection = self._semantic(create=True)
                assert collection is not None
                self._upsert(collection, semantic)
            if episodic:
                self._upsert(self._episodic(), episodic)

    def _upsert(self, collection: Collection, episodes: Sequence[Episode]) -> None:
        now = datetime.now(UTC).isoformat()
        episodes = with_vectors(episodes, self._embed)
        collection.upsert(
            ids=[e.id for e in episodes],
            embeddings=cast(Embeddings, [list(e.embedding or ()) for e in episodes]),
            documents=[document_of(e) for e in episodes],
            metadatas=[
                {
                    "ess_score": float(e.ess_score),
                    "topics": ",".join(e.topics),
                    "summary": e.summary,
                    "memory_type": e.memory_type,
                    "user_message": e.user_message[:500],
                    "agent_response": e.agent_response[:500],
                    "timestamp": now,
                    "interaction": int(e.interaction),
                    "version": int(e.version),
                }
                for e in episodes
            ],
        )

    # -- reading -----------------------------------------------------------------------

    def count(self) -> int:
        with self.chroma.use():
            semantic = self._semantic(create=False)
            return self._episodic().count() + (semantic.count() if semantic is not None else 0)

    def stored(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        """The episodes with these ids exactly as Chroma holds them (document and
        metadata, no vector), so a member's data export shows what is really kept."""
        if not ids:
            return []
        with self.chroma.use():
            got = self._episodic().get(ids=list(ids), include=["documents", "metadatas"])
        documents = got.get("documents") or [None] * len(got["ids"])
        metadatas = got.get("metadatas") or [None] * len(got["ids"])
        return [
            {"id": i, "document": d, "metadata": dict(m or {})}
            for i, d, m in zip(got["ids"], documents, metadatas, strict=True)
        ]

    def embed_many(self, texts: Sequence[str]) -> Embeddings:
        """Vectors for several texts in one model pass (the embedding lane's unit)."""
        return self._embed(list(texts))

    def embed_query(self, query: str) -> Embeddings:
        """Embed a query once so several filtered passes can reuse the vector."""
        return self._embed.embed_query([query])

    def retrieve(
        self,
        query: str,
        n_results: int = 5,
        min_relevance: float = 0.3,
        where: dict[str, Any] | None = None,
        *,
        query_embedding: Embeddings | None = None,
    ) -> list[str]:
        """Summaries of the most relevant episodes, best first.

        Cosine similarity (``1 - distance``) below ``min_relevance`` is dropped; the rest
        is ranked by ``similarity * (1 + ess_score)``. ``where`` filters on metadata,
        e.g. ``{"interaction": {"$gte": 40}}``; a top-level ``memory_type`` in it picks
        the collection to search instead of filtering.
        """
        if n_results <= 0:
            return []
        vector = query_embedding if query_embedding is not None else self.embed_query(query)
        memory_type = (where or {}).get("memory_type")
        rest = {k: v for k, v in (where or {}).items() if k != "memory_type"} or None
        with self.chroma.use():
            sources: list[tuple[Collection, dict[str, Any] | None]] = []
            semantic = self._semantic(create=False)
            if memory_type in (None, SEMANTIC) and semantic is not None:
                sources.append((semantic, rest))
            if memory_type in (None, EPISODIC):
                sources.append((self._episodic(), rest))
            return self._ranked(vector, n_results, min_relevance, sources)

    def retrieve_typed(
        self,
        query: str,
        episodic_n: int = 3,
        semantic_n: int = 2,
        min_relevance: float = 0.3,
        *,
        query_embedding: Embeddings | None = None,
        unwritten: Sequence[Episode] = (),
        hidden: Sequence[HiddenRange] = (),
    ) -> list[str]:
        """Semantic memories (distilled knowledge) first, then episodes, without repeats.

        Pass `query_embedding` when the caller already embedded `query`. `unwritten`
        episodes (committed, waiting to be stored) that carry a vector are ranked with
        the stored ones, by the same score. Memories whose interaction lies in a
        `hidden` range (undone by a rollback, see `HiddenRange`) are left out.
        """
        vector = query_embedding if query_embedding is not None else self.embed_query(query)
        waiting = [e for e in unwritten if e.embedding is not None and not _is_hidden(e, hidden)]
        where = outside(hidden)
        with self.chroma.use():
            collection = self._semantic(create=False)
            semantic = self._ranked(
                vector,
                semantic_n,
                min_relevance,
                [(collection, where)] if collection is not None else [],
                [e for e in waiting if e.memory_type == SEMANTIC],
            )
            episodic = self._ranked(
                vector,
                episodic_n,
                min_relevance,
                [(self._episodic(), where)],
                [e for e in waiting if e.memory_type != SEMANTIC],
            )
        return list(dict.fromkeys([*semantic, *episodic]))

    def recent_summaries(
        self, since_interaction: int, limit: int = 20, hidden: Sequence[HiddenRange] = ()
    ) -> list[str]:
        """Summaries of episodes from ``since_interaction`` on, oldest first, newest last,
        leaving out `hidden` ranges as `retrieve_typed` does.

        Used by reflection, which wants what happened since it last ran, in order.
        """
        if limit <= 0:
            return []
        since: dict[str, Any] = {"interaction": {"$gte": int(since_interaction)}}
        hide = outside(hidden)
        with self.chroma.use():
            got = self._episodic().get(
                where=cast(Where, {"$and": [since, hide]} if hide else since),
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
        sources: Sequence[tuple[Collection, dict[str, Any] | None]],
        unwritten: Sequence[Episode] = (),
    ) -> list[str]:
        if n_results <= 0:
            return []
        scored: list[tuple[float, float, str]] = []
        stored: set[str] = set()
        for collection, where in sources:
            result = collection.query(
                query_embeddings=query_embedding,
                n_results=n_results * CANDIDATE_FACTOR,
                where=cast(Where | None, where),
                include=["metadatas", "documents", "distances"],
            )
            distances = (result["distances"] or [[]])[0]
            metadatas = (result["metadatas"] or [[]])[0]
            documents = (result["documents"] or [[]])[0]
            stored.update(result["ids"][0] if result["ids"] else [])
            for distance, meta, doc in zip(distances, metadatas, documents, strict=True):
                similarity = 1.0 - float(distance)
                if similarity < min_relevance:
                    continue
                ess = _as_float(meta.get("ess_score"))
                scored.append((similarity * (1.0 + ess), similarity, _summary_of(meta, doc)))
        waiting = [e for e in unwritten if e.id not in stored]  # a write may have just landed
        if waiting:
            # Chroma's cosine distance is 1 - cos, so the same similarity, computed here.
            query = np.asarray(query_embedding[0], dtype=np.float32)
            vectors = np.asarray([e.embedding for e in waiting], dtype=np.float32)
            norms = np.linalg.norm(vectors, axis=1) * float(np.linalg.norm(query))
            cosines = vectors @ query / np.where(norms == 0, 1.0, norms)
            for episode, cosine in zip(waiting, cosines.tolist(), strict=True):
                if cosine >= min_relevance:
                    score = cosine * (1.0 + episode.ess_score)
                    scored.append((score, cosine, document_of(episode)))
        scored.sort(key=lambda item: (item[0], item[1]), reverse=True)
        return [summary for _, _, summary in scored[:n_results]]


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


def _is_hidden(episode: Episode, hidden: Sequence[HiddenRange]) -> bool:
    return any(
        after < episode.interaction <= upto and episode.version < from_version
        for after, upto, from_version in hidden
    )


def document_of(episode: Episode) -> str:
    """The stored document: what recall returns for an episode, written or waiting, and
    the text its vector is computed from."""
    return episode.summary or episode.user_message[:200]


def with_vectors(episodes: Sequence[Episode], embed: EmbeddingFunction[Documents]) -> list[Episode]:
    """The episodes, each with a vector: those without one (the agent's embedding of
    them failed, or they were stored directly) get their document's, in one batch."""
    missing = [i for i, e in enumerate(episodes) if e.embedding is None]
    ready = list(episodes)
    if missing:
        vectors = embed([document_of(episodes[i]) for i in missing])
        for i, vector in zip(missing, vectors, strict=True):
            ready[i] = episodes[i].model_copy(update={"embedding": tuple(float(x) for x in vector)})
    return ready


def _summary_of(meta: Mapping[str, Any], document: str | None) -> str:
    """The stored summary, or the document (truncated user message) if there was none."""
    return str(meta.get("summary") or document or "")


def _as_float(value: object) -> float:
    return float(cast(float, value)) if isinstance(value, int | float) else 0.0


def _as_int(value: object) -> int:
    return int(value) if isinstance(value, int | float) else 0
