"""One community's episodes among thousands: the bot's store, on the embedded Chroma
or a Chroma server.

Same ranking, hiding and documents as the seed's
:class:`sonality.memory.episodes.EpisodeStore` (it uses that module's helpers), with
three differences:

* one Chroma client shared by all communities (:class:`SharedChroma`, reopened when
  too many collections are open, so every operation fetches its collection handles
  inside ``chroma.use()`` instead of keeping them);
* semantic memories (insights) in a ``<name>-semantic`` collection of their own,
  created on first use, instead of a ``memory_type`` filter;
* the embedding function is passed in (the bot shares one), by default the ONNX model
  built by :mod:`chroma_memory.embedding`.

Chroma is synchronous; callers on an event loop use ``asyncio.to_thread``. The only
state here is whether the semantic collection exists yet (it is made with
get-or-create, so threads racing to create it is harmless). A store that other
processes write too (``shared``, a Chroma server) never trusts a "no": another process
may create the collection at any moment, and an insight it writes there must be
recalled, and found by a forget-me, here as well.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Concatenate, ParamSpec, Protocol, TypeVar, cast

import numpy as np
from chromadb.api import ClientAPI
from chromadb.api.models.Collection import Collection
from chromadb.api.types import Documents, EmbeddingFunction, Embeddings, Where
from chromadb.errors import NotFoundError

from chroma_memory.embedding import default_embedding_function
from chroma_memory.shared_chroma import ChromaHandle, SharedChroma, vacuum
from sonality.memory.episodes import (
    EPISODIC_N,
    MIN_RELEVANCE,
    N_RESULTS,
    RECENT_N,
    SEMANTIC_N,
    EpisodeMemory,
    Scored,
    SeedStoreMethods,
    best,
    delete_wiped,
    document_of,
    ids_with,
    in_order,
    outside,
    relevance,
    scored_matches,
    stored_in,
    upsert,
    with_vectors,
)
from sonality.store import EPISODIC, SEMANTIC, Episode, HiddenRange

__all__ = [
    "CommunityEpisodeStore",
    "ForwardingStore",
    "WaitingAwareMemory",
    "collection_name_for",
    "community_collections",
]

T = TypeVar("T")
P = ParamSpec("P")

#: Writes between two saves of a collection's HNSW index. Chroma's own default (1,000)
#: leaves up to 999 writes in its log alone, and each time the index is loaded (after
#: every reopen of the shared client) Chroma inserts them into the graph again. Measured
#: with chromadb 1.5.9 on the bot's 2-core machine: loading and querying a collection of
#: 512 memories cost 55–60 ms of CPU at 1,000 against 6–7 ms at 32, and a write of 8
#: 18 ms against 6 (docs/performance.md, "How often an index is saved").
SYNC_THRESHOLD = 32
CHROMA_DEFAULT_SYNC_THRESHOLD = 1000

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


def community_collections(community_id: str) -> list[str]:
    """Both of a community's collections: episodes, and consolidated insights."""
    name = collection_name_for(community_id)
    return [name, f"{name}-semantic"]


def scored_waiting(
    query_embedding: Embeddings,
    waiting: Sequence[Episode],
    hidden: Sequence[HiddenRange],
    min_relevance: float,
) -> list[Scored]:
    """Unwritten episodes with a vector, scored exactly as stored ones are."""
    waiting = [e for e in waiting if e.embedding is not None and not is_hidden(e, hidden)]
    if not waiting:
        return []
    query = np.asarray(query_embedding[0], dtype=np.float32)
    vectors = np.asarray([e.embedding for e in waiting], dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1) * float(np.linalg.norm(query))
    cosines = vectors @ query / np.where(norms == 0, 1.0, norms)
    return [
        (relevance(cosine, episode.ess_score), cosine, document_of(episode))
        for episode, cosine in zip(waiting, cosines.tolist(), strict=True)
        if cosine >= min_relevance
    ]


def is_hidden(episode: Episode, hidden: Sequence[HiddenRange]) -> bool:
    """The in-memory twin of :func:`outside`, for episodes not yet stored."""
    return any(
        after < episode.interaction <= upto and episode.version < from_version
        for after, upto, from_version in hidden
    )


