"""`CommunityStore`: the engine's `StateStore` for one community, on the shared database.

Why the outbox shape: a reply is sent before its post-processing (ESS, opinion updates,
reflection) finishes, and the process can die in between. `record_interaction` commits
the answered message first; `commit` later writes the new personality version, its
audit events, its token usage and the acknowledgement of that outbox row in ONE
transaction. So after any crash an interaction is either fully applied or still pending
(and replayed on start), never applied twice or lost.

Every query here is scoped by this store's `community_id`: a community can neither read
nor acknowledge another community's rows, even with a guessed interaction id.

Versions are stored as keyframes and small patches (see `storage.history`); `state_at`
and `latest_state` rebuild the full state, so callers never see the difference.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import Any

from sonality.evidence import EvidenceStep
from sonality.llm import Usage
from sonality.replay import release_in_slices
from sonality.state import SpongeState
from sonality.store import (
    MAX_LEARNING_ATTEMPTS,
    BeingErased,
    Episode,
    InteractionRecord,
    LocalLease,
    Speaker,
    StateCommit,
    UsageRecord,
    VersionInfo,
    utcnow,
)
from storage.base import (
    Conn,
    SqlBase,
    advance_time,
    ensure_community,
    execute,
    fetchall,
    fetchone,
    from_db_time,
    from_json,
    id_chunks,
    insert_usage,
    to_db_time,
    to_json,
)
from storage.coordination import EPISODES, Coordinator, LearningLease
from storage.forgotten import BEING_DELETED, deleted_since, forgotten_since
from storage.history import (
    AUDIT_COLUMNS,
    VERSION_COLUMNS,
    ChainTip,
    VersionRange,
    VersionSpan,
    audit_event,
    plan_row,
    read_chain,
    read_span,
    rebuild,
    version_info,
    version_range,
)
from storage.models import (
    InteractionAlreadyDoneError,
    StoredAuditEvent,
    UnknownInteractionError,
    VersionConflictError,
)

MAX_INTERACTION_ATTEMPTS = MAX_LEARNING_ATTEMPTS
"""Failed post-processing attempts after which an interaction is parked as 'failed'.

A message that crashes post-processing every time (a poison message) must not block
its community's replay queue forever; failed rows stay in the table for inspection.
"""

MAX_ERROR_CHARS = 2000

ACTIVITY_CAUSES = frozenset({"rollback"})
"""Commit causes that count as community activity (people did something).

