"""How personality versions are stored: full keyframes, and small patches between them.

Why: every message commits a version, and most messages (chat) change only a few
counters: the interaction count, the disagreement rate, a topic's engagement. Storing
the whole state each time made a community's history grow with the size of its state
(about 1.3 KB per message for the seed, 18 KB once 75 topics had been argued), for
versions nobody reads one by one.

So a version's ``state_json`` is either

* a **keyframe**: the full state (``keyframe`` column NULL). Version 0, every rollback
  and every row written before this scheme are keyframes; or
* a **patch** (``keyframe`` = the version of the keyframe its chain starts from): a JSON
  merge patch (RFC 7386) turning the previous version's state into this one. Objects
  are merged key by key, so a chat message's patch names only the counters it moved;
  lists are replaced whole; ``null`` removes a key.

A version is rebuilt from its keyframe by applying the patches after it in order.
Whether the next version is stored as a patch is decided by `plan_row`:

* a patch only if applying it to the previous state gives back, byte for byte, the JSON
  of the new state (key order included): anything a patch can't say (a ``null`` value
  in the state) becomes a keyframe instead, so what `state_at` returns is always exactly
  what was committed;
* a keyframe for a seed or a rollback (a moderator's restore point, read back directly);
* a keyframe when the patch is at least half the size of the full state (it saves little
  and lengthens every later rebuild);
* a keyframe once the patches since the last keyframe would outweigh it
  `KEYFRAME_RATIO` times (and `MIN_CHAIN_CHARS`), or the chain would pass `MAX_CHAIN`
  versions.

The last rule bounds both costs, whatever the state's size: keyframes add at most
1 / `KEYFRAME_RATIO` to the bytes the patches take, and a rebuild reads at most
(1 + `KEYFRAME_RATIO`) × its keyframe's bytes (or the keyframe and `MIN_CHAIN_CHARS`)
and applies at most `MAX_CHAIN` patches.

The database guards the chain too: a patch row is refused unless the version right
before it belongs to the same keyframe's chain (a trigger), and rows can be neither
updated nor deleted (history is evidence).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict

from sonality.state import SpongeState
from sonality.store import VersionInfo
from storage.base import (
    POSTGRES,
    SQLITE,
    Conn,
    Row,
    fetchall,
    fetchone,
    from_db_time,
    from_json,
    to_db_time,
    to_json,
)
from storage.models import StorageError, StoredAuditEvent

T = TypeVar("T")

KEYFRAME_RATIO = 4
"""A new keyframe once the patches since the last one would exceed this many times its
size: keyframes then cost at most a quarter of what the patches cost, and a rebuild
reads at most five keyframes' worth of bytes. (At 2, a community holding 75 beliefs
spent 0.15 MB per 1,000 messages on keyframes; rebuilds are rare: a load, a history
page, a rollback.)"""

MIN_CHAIN_CHARS = 8_000
"""...and not before the patches since the last keyframe add up to this much. A row of
this table over about 1,000 bytes (the seed's state is 950) spills into an overflow
page of its own, so even a small keyframe takes over 4 KB on disk; this spreads it over
about 80 chat messages. A rebuild then reads at most this much more."""

MAX_CHAIN = 400
"""Patches after one keyframe at most, so a rebuild applies a bounded number of them
even when a huge state changes by a few bytes per message."""

FULL_CAUSES = frozenset({"seed", "rollback"})
"""Commit causes always stored as a keyframe."""


class ChainTip(BaseModel):
    """One stored version as the next commit needs it: its full state and its chain."""

    model_config = ConfigDict(frozen=True)

    version: int
    state_json: str  # the full state, rebuilt
    keyframe: int  # the version of its chain's keyframe (its own if it is one)
    keyframe_chars: int
    patch_chars: int  # characters of the patches from the keyframe up to this version


class PlannedRow(BaseModel):
    """What `commit` writes for a new version: the text and its chain."""

    model_config = ConfigDict(frozen=True)

    state_json: str
    keyframe: int | None  # None: a keyframe (the full state)
    tip: ChainTip  # the new version, for the commit after it


# --- JSON merge patch (RFC 7386) ----------------------------------------------------------


def merge_diff(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The merge patch that turns `old` into `new` (assumed free of nulls; `plan_row`
    checks that applying it gives `new` exactly)."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        if key not in old:
            patch[key] = value
            continue
        before = old[key]
        # Whole unchanged subtrees are skipped by one comparison in C. (An int that
        # became an equal float inside one is missed here and caught by the check.)
        if value == before and type(value) is type(before):
            continue
        if isinstance(value, dict) and isinstance(before, dict):
            inner = merge_diff(before, value)
            if inner:
                patch[key] = inner
        else:
            patch[key] = value
    for key in old:
        if key not in new:
            patch[key] = None
    return patch


def merge_apply(target: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Apply a merge patch to `target` in place and return it."""
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, dict):
            current = target.get(key)
            target[key] = merge_apply(current if isinstance(current, dict) else {}, value)
        else:
            target[key] = value
    return target