class WaitingAwareMemory(EpisodeMemory, Protocol):
    """A store that ranks episodes not yet written with its own (`unwritten`)."""

    def retrieve_typed(
        self,
        query: str,
        episodic_n: int = EPISODIC_N,
        semantic_n: int = SEMANTIC_N,
        min_relevance: float = MIN_RELEVANCE,
        *,
        query_embedding: Embeddings | None = None,
        unwritten: Sequence[Episode] = (),
        hidden: Sequence[HiddenRange] = (),
    ) -> list[str]: ...


class CommunityEpisodeStore(SeedStoreMethods):
    """One community's memories: store, retrieve by meaning, list recent ones.

    One embedding space: each memory's vector is its document's (an episode's ESS
    summary, an insight's text), given with the episode or computed here, so one
    ``min_relevance`` means the same for all of them.

    ``CommunityEpisodeStore(persist_dir)`` alone opens its own client and the default
    model; the keyword arguments let the bot share one client and one embedding
    function across all communities. With a ``client`` no directory is needed (a Chroma
    server's has none here).
    """

    def __init__(
        self,
        persist_dir: str | Path | None,
        *,
        collection: str = "episodes",
        client: ChromaHandle | None = None,
        embedding_function: EmbeddingFunction[Documents] | None = None,
        model_cache_dir: Path | None = None,
        shared: bool = False,
    ) -> None:
        """`shared`: other processes write these collections too (see the module)."""
        self.persist_dir = Path(persist_dir) if persist_dir is not None else None
        if embedding_function is None:
            if model_cache_dir is None:
                from sonality import config

                model_cache_dir = config.DATA_DIR / "models"
            embedding_function = default_embedding_function(model_cache_dir)
        self._embed = embedding_function
        if client is None:
            if self.persist_dir is None:
                raise TypeError("CommunityEpisodeStore needs a persist_dir or a client")
            client = SharedChroma(self.persist_dir)
        self.chroma = client
        self._name = collection
        # Semantic memories (consolidated insights) are few and live in their own
        # collection, created on first use: a metadata filter that matches most of a large
        # collection costs Chroma tens of milliseconds, an unfiltered query about two.
        self._semantic_name = f"{collection}-semantic"
        self._shared = shared
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
                configuration={"hnsw": {"space": "cosine", "sync_threshold": SYNC_THRESHOLD}},
            )
        hnsw = collection.configuration_json.get("hnsw") or {}
        space = hnsw.get("space")
        if space not in (None, "cosine"):
            # A pre-existing collection in another space would make 1 - distance wrong.
            raise ValueError(f"collection {name!r} uses {space!r} space, not cosine")
        if hnsw.get("sync_threshold") in (None, CHROMA_DEFAULT_SYNC_THRESHOLD):
            # Made before SYNC_THRESHOLD: lowered once, before this client loads the
            # index. Any other value is kept (1 while a forget-me purges the log).
            collection.modify(configuration={"hnsw": {"sync_threshold": SYNC_THRESHOLD}})
        return collection

    # Only inside ``self.chroma.use()``: handles are valid until the client is reopened.
    def _episodic(self) -> Collection:
        collection = self.chroma.collection(self._name, create=True, opener=self._open)
        assert collection is not None
        return collection

    def _semantic(self, *, create: bool) -> Collection | None:
        """The insight collection; None if it does not exist (and not `create`). Known
        absent without asking Chroma only when no other process can create it."""
        if not create and not self._semantic_may_exist:
            return None
        collection = self.chroma.collection(self._semantic_name, create=create, opener=self._open)
        if collection is not None:
            self._has_semantic = True
        return collection

    @property
    def _semantic_may_exist(self) -> bool:
        return self._has_semantic or self._shared

    @classmethod
    def for_community(
        cls,
        community_id: str,
        persist_dir: str | Path | None,
        *,
        client: ChromaHandle | None = None,
        embedding_function: EmbeddingFunction[Documents] | None = None,
        model_cache_dir: Path | None = None,
        shared: bool = False,
    ) -> CommunityEpisodeStore:
        """The store of one Discord guild / Slack workspace / terminal session."""
        return cls(
            persist_dir,
            collection=collection_name_for(community_id),
            client=client,
            embedding_function=embedding_function,
            model_cache_dir=model_cache_dir,
            shared=shared,
        )

    @property
    def collection_name(self) -> str:
        return self._name

    # -- writing -----------------------------------------------------------------------

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

    def delete(self, ids: Sequence[str]) -> None:
        """Delete by id from both collections and from Chroma's files (forget-me); ids
        not stored are ignored, so a forget-me re-run after a crash deletes nothing twice.

        Why more than ``collection.delete``: Chroma keeps every write in its own log
        table (``embeddings_queue``, the document and metadata included) until the
        collection's HNSW index is saved, every ``sync_threshold`` writes
        (:data:`SYNC_THRESHOLD`), and its SQLite leaves deleted rows' bytes in free
        pages. Seen in a test: the forgotten member's word was still in
        ``chroma.sqlite3`` after the delete.
        So the collections' ``sync_threshold`` is set to 1 for one reopen of the client
        (Chroma reads it only when it loads an index; loading it then saves it, and
        Chroma purges the log up to that point), set back, and the file is rebuilt with
        Chroma's ``chroma vacuum``. A Chroma server applies no new ``sync_threshold`` to
        an index it holds loaded (tried: its saved index kept the forgotten vector), and
        its files are its operator's to vacuum (docs/privacy.md): there the blank vectors
        of :func:`delete_wiped` are written ``sync_threshold`` times instead, so the
        server saves the index with them.
        """
        if not ids:
            return
        embedded = self.chroma if isinstance(self.chroma, SharedChroma) else None
        thresholds: dict[str, int] = {}
        with self.chroma.use():
            for collection in (self._episodic(), self._semantic(create=False)):
                if collection is None:
                    continue
                hnsw = collection.configuration_json.get("hnsw") or {}
                kept = hnsw.get("sync_threshold")
                threshold = (
                    SYNC_THRESHOLD if kept in (None, CHROMA_DEFAULT_SYNC_THRESHOLD) else int(kept)
                )
                if embedded is None:
                    delete_wiped(collection, ids, saved_after=threshold)
                    continue
                thresholds[collection.name] = threshold
                delete_wiped(collection, ids)  # saved by the reopen in `_purge_files`
                collection.modify(configuration={"hnsw": {"sync_threshold": 1}})
        if embedded is not None:
            self._purge_files(embedded, thresholds)

    def _purge_files(self, chroma: SharedChroma, thresholds: dict[str, int]) -> None:
        """Reopen (the index loads, is saved, and Chroma purges its log), then rebuild
        the SQLite file so deleted rows leave no bytes in free pages."""
        chroma.reopen_now()
        self._restore_thresholds(thresholds)
        vacuum(chroma.persist_dir)

    def _restore_thresholds(self, thresholds: dict[str, int]) -> None:
        with self.chroma.use():
            for name, threshold in thresholds.items():
                collection = self.chroma.collection(name, create=False, opener=self._open)
                if collection is None:
                    continue
                collection.count()  # loads the index: saved, and the log purged
                collection.modify(configuration={"hnsw": {"sync_threshold": threshold}})

    def _upsert(self, collection: Collection, episodes: Sequence[Episode]) -> None:
        upsert(collection, with_vectors(episodes, self._embed))

    # -- reading -----------------------------------------------------------------------

    def count(self) -> int:
        with self.chroma.use():
            semantic = self._semantic(create=False)
            return self._episodic().count() + (semantic.count() if semantic is not None else 0)

    def semantic_ids(self, documents: Sequence[str]) -> list[str]:
        """Why by text: an insight is consolidated as it was extracted, and the audit
        trail records which member's message it was drawn from, so a forget-me finds
        the member's insights this way (the collection is small)."""
        wanted = set(documents)
        if not wanted:
            return []
        with self.chroma.use():
            semantic = self._semantic(create=False)
            if semantic is None:
                return []
            got = semantic.get(include=["documents"])
        return ids_with(got["ids"], got.get("documents") or [], wanted)

    def stored(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        """The memories with these ids exactly as Chroma holds them (document and
        metadata, no vector), so a member's data export shows what is really kept."""
        if not ids:
            return []
        with self.chroma.use():
            semantic = self._semantic(create=False)
            found = stored_in(self._episodic(), ids)
            return found + (stored_in(semantic, ids) if semantic is not None else [])

    def embed_query(self, query: str) -> Embeddings:
        """Embed a query once so several filtered passes can reuse the vector."""
        return self._embed.embed_query([query])

    def retrieve(
        self,
        query: str,
        n_results: int = N_RESULTS,
        min_relevance: float = MIN_RELEVANCE,
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
        episodic_n: int = EPISODIC_N,
        semantic_n: int = SEMANTIC_N,
        min_relevance: float = MIN_RELEVANCE,
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
        where = outside(hidden)
        with self.chroma.use():
            episodic_sources = [(self._episodic(), where)]

            def semantic() -> list[str]:
                # Looked up here, so that asking whether another process has created the
                # collection (`shared`) overlaps the episodic query.
                collection = self._semantic(create=False) if semantic_n > 0 else None
                return self._ranked(
                    vector,
                    semantic_n,
                    min_relevance,
                    [(collection, where)] if collection is not None else [],
                    [e for e in unwritten if e.memory_type == SEMANTIC],
                    hidden,
                )

            def episodic() -> list[str]:
                return self._ranked(
                    vector,
                    episodic_n,
                    min_relevance,
                    episodic_sources,
                    [e for e in unwritten if e.memory_type != SEMANTIC],
                    hidden,
                )

            if self._semantic_may_exist and semantic_n > 0 and episodic_n > 0:
                found = self.chroma.both(semantic, episodic)
            else:  # at most one query: nothing to overlap
                found = semantic(), episodic()
        return list(dict.fromkeys([*found[0], *found[1]]))

    def recent_summaries(
        self, since_interaction: int, limit: int = RECENT_N, hidden: Sequence[HiddenRange] = ()
    ) -> list[str]:
        """Summaries of episodes from ``since_interaction`` on, oldest first, newest last,
        leaving out `hidden` ranges as `retrieve_typed` does (for reflection)."""
        if limit <= 0:
            return []
        since: dict[str, Any] = {"interaction": {"$gte": int(since_interaction)}}
        hide = outside(hidden)
        with self.chroma.use():
            got = self._episodic().get(
                where=cast(Where, {"$and": [since, hide]} if hide else since),
                include=["metadatas", "documents"],
            )
        return in_order(got["metadatas"] or [], got["documents"] or [], limit)

    def _ranked(
        self,
        query_embedding: Embeddings,
        n_results: int,
        min_relevance: float,
        sources: Sequence[tuple[Collection, dict[str, Any] | None]],
        unwritten: Sequence[Episode] = (),
        hidden: Sequence[HiddenRange] = (),
    ) -> list[str]:
        if n_results <= 0:
            return []
        scored: list[Scored] = []
        stored: set[str] = set()
        for collection, where in sources:
            found, ids = scored_matches(
                collection, query_embedding, n_results, where, min_relevance
            )
            scored += found
            stored |= ids
        waiting = [e for e in unwritten if e.id not in stored]  # a write may have just landed
        scored += scored_waiting(query_embedding, waiting, hidden, min_relevance)
        return best(scored, n_results)


def _forwarded(
    method: Callable[Concatenate[CommunityEpisodeStore, P], T], *, read: bool = True
) -> Callable[Concatenate[ForwardingStore, P], T]:
    """`method` of the store underneath, reached through `_read` (or `_call`), with its
    signature: the parameters and defaults are written once, on the store."""

    def forward(self: ForwardingStore, *args: P.args, **kwargs: P.kwargs) -> T:
        reach = self._read if read else self._call
        return reach(lambda store: method(store, *args, **kwargs))

    forward.__doc__ = method.__doc__
    return forward


class ForwardingStore(SeedStoreMethods):
    """Every memory call, run on a :class:`CommunityEpisodeStore` held behind something
    (opened lazily, reopened, retried): written once here, so a store of that kind says
    only how a write (`_call`) and a query (`_read`) reach the store underneath."""

    def _call(self, operation: Callable[[CommunityEpisodeStore], T]) -> T:
        raise NotImplementedError

    def _read(self, operation: Callable[[CommunityEpisodeStore], T]) -> T:
        return self._call(operation)

    # Without ids nothing is asked: the store would be opened for nothing.
    def delete(self, ids: Sequence[str]) -> None:
        if ids:
            self._call(lambda store: store.delete(ids))

    def stored(self, ids: Sequence[str]) -> list[dict[str, Any]]:
        return self._read(lambda store: store.stored(ids)) if ids else []

    store_many = _forwarded(CommunityEpisodeStore.store_many, read=False)
    count = _forwarded(CommunityEpisodeStore.count)
    semantic_ids = _forwarded(CommunityEpisodeStore.semantic_ids)
    retrieve_typed = _forwarded(CommunityEpisodeStore.retrieve_typed)
    retrieve = _forwarded(CommunityEpisodeStore.retrieve)
    recent_summaries = _forwarded(CommunityEpisodeStore.recent_summaries)