A message's activity is recorded by `record_interaction`, at the message's time; its
learning commit may land later (the nightly job drains the queue before reflecting),
and counting that would make the community look active after its reflection. Seeds,
reflections and decay are the bot's own doing and never count.
"""


def _load_state(state_json: str) -> SpongeState:
    # from_json (not model_validate_json): it migrates fields older releases stored, so
    # versions written years ago still load.
    return SpongeState.from_json(state_json)


def _latest_version(conn: Conn, community_id: str) -> int | None:
    row = fetchone(
        conn,
        "SELECT MAX(version) FROM personality_versions WHERE community_id = ?",
        (community_id,),
    )
    return None if row is None or row[0] is None else int(row[0])


class EpisodeGuard:
    """Lets a process write a community's episodes to Chroma only while they are still
    to be written, with several processes sharing the store.

    Why: a process writes its committed episodes to Chroma some seconds later, in
    batches (`chroma_memory.write_behind`). A forget-me handled by another process
    deletes the member's episodes from Chroma, but cannot reach the batches other
    processes hold in memory: one written after the delete would bring the member's
    words back. So a batch is written only under the community's episode lock, after
    one query keeps the episodes still in the outbox whose member has no forget-me
    under way (`still_to_write`); and the forget-me, under the same lock, removes the
    episodes' outbox rows (`discard`) and deletes them from Chroma. So a batch checked
    after that never holds them, and one checked before it was written before it, and
    is deleted by it. The member's episodes committed later, by a process that does not
    know of the forget-me yet, are left out as the journal of the forget-me names them.
    """

    def __init__(self, db: SqlBase, coordinator: Coordinator, community_id: str) -> None:
        self._db = db
        self._coordinator = coordinator
        self.community_id = community_id
        self._name = EPISODES + community_id

    async def acquire(self) -> bool:
        """Take the community's episode lock if no other process holds it; never waits."""
        return await self._coordinator.try_lock(self._name)

    async def release(self) -> None:
        await self._coordinator.unlock(self._name)

    async def still_to_write(self, episode_ids: Sequence[str]) -> set[str]:
        """Those of `episode_ids` still waiting in the outbox (not written by another
        process, not erased), not the episodes of a member being forgotten, nor of a
        message being deleted."""
        ids = list(dict.fromkeys(episode_ids))
        if not ids:
            return set()
        marks = ", ".join("?" * len(ids))
        rows = await self._db._fetchall(
            "SELECT o.episode_id FROM episode_outbox o WHERE o.community_id = ? "
            f"AND o.episode_id IN ({marks}) AND NOT EXISTS (SELECT 1 FROM interactions i "
            "JOIN forget_requests f ON f.community_id = i.community_id "
            "AND f.member_id = i.speaker_id "
            "WHERE i.community_id = o.community_id AND i.id = o.episode_id "
            "AND f.finished_at IS NULL) AND NOT EXISTS (SELECT 1 FROM message_deletions d "
            "WHERE d.community_id = o.community_id AND d.interaction_id = o.episode_id "
            "AND d.finished_at IS NULL)",
            (self.community_id, *ids),
        )
        return {str(r[0]) for r in rows}

    async def discard(self, episode_ids: Sequence[str]) -> None:
        """No process is to write these episodes any more (a forget-me deletes them):
        their outbox rows go, so a batch checked from now on leaves them out."""
        ids = list(dict.fromkeys(episode_ids))
        cid = self.community_id
        if ids:
            await self._db._run_write(lambda conn: delete_from_outbox(conn, cid, ids), scope=cid)


def delete_from_outbox(conn: Conn, community_id: str, episode_ids: Sequence[str]) -> int:
    """Delete these episodes' outbox rows; returns how many there were."""
    return sum(
        execute(
            conn,
            f"DELETE FROM episode_outbox WHERE community_id = ? AND episode_id IN ({marks})",
            (community_id, *chunk),
        )
        for chunk, marks in id_chunks(episode_ids)
    )


EVIDENCE_COLUMNS = {"kind", "version", "interaction_id", "member"}
"""An evidence step's fields that are columns of its row: `step_json` leaves them out,
with every field at its default, since the log is kept for good (rows written before
kept them; the columns win)."""

OUTBOX_OMITS = {"agent_response", "topics"}
"""Episode fields the episode outbox leaves out: no memory store keeps them, so the
bot's reply text would only wait there until the memory is written."""

USUAL_ESS: dict[str, Any] = {
    "reasoning_type": "no_argument",
    "source_reliability": "not_applicable",
    "internal_consistency": True,
    "novelty": 0.0,
    "opinion_direction": "neutral",
}
"""What the ESS says of most messages (chat): `step_json` leaves out a field with this
value and reading puts it back. Fixed for good: rows written with it depend on it."""


def step_row(step: EvidenceStep) -> str:
    """`step_json` for `step`: none of its columns, defaults or usual ESS values, and no
    ``interaction`` when it equals the commit's version (the common case)."""
    data = from_json(step.model_dump_json(exclude=EVIDENCE_COLUMNS, exclude_defaults=True))
    if data.get("interaction") == step.version:
        del data["interaction"]
    ess = data.get("ess")
    if ess is not None:
        for key, usual in USUAL_ESS.items():
            if key in ess and ess[key] == usual and type(ess[key]) is type(usual):
                del ess[key]
    return to_json(data)


def step_from_row(
    version: int, kind: str, interaction_id: str, member: str, text: str
) -> EvidenceStep:
    """The step `step_row` stored (or a row written whole before it: its values win)."""
    data = from_json(text)
    data.setdefault("interaction", version)
    if isinstance(data.get("ess"), dict):
        data["ess"] = {**USUAL_ESS, **data["ess"]}
    return EvidenceStep.model_validate(
        {
            **data,
            "version": version,
            "kind": kind,
            "interaction_id": interaction_id,
            "member": member,
        }
    )