# --- deciding the next row ---------------------------------------------------------------


def plan_row(tip: ChainTip | None, state: SpongeState, cause: str) -> PlannedRow:
    """How to store `state`, the version after `tip` (None: no previous version known)."""
    new = state.model_dump(mode="json")
    full_json = to_json(new)
    keyframe = PlannedRow(
        state_json=full_json,
        keyframe=None,
        tip=ChainTip(
            version=state.version,
            state_json=full_json,
            keyframe=state.version,
            keyframe_chars=len(full_json),
            patch_chars=0,
        ),
    )
    if tip is None or tip.version != state.version - 1 or cause in FULL_CAUSES:
        return keyframe
    base = from_json(tip.state_json)
    patch = merge_diff(base, new)
    patch_json = to_json(patch)
    patch_chars = tip.patch_chars + len(patch_json)
    if (
        2 * len(patch_json) >= len(full_json)
        or patch_chars > max(KEYFRAME_RATIO * tip.keyframe_chars, MIN_CHAIN_CHARS)
        or state.version - tip.keyframe > MAX_CHAIN
        # What `rebuild` will do, checked now (merge_apply never changes the patch).
        or to_json(merge_apply(base, patch)) != full_json
    ):
        return keyframe
    return PlannedRow(
        state_json=patch_json,
        keyframe=tip.keyframe,
        tip=ChainTip(
            version=state.version,
            state_json=full_json,
            keyframe=tip.keyframe,
            keyframe_chars=tip.keyframe_chars,
            patch_chars=patch_chars,
        ),
    )


# --- reading -------------------------------------------------------------------------------

_ROWS = (
    "SELECT version, keyframe, state_json FROM personality_versions "
    "WHERE community_id = ? AND version BETWEEN ? AND ? ORDER BY version"
)


def _chain_start(conn: Conn, community_id: str, version: int | None) -> Row | None:
    """(version, first version of its chain) of `version` (None: the latest), or None."""
    if version is None:
        row = fetchone(
            conn,
            "SELECT version, keyframe FROM personality_versions WHERE community_id = ? "
            "ORDER BY version DESC LIMIT 1",
            (community_id,),
        )
    else:
        row = fetchone(
            conn,
            "SELECT version, keyframe FROM personality_versions "
            "WHERE community_id = ? AND version = ?",
            (community_id, version),
        )
    if row is None:
        return None
    return int(row[0]), int(row[0]) if row[1] is None else int(row[1])


def read_chain(conn: Conn, community_id: str, version: int | None) -> list[Row]:
    """(version, keyframe, state_json) from the keyframe of `version` (None: the latest)
    up to it, oldest first; empty if there is no such version. Run in one snapshot."""
    found = _chain_start(conn, community_id, version)
    if found is None:
        return []
    last, first = found
    return fetchall(conn, _ROWS, (community_id, first, last))


