"""Copying the local Chroma directory into a Chroma server (`python -m app migrate`).

Why the vectors are copied and not computed again: they are what recall ranks by, and
an episode's vector was made from its summary by the model the bot ran then. Copying
them keeps every recall exactly as it was (and costs no embedding time); the target's
collections are created with the same HNSW settings (cosine space) and the bot's
embedding function recorded, as the bot itself creates them.

A server database that already holds collections is refused unless the caller says the
copy is being resumed (the PostgreSQL side keeps that mark, see `storage.transfer`):
then every record is written again as an upsert by id, which changes nothing already
there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from chromadb.api import ClientAPI
from chromadb.api.collection_configuration import CreateCollectionConfiguration
from chromadb.api.models.Collection import Collection
from chromadb.api.types import Documents, EmbeddingFunction

from chroma_memory.embedding import close_chroma_client, make_chroma_client
from chroma_memory.server import ServerChroma

log = logging.getLogger(__name__)

PAGE = 500
"""Records read from the source and sent to the server per request."""

#: HNSW settings carried over (the rest of a collection's configuration is Chroma's own).
_HNSW_KEYS = (
    "space",
    "ef_construction",
    "ef_search",
    "max_neighbors",
    "resize_factor",
    "sync_threshold",
    "batch_size",
)


class EpisodesRefused(Exception):
    """The target already holds memories of something else: the line to print."""


@dataclass
class CollectionCopy:
    name: str
    records: int
    target_records: int = 0


def copy_episodes(
    source_dir: Path,
    target: ServerChroma,
    embedding_function: EmbeddingFunction[Documents],
    *,
    resume: bool,
    on_collection: Callable[[CollectionCopy], None] | None = None,
) -> list[CollectionCopy]:
    """Copy every collection of `source_dir` into the server's database, then check that
    each holds as many records on both sides. A missing `source_dir` copies nothing."""
    if not resume and target.client.count_collections() > 0:
        raise EpisodesRefused(
            f"the Chroma server at {target.url} already holds collections in database "
            f"{target.database}; migrate only into an empty one (SONALITY_CHROMA_DATABASE "
            "names another)"
        )
    if not (source_dir / "chroma.sqlite3").is_file():
        return []
    source = make_chroma_client(source_dir)
    copies: list[CollectionCopy] = []
    try:
        for listed in sorted(source.list_collections(), key=lambda c: c.name):
            mine = source.get_collection(listed.name, embedding_function=embedding_function)  # type: ignore[arg-type]
            theirs = _target_collection(target.client, mine, embedding_function)
            copy = CollectionCopy(mine.name, _copy_records(mine, theirs))
            copy.target_records = theirs.count()
            if copy.target_records != copy.records:
                raise RuntimeError(
                    f"collection {copy.name}: {copy.records} records in {source_dir} but "
                    f"{copy.target_records} on the server after the copy"
                )
            copies.append(copy)
            if on_collection is not None:
                on_collection(copy)
    finally:
        close_chroma_client(source_dir)
    return copies


def _target_collection(
    client: ClientAPI, mine: Collection, embedding_function: EmbeddingFunction[Documents]
) -> Collection:
    hnsw = mine.configuration_json.get("hnsw") or {}
    settings = {k: hnsw[k] for k in _HNSW_KEYS if hnsw.get(k) is not None}
    settings.setdefault("space", "cosine")
    return client.get_or_create_collection(
        name=mine.name,
        embedding_function=embedding_function,  # type: ignore[arg-type]
        configuration=cast(CreateCollectionConfiguration, {"hnsw": settings}),
        metadata=mine.metadata or None,
    )


def _copy_records(mine: Collection, theirs: Collection) -> int:
    """Page through the source by offset (ids, vectors, documents, metadata) and upsert."""
    copied = 0
    total = mine.count()
    while copied < total:
        got = mine.get(limit=PAGE, offset=copied, include=["embeddings", "documents", "metadatas"])
        ids = list(got["ids"])
        if not ids:
            break
        vectors: Any = got["embeddings"]  # float32 arrays, sent as they are
        theirs.upsert(
            ids=ids,
            embeddings=vectors,
            documents=got["documents"],
            metadatas=got["metadatas"],
        )
        copied += len(ids)
    return copied