class CommunityStore:
    """Durable state of one community; implements `sonality.store.StateStore`."""

    def __init__(
        self,
        db: SqlBase,
        community_id: str,
        coordinator: Coordinator | None = None,
        local_leases: dict[str, LocalLease] | None = None,
    ) -> None:
        """`coordinator`: PostgreSQL's, when processes share the database. Without it the
        learning lease is local; stores given one `local_leases` share each community's."""
        if not community_id:
            raise ValueError("community_id must not be empty")
        self._db = db
        self.community_id = community_id
        self._lease: LearningLease | LocalLease = (
            LocalLease(local_leases, community_id)
            if coordinator is None
            else LearningLease(coordinator, community_id)
        )
        self._episode_guard = (
            None if coordinator is None else EpisodeGuard(db, coordinator, community_id)
        )
        # The newest version this store committed or read, so the next commit can store
        # a patch against it without reading its chain again. Versions never change
        # once written, so it can be stale (another writer went on) but never wrong:
        # it is only used for the version right after it.
        self._tip: ChainTip | None = None

    def __repr__(self) -> str:
        return f"CommunityStore({self.community_id!r})"

    # --- versions ------------------------------------------------------------------------

    async def latest_state(self) -> SpongeState | None:
        tip = await self._read_tip(None)
        if tip is not None:
            self._tip = tip
        return None if tip is None else _load_state(tip.state_json)

    async def state_at(self, version: int) -> SpongeState | None:
        tip = await self._read_tip(version)
        return None if tip is None else _load_state(tip.state_json)

    async def states_at(self, versions: Iterable[int]) -> dict[int, SpongeState]:
        """The states at several versions (those that exist), read in one go.

        For history views that want many versions: the rows from the keyframe of the
        lowest to the highest are read once and replayed in order, instead of each
        version being rebuilt from its keyframe on its own.
        """
        wanted = {v for v in versions if v >= 0}
        if not wanted:
            return {}
        span = await self.version_span(min(wanted), max(wanted))

        def replayed() -> dict[int, SpongeState]:
            return {
                version: _load_state(to_json(state))
                for version, state in span.replay()
                if version in wanted
            }

        # In a worker thread: fifty versions of a community with hundreds of beliefs
        # took 40-300 ms of CPU, which on the event loop held up every community.
        return await asyncio.to_thread(replayed)

    async def version_range(self, since: datetime | None, at_most: int) -> VersionRange | None:
        """The newest `at_most` versions (created at or after `since`), as a range."""
        cid = self.community_id
        return await self._db._run_read(lambda conn: version_range(conn, cid, since, at_most))

    async def erasures_finished(self) -> tuple[Any, ...]:
        """A marker that changes whenever a forget-me or a message deletion of this
        community finishes: per journal, how many finished rows and the newest finish.

        Their erase adds no version, so a view kept by version range (the timeline)
        reads this before its data and keeps it in its key: a view read mid-erase is
        never found again once the erase finished, in any process on this database.
        The count alone could come back after pruning; the newest finish time does not.
        """
        finished = "WHERE community_id = ? AND finished_at IS NOT NULL"
        row = await self._db._fetchone(
            f"SELECT (SELECT COUNT(*) FROM forget_requests {finished}), "
            f"(SELECT MAX(finished_at) FROM forget_requests {finished}), "
            f"(SELECT COUNT(*) FROM message_deletions {finished}), "
            f"(SELECT MAX(finished_at) FROM message_deletions {finished})",
            (self.community_id,) * 4,
        )
        return () if row is None else tuple(row)

    async def version_span(self, low: int, high: int) -> VersionSpan:
        """The rows to rebuild every version from `low` to `high`, read in one go; the
        caller replays them where it likes (`VersionSpan.replay`)."""
        cid = self.community_id
        rows = await self._db._run_read(lambda conn: read_span(conn, cid, low, high))
        return VersionSpan.of(cid, low, high, rows)

    async def _read_tip(self, version: int | None) -> ChainTip | None:
        """Version `version` (None: the latest) rebuilt from its keyframe. The rows are
        read in one snapshot; the JSON work runs here, not in the SQLite thread."""
        cid = self.community_id
        rows = await self._db._run_read(lambda conn: read_chain(conn, cid, version))
        return rebuild(cid, rows)

    def learning_lease(self) -> LearningLease | LocalLease:
        """The lease several processes take turns on to learn this community; on
        SQLite, where this process is the file's only user, one held in memory."""
        return self._lease

    def episode_guard(self) -> EpisodeGuard | None:
        """What keeps a forgotten member's episodes out of Chroma when several processes
        write it (see `EpisodeGuard`); None on SQLite, where one process does."""
        return self._episode_guard

    async def latest_version(self) -> int | None:
        cid = self.community_id
        return await self._db._run_read(lambda conn: _latest_version(conn, cid))

    async def versions(self, limit: int = 20, before: int | None = None) -> list[VersionInfo]:
        """Newest first; `before` pages back (versions strictly below it)."""
        sql = f"SELECT {VERSION_COLUMNS} FROM personality_versions WHERE community_id = ?"
        params: list[object] = [self.community_id]
        if before is not None:
            sql += " AND version < ?"
            params.append(before)
        rows = await self._db._fetchall(
            sql + " ORDER BY version DESC LIMIT ?", [*params, max(0, limit)]
        )
        return [version_info(r) for r in rows]

    async def commit(self, commit: StateCommit) -> None:
        """Append version + audit events + usage, ack the outbox row: all or nothing.

        Raises (writing nothing) `VersionConflictError` unless state.version is exactly
        latest+1 (0 for the first), `UnknownInteractionError` if `interaction_id` isn't in
        this community's outbox, `InteractionAlreadyDoneError` if it was already acked.

        Moderator actions are NOT recorded here: the command layer records every attempt
        (also refused ones) with `Database.record_moderator_action`; the version row keeps
        `commit.actor`.
        """
        state = commit.state
        cid = self.community_id
        tz = self._db.tz
        now = utcnow()
        stamp = to_db_time(now)
        # Serialised here, in the caller's thread, so the SQLite thread only runs SQL. A
        # patch needs the previous version's state: the one this store last committed
        # or loaded (an agent loads its state, then commits every version after it).
        # Without it the row is a keyframe: always valid, and no extra round trip.
        planned = plan_row(self._tip, state, commit.cause)
        events = [
            (
                cid,
                state.version,
                event.interaction,
                event.kind,
                to_json(event.payload),
                to_db_time(event.created_at),
            )
            for event in commit.events
        ]
        episodes = [
            (cid, e.id, cid, e.model_dump_json(exclude=OUTBOX_OMITS), stamp)
            for e in commit.episodes
        ]
        evidence = [
            (
                cid,
                state.version,
                step.kind,
                step.interaction_id,
                step.member,
                step_row(step.model_copy(update={"version": state.version})),
            )
            for step in commit.evidence
        ]

        def work(conn: Conn) -> None:
            latest = _latest_version(conn, cid)
            expected = 0 if latest is None else latest + 1
            if state.version != expected:
                raise VersionConflictError(
                    f"{cid}: cannot commit version {state.version}; the latest is "
                    f"{'none' if latest is None else latest}, so the next must be {expected}"
                )
            if commit.interaction_id is not None:
                found = fetchone(
                    conn,
                    "SELECT status FROM interactions WHERE community_id = ? AND id = ?",
                    (cid, commit.interaction_id),
                )
                if found is None:
                    raise UnknownInteractionError(
                        f"{cid}: no recorded interaction {commit.interaction_id!r} to acknowledge"
                    )
                if found[0] == "done":
                    raise InteractionAlreadyDoneError(
                        f"{cid}: interaction {commit.interaction_id!r} was already committed"
                    )

            ensure_community(conn, cid, now)
            execute(
                conn,
                "INSERT INTO personality_versions (community_id, version, cause, change, "
                "actor, interaction_count, state_json, keyframe, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    cid,
                    state.version,
                    commit.cause,
                    commit.change,
                    commit.actor,
                    state.interaction_count,
                    planned.state_json,
                    planned.keyframe,
                    stamp,
                ),
            )
            for event_row in events:
                execute(
                    conn,
                    "INSERT INTO audit_events (community_id, version, interaction, kind, "
                    "payload_json, created_at) VALUES (?, ?, ?, ?, ?, ?)",
                    event_row,
                )
            for usage in commit.usage:
                insert_usage(
                    conn, cid, usage.purpose, usage.model, usage.usage, usage.created_at, tz
                )
            for evidence_row in evidence:
                execute(
                    conn,
                    "INSERT INTO evidence_log (community_id, seq, version, kind, "
                    "interaction_id, member, step_json) VALUES (?, "
                    "(SELECT COALESCE(MAX(seq), 0) + 1 FROM evidence_log WHERE community_id = ?),"
                    " ?, ?, ?, ?, ?)",
                    (cid, *evidence_row),
                )
            for episode_row in episodes:
                execute(
                    conn,
                    "INSERT INTO episode_outbox (community_id, episode_id, seq, "
                    "episode_json, created_at) VALUES (?, ?, "
                    "(SELECT COALESCE(MAX(seq), 0) + 1 FROM episode_outbox WHERE community_id = ?),"
                    " ?, ?) ON CONFLICT (community_id, episode_id) DO UPDATE SET "
                    "seq = excluded.seq, episode_json = excluded.episode_json, "
                    "created_at = excluded.created_at",
                    episode_row,
                )
            if commit.interaction_id is not None:
                execute(
                    conn,
                    "UPDATE interactions SET status = 'done', updated_at = ? "
                    "WHERE community_id = ? AND id = ?",
                    (stamp, cid, commit.interaction_id),
                )
            if commit.cause in ACTIVITY_CAUSES:
                advance_time(conn, cid, "last_activity_at", now)

        await self._db._run_write(work, scope=cid)
        self._tip = planned.tip

    # --- episode write-behind ---------------------------------------------------------

    async def pending_episodes(self) -> list[Episode]:
        rows = await self._db._fetchall(
            "SELECT episode_json FROM episode_outbox WHERE community_id = ? ORDER BY seq",
            (self.community_id,),
        )
        return [Episode.model_validate_json(r[0]) for r in rows]

    async def mark_episodes_written(self, episode_ids: list[str]) -> None:
        if not episode_ids:
            return
        cid = self.community_id
        params = [(cid, episode_id) for episode_id in episode_ids]

        def work(conn: Conn) -> None:
            conn.executemany(
                "DELETE FROM episode_outbox WHERE community_id = ? AND episode_id = ?", params
            )

        await self._db._run_write(work, scope=cid)

    async def evidence(self, since_version: int = 0) -> list[EvidenceStep]:
        """The evidence log in commit order (what `sonality.replay` replays), from
        `since_version` on. Parsed in the database's thread, not on the event loop: a
        long log takes seconds, and every community's replies would wait for them."""
        cid = self.community_id

        def work(conn: Conn) -> list[EvidenceStep]:
            rows = fetchall(
                conn,
                "SELECT version, kind, interaction_id, member, step_json FROM evidence_log "
                "WHERE community_id = ? AND version >= ? ORDER BY seq",
                (cid, since_version),
            )
            steps = [
                step_from_row(int(version), str(kind), str(interaction_id), str(member), str(t))
                for version, kind, interaction_id, member, t in rows
            ]
            release_in_slices(rows)
            return steps

        return await self._db._run_read(work)

    async def learned_at(self, interaction_id: str) -> int | None:
        row = await self._db._fetchone(
            "SELECT MIN(version) FROM evidence_log WHERE community_id = ? AND interaction_id = ?",
            (self.community_id, interaction_id),
        )
        return None if row is None or row[0] is None else int(row[0])

    async def last_version_of(self, causes: Collection[str]) -> int:
        if not causes:
            return 0
        marks = ", ".join("?" for _ in causes)
        row = await self._db._fetchone(
            "SELECT MAX(version) FROM personality_versions WHERE community_id = ? "
            f"AND cause IN ({marks})",
            (self.community_id, *sorted(causes)),
        )
        return 0 if row is None or row[0] is None else int(row[0])

    async def being_erased(self) -> BeingErased:
        deleted = await self._db._fetchall(BEING_DELETED, (self.community_id,))
        # One open request per member (`begin_forget` resumes an open one).
        forgets = await self._db._fetchall(
            "SELECT member_id, version FROM forget_requests WHERE community_id = ? "
            "AND finished_at IS NULL AND member_id IS NOT NULL ORDER BY id",
            (self.community_id,),
        )
        return BeingErased(
            interactions=frozenset(str(i) for (i,) in deleted),
            members={str(m): None if v is None else int(v) for m, v in forgets},
        )

    # --- outbox --------------------------------------------------------------------------

    async def record_interaction(self, record: InteractionRecord) -> bool:
        """Durably store an answered message (committed on return) plus the reply's usage.

        Idempotent per id: recording the same interaction again changes nothing, so a
        retried handler can't double-count usage or queue the message twice. Refused
        (False) when the speaker ran forget-me after the message was asked
        (`record.created_at`) or is being forgotten now (`forgotten_since`), or when the
        message was deleted since (`deleted_since`): a reply in flight during a
        forget-me or a deletion leaves nothing of the member behind. Its usage is
        written all the same, with no word or id of theirs: the reply was paid for, and
        a day's spend read back after a restart, or by another process, must count it
        (else deleting each message while it is answered would lift the daily limit).
        """
        cid = self.community_id
        tz = self._db.tz
        params = (
            record.id,
            cid,
            record.speaker.id,
            record.speaker.name,
            record.message,
            record.reply,
            record.model,
            record.reply_usage.model_dump_json(),
            to_db_time(record.created_at),
            to_db_time(utcnow()),
            record.message_ref or None,
        )

        insert = (
            "INSERT INTO interactions (id, community_id, speaker_id, speaker_name, "
            "message, reply, model, usage_json, created_at, status, attempts, updated_at, "
            "message_ref) SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, 'pending', 0, ?, ? WHERE {guard} "
            "ON CONFLICT DO NOTHING"
        )
        # The common case costs no statement more: the insert itself is skipped while
        # any forget-me or message deletion of the community could concern this message;
        # only then are the member's and the message's keys checked, and the row
        # inserted if they are someone else's.
        anyone = (
            "NOT EXISTS (SELECT 1 FROM forget_requests WHERE community_id = ? "
            "AND (finished_at IS NULL OR started_at >= ?)) AND NOT EXISTS (SELECT 1 "
            "FROM message_deletions WHERE community_id = ? AND started_at >= ?)"
        )
        asked = to_db_time(record.created_at)

        def work(conn: Conn) -> bool:
            advance_time(conn, cid, "last_activity_at", record.created_at)
            inserted = execute(conn, insert.format(guard=anyone), (*params, cid, asked, cid, asked))
            refused = False
            if not inserted:
                refused = forgotten_since(
                    conn, cid, record.speaker.id, record.created_at
                ) or deleted_since(conn, cid, record.message_ref, record.created_at)
                if not refused:
                    inserted = execute(conn, insert.format(guard="1 = 1"), params)
            if inserted or refused:
                insert_usage(
                    conn, cid, "reply", record.model, record.reply_usage, record.created_at, tz
                )
            return not refused

        return await self._db._run_write(work, scope=cid)

    async def pending_interactions(self) -> list[InteractionRecord]:
        """Recorded, not yet committed and not given up on; oldest (first recorded) first.
        A member's rows are left out while a forget-me of theirs is under way, and a
        message while its deletion is: it is about to delete them, and nothing is to
        learn from them meanwhile."""
        rows = await self._db._fetchall(
            "SELECT id, speaker_id, speaker_name, message, reply, model, usage_json, created_at "
            "FROM interactions i WHERE community_id = ? AND status = 'pending' "
            "AND NOT EXISTS (SELECT 1 FROM forget_requests f WHERE f.community_id = "
            "i.community_id AND f.member_id = i.speaker_id AND f.finished_at IS NULL) "
            "AND NOT EXISTS (SELECT 1 FROM message_deletions d WHERE d.community_id = "
            "i.community_id AND d.interaction_id = i.id AND d.finished_at IS NULL) "
            "ORDER BY seq",
            (self.community_id,),
        )
        return [
            InteractionRecord(
                id=r[0],
                speaker=Speaker(id=r[1], name=r[2]),
                message=r[3],
                reply=r[4],
                model=r[5],
                reply_usage=Usage.model_validate(from_json(r[6])),
                created_at=from_db_time(r[7]),
            )
            for r in rows
        ]

    async def pending_count(self) -> int:
        row = await self._db._fetchone(
            "SELECT COUNT(*) FROM interactions WHERE community_id = ? AND status = 'pending'",
            (self.community_id,),
        )
        return int(row[0]) if row else 0

    async def mark_interaction_failed(
        self, interaction_id: str, error: str, usage: Sequence[UsageRecord] = ()
    ) -> int:
        """Count a failed attempt; at `MAX_INTERACTION_ATTEMPTS` the row becomes 'failed'.

        The tokens the attempt spent (`usage`) are recorded in the same transaction: a
        failure must not make its LLM calls vanish from the community's spend.
        Returns the attempts so far. A row that is already done or failed is left alone
        (its attempts are returned); an unknown id raises `UnknownInteractionError`.
        """
        cid = self.community_id
        tz = self._db.tz
        params = (
            error[:MAX_ERROR_CHARS],
            to_db_time(utcnow()),
            MAX_INTERACTION_ATTEMPTS,
            cid,
            interaction_id,
        )

        def work(conn: Conn) -> int:
            row = fetchone(
                conn,
                "UPDATE interactions SET attempts = attempts + 1, last_error = ?, "
                "updated_at = ?, status = CASE WHEN attempts + 1 >= ? THEN 'failed' "
                "ELSE status END "
                "WHERE community_id = ? AND id = ? AND status = 'pending' RETURNING attempts",
                params,
            )
            if row is None:
                row = fetchone(
                    conn,
                    "SELECT attempts FROM interactions WHERE community_id = ? AND id = ?",
                    (cid, interaction_id),
                )
            if row is None:
                # The UPDATE matched nothing, so the rollback this causes undoes nothing.
                raise UnknownInteractionError(f"{cid}: no recorded interaction {interaction_id!r}")
            for record in usage:
                insert_usage(
                    conn, cid, record.purpose, record.model, record.usage, record.created_at, tz
                )
            return int(row[0])

        return await self._db._run_write(work, scope=cid)

    async def record_usage(self, usage: Sequence[UsageRecord]) -> None:
        cid = self.community_id
        tz = self._db.tz
        records = list(usage)
        if not records:
            return

        def work(conn: Conn) -> None:
            ensure_community(conn, cid, records[0].created_at)
            for record in records:
                insert_usage(
                    conn, cid, record.purpose, record.model, record.usage, record.created_at, tz
                )

        await self._db._run_write(work, scope=cid)

    # --- audit ---------------------------------------------------------------------------

    async def audit_events(
        self, kind: str | None = None, limit: int = 50
    ) -> list[StoredAuditEvent]:
        """Newest first, optionally only one kind ("ess", "reflection", "rollback", ...)."""
        sql = f"SELECT {AUDIT_COLUMNS} FROM audit_events WHERE community_id = ?"
        params: list[object] = [self.community_id]
        if kind is not None:
            sql += " AND kind = ?"
            params.append(kind)
        rows = await self._db._fetchall(sql + " ORDER BY id DESC LIMIT ?", [*params, max(0, limit)])
        return [audit_event(r) for r in rows]