def read_span(conn: Conn, community_id: str, low: int, high: int) -> list[Row]:
    """The rows needed to rebuild every version from `low` to `high`: from the keyframe
    of `low` (or of the first version after it) up to `high`, oldest first."""
    first = fetchone(
        conn,
        "SELECT version FROM personality_versions WHERE community_id = ? AND version >= ? "
        "ORDER BY version LIMIT 1",
        (community_id, low),
    )
    if first is None:
        return []
    found = _chain_start(conn, community_id, int(first[0]))
    return [] if found is None else fetchall(conn, _ROWS, (community_id, found[1], high))


def replay(community_id: str, rows: list[Row]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Each version of `rows` (as the readers above return them) with its full state,
    in order. The dict is changed in place by the next step: use it before moving on."""
    state: dict[str, Any] | None = None
    keyframe = expected = -1
    for version, base, text in rows:
        version = int(version)
        if base is None:
            state, keyframe = from_json(str(text)), version
        elif state is None or int(base) != keyframe or version != expected:
            raise StorageError(
                f"{community_id}: v{version} has no keyframe to start from"
                if state is None
                else f"{community_id}: v{version} breaks the chain of v{keyframe}"
            )
        else:
            merge_apply(state, from_json(str(text)))
        expected = version + 1
        yield version, state


@dataclass(frozen=True)
class VersionSpan:
    """The stored rows from which every version from `low` to `high` can be rebuilt,
    read in one snapshot (`read_span`).

    Why a value of its own: rebuilding many versions is CPU work (JSON and merge
    patches) that a caller may want off its event loop, even in another process. The
    span is plain data (it pickles), and `replay` needs nothing but it.
    """

    community_id: str
    low: int
    high: int
    rows: tuple[tuple[int, int | None, str], ...]  # (version, keyframe, state_json)

    @classmethod
    def of(cls, community_id: str, low: int, high: int, rows: list[Row]) -> VersionSpan:
        return cls(
            community_id,
            low,
            high,
            tuple((int(v), None if k is None else int(k), str(t)) for v, k, t in rows),
        )

    def replay(self) -> Iterator[tuple[int, dict[str, Any]]]:
        """Each version from `low` to `high` with its full state, in order (the dict is
        changed in place by the next step, as in `replay`)."""
        for version, state in replay(self.community_id, list(self.rows)):
            if version > self.high:
                return
            if version >= self.low:
                yield version, state


def rebuild(community_id: str, rows: list[Row]) -> ChainTip | None:
    """The full state at the last of `rows` (as `read_chain` returns them)."""
    if not rows:
        return None
    first = rows[0]
    if first[1] is not None:
        raise StorageError(f"{community_id}: the chain of v{rows[-1][0]} has no keyframe")
    if len(rows) == 1:  # a keyframe: its text is the state
        text = str(first[2])
        version = int(first[0])
        return ChainTip(
            version=version,
            state_json=text,
            keyframe=version,
            keyframe_chars=len(text),
            patch_chars=0,
        )
    *_, (last, state) = replay(community_id, rows)
    return ChainTip(
        version=last,
        state_json=to_json(state),
        keyframe=int(first[0]),
        keyframe_chars=len(first[2]),
        patch_chars=sum(len(r[2]) for r in rows[1:]),
    )


class VersionRange(BaseModel):
    """The versions a history view covers: `first` to `last`, and whether older ones
    were left out for its limit."""

    model_config = ConfigDict(frozen=True)

    first: int
    last: int
    truncated: bool


def version_range(
    conn: Conn, community_id: str, since: datetime | None, at_most: int
) -> VersionRange | None:
    """The newest `at_most` versions, those created at or after `since` if given; None
    when there are none. Two lookups on the primary key, however long the history."""
    row = fetchone(
        conn,
        "SELECT MAX(version) FROM personality_versions WHERE community_id = ?",
        (community_id,),
    )
    if row is None or row[0] is None:
        return None
    last = int(row[0])
    low = max(0, last - at_most + 1)
    if since is None:
        return VersionRange(first=low, last=last, truncated=low > 0)
    row = fetchone(
        conn,
        "SELECT MIN(version) FROM personality_versions "
        "WHERE community_id = ? AND version >= ? AND created_at >= ?",
        (community_id, low, to_db_time(since)),
    )
    if row is None or row[0] is None:
        return None
    first = int(row[0])
    return VersionRange(first=first, last=last, truncated=first == low > 0)


def read_versions(conn: Conn, community_id: str, low: int, high: int) -> list[VersionInfo]:
    """The versions from `low` to `high`, oldest first (what `CommunityStore.versions`
    says of each)."""
    rows = fetchall(
        conn,
        f"SELECT {VERSION_COLUMNS} FROM personality_versions "
        "WHERE community_id = ? AND version BETWEEN ? AND ? ORDER BY version",
        (community_id, low, high),
    )
    return [version_info(r) for r in rows]


VERSION_COLUMNS = "version, cause, change, interaction_count, created_at, actor"
AUDIT_COLUMNS = "version, kind, interaction, payload_json, created_at"


def version_info(row: Row) -> VersionInfo:
    """A row of `VERSION_COLUMNS` as the engine describes a version."""
    return VersionInfo(
        version=row[0],
        cause=row[1],
        change=row[2],
        interaction_count=row[3],
        created_at=from_db_time(row[4]),
        actor=row[5],
    )


def audit_event(row: Row) -> StoredAuditEvent:
    """A row of `AUDIT_COLUMNS`."""
    return StoredAuditEvent(
        version=row[0],
        kind=row[1],
        interaction=row[2],
        payload=from_json(row[3]),
        created_at=from_db_time(row[4]),
    )


def read_events(
    conn: Conn, community_id: str, kind: str, low: int, high: int
) -> list[StoredAuditEvent]:
    """The audit events of one kind recorded with the versions `low` to `high`, oldest
    first."""
    rows = fetchall(
        conn,
        f"SELECT {AUDIT_COLUMNS} FROM audit_events "
        "WHERE community_id = ? AND kind = ? AND version BETWEEN ? AND ? ORDER BY id",
        (community_id, kind, low, high),
    )
    return [audit_event(r) for r in rows]


def read_spans(
    conn: Conn, community_id: str, ranges: Sequence[tuple[int, int]]
) -> list[VersionSpan]:
    """One `VersionSpan` per (low, high) of `ranges`, on one connection."""
    return [
        VersionSpan.of(community_id, low, high, read_span(conn, community_id, low, high))
        for low, high in ranges
    ]


READER_TIMEOUT_S = 5.0
"""How long a reader waits for a write lock it never takes anyway (SQLite's busy
timeout, for the moment a checkpoint holds the file) or for PostgreSQL to answer."""


@dataclass(frozen=True)
class HistoryReader:
    """Reads the stored history from another process, on a connection of its own.

    Why: rebuilding thousands of versions is done in a worker process (`bot.offload`),
    and sending it megabytes of rows from the bot's process costs that process the GIL
    (reading them, then pickling them) while its event loop waits. The worker reads
    them itself instead, read-only: the SQLite file (WAL lets readers in beside the
    bot's writer) or the PostgreSQL database. History is append-only, so a reader that
    starts after the caller looked at the versions finds at least those.
    """

    sqlite_path: str | None = None
    postgres_url: str | None = None

    def read(self, fn: Callable[[Conn], T]) -> T:
        if self.sqlite_path is not None:
            uri = Path(self.sqlite_path).resolve().as_uri() + "?mode=ro"
            raw = sqlite3.connect(uri, uri=True, timeout=READER_TIMEOUT_S, isolation_level=None)
            try:
                raw.execute("BEGIN")  # one snapshot for everything `fn` reads
                return fn(Conn(raw, SQLITE))
            finally:
                raw.close()
        if self.postgres_url is None:
            raise StorageError("a history reader needs a SQLite file or a PostgreSQL URL")
        import psycopg

        with psycopg.connect(self.postgres_url, connect_timeout=int(READER_TIMEOUT_S)) as pg:
            pg.read_only = True
            try:
                return fn(Conn(pg, POSTGRES))
            finally:
                pg.rollback()
