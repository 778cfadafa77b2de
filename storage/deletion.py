"""Deleted (and edited) messages: the journal and the SQLite side of taking one back.

Why a journal, as for forget-me (`storage.forget`): taking a message back touches
several tables, the personality (a version replayed without it) and Chroma. A row in
`message_deletions` is written first, each later step is idempotent, and an unfinished
row is finished on the next start (`bot.deletion.resume_deletions`).

The row is also the tombstone that refuses an answer still being written when the
message was deleted (`storage.forgotten.deleted_since`), so one is written for every
deletion the platform reports in a community, also of a message nothing was kept of
yet. Such a row names no message: it keeps a salted hash of the message's id
(`forget_key`), and it is pruned after a day (`storage.retention`). A row that took
something back keeps its version (a rollback to before it must leave the message out
again: `bot.forget_me.reapply_after_rollback`).

What goes: the interaction row (message and reply), the exchange in the conversation
buffer, the evidence step, the "ess" audit event and the unwritten episode; in the rows
that stay (past versions, the personality's own audit events) the message's summary and
insight are replaced as a forgotten member's are (`Redaction`, with the interaction id
in place of a member id and the row's label in place of a pseudonym), and so are its own
topics (labels no other message produced).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

from storage.base import (
    Conn,
    SqlBase,
    execute,
    fetchall,
    fetchone,
    from_db_time,
    insert_returning_id,
    to_db_time,
)
from storage.community import delete_from_outbox
from storage.forget import (
    MemberWords,
    Redaction,
    rating_words,
    redact_history,
    step_words,
    used_by_others,
    versions_to_redact,
)
from storage.forgotten import forget_key, key_matches

__all__ = [
    "DELETION_TABLES",
    "DeletionCause",
    "DeletionEntry",
    "DeletionStore",
    "MessageDeletion",
]

DeletionCause = Literal["deleted", "edited"]

#: The tables `erase_message` deletes from or rewrites.
DELETION_TABLES = (
    "episode_outbox",
    "interactions",
    "conversation_turns",
    "evidence_log",
    "audit_events",
    "personality_versions",
)

#: How long a row that took nothing back is kept: it only has to outlive any answer
#: that was being written when the message was deleted.
TOMBSTONE_DAYS = 1


class MessageDeletion(BaseModel):
    """One message (one kept answer to it) being taken back, or taken back."""

    model_config = ConfigDict(frozen=True)

    id: int
    community_id: str
    interaction_id: str | None
    label: str
    cause: DeletionCause
    version: int | None
    started_at: datetime
    #: The salted key of community and message (`forget_key`), never the message's id.
    message_key: str = ""


class DeletionEntry(BaseModel):
    """One taken-back message as the journal file outside the database keeps it
    (`bot.forget_journal`): its row's label and the salted key of community and
    message, so a restored backup from before it can take the message back again."""

    model_config = ConfigDict(frozen=True)

    label: str
    key: str
    cause: DeletionCause
    at: datetime


_COLUMNS = "id, community_id, interaction_id, label, cause, version, started_at, message_key"


def _deletion(row: tuple[object, ...]) -> MessageDeletion:
    return MessageDeletion(
        id=int(str(row[0])),
        community_id=str(row[1]),
        interaction_id=None if row[2] is None else str(row[2]),
        label=str(row[3]),
        cause="edited" if row[4] == "edited" else "deleted",
        version=None if row[5] is None else int(str(row[5])),
        started_at=from_db_time(str(row[6])),
        message_key=str(row[7]),
    )


class DeletionStore(SqlBase):
    async def communities_holding(self, message_ref: str) -> list[str]:
        """The communities that keep an answer to the message `message_ref`."""
        rows = await self._fetchall(
            "SELECT DISTINCT community_id FROM interactions WHERE message_ref = ?",
            (message_ref,),
        )
        return sorted(str(r[0]) for r in rows)

    async def kept_messages(self, message_ref: str) -> list[tuple[str, str]]:
        """(community, the message's text as answered) for each answer kept to it."""
        rows = await self._fetchall(
            "SELECT community_id, message FROM interactions WHERE message_ref = ? ORDER BY seq",
            (message_ref,),
        )
        return [(str(c), str(m)) for c, m in rows]

    async def begin_deletion(
        self, community_id: str, message_ref: str, cause: DeletionCause, at: datetime
    ) -> list[MessageDeletion]:
        """Journal that `message_ref` was deleted (or edited) in `community_id`: from
        now on no answer to it asked before `at` is recorded, and its exchanges leave
        the conversation buffer (also one kept for no learning: another bot's). Returns
        the open deletions, one per answer kept to it (none: the row is finished at
        once)."""
        stamp = to_db_time(at)

        def work(conn: Conn) -> list[MessageDeletion]:
            # The buffer is pruned to its short expiry, so this reads few rows.
            execute(
                conn,
                "DELETE FROM conversation_turns WHERE community_id = ? AND message_ref = ?",
                (community_id, message_ref),
            )
            found: list[str | None] = [
                str(r[0])
                for r in fetchall(
                    conn,
                    "SELECT i.id FROM interactions i WHERE i.community_id = ? "
                    "AND i.message_ref = ? AND NOT EXISTS (SELECT 1 FROM message_deletions d "
                    "WHERE d.community_id = i.community_id AND d.interaction_id = i.id "
                    "AND d.finished_at IS NULL) ORDER BY i.seq",
                    (community_id, message_ref),
                )
            ]
            rows = []
            for interaction_id in found or [None]:
                rowid = insert_returning_id(
                    conn,
                    "INSERT INTO message_deletions (community_id, message_key, interaction_id, "
                    "label, cause, started_at, finished_at, answered) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        community_id,
                        forget_key(community_id, message_ref),
                        interaction_id,
                        f"message-{secrets.token_hex(3)}",
                        cause,
                        stamp,
                        None if interaction_id is not None else stamp,
                        int(interaction_id is not None),
                    ),
                )
                if interaction_id is not None:
                    row = fetchone(
                        conn, f"SELECT {_COLUMNS} FROM message_deletions WHERE id = ?", (rowid,)
                    )
                    assert row is not None
                    rows.append(_deletion(tuple(row)))
            return rows

        return await self._run_write(work, scope=community_id)

    async def rejournal_deletions(self, entries: Sequence[DeletionEntry]) -> list[str]:
        """Journal again the deletions of `entries` this database lacks (it was restored
        from before them): each is matched by its key against the messages the kept
        answers name, and journaled unfinished for each answer it matches, to be
        finished on start (`bot.deletion.resume_deletions`). Returns the labels of
        those that matched. One that matches nothing (its message is not here) gets a
        finished row of its own, with no community, so that it is not matched again at
        every start; rows of deletions that took an answer back are never pruned. An
        entry is matched again only after another restore."""

        def work(conn: Conn) -> list[str]:
            known = {str(r[0]) for r in fetchall(conn, "SELECT label FROM message_deletions")}
            missing = [e for e in entries if e.label not in known]
            if not missing:
                return []
            kept = fetchall(
                conn,
                "SELECT id, community_id, message_ref FROM interactions "
                "WHERE message_ref != '' ORDER BY seq",
            )
            buffered = fetchall(
                conn,
                "SELECT DISTINCT community_id, message_ref FROM conversation_turns "
                "WHERE message_ref IS NOT NULL AND message_ref != ''",
            )
            matched: list[str] = []
            now = to_db_time(datetime.now(UTC))
            for entry in missing:
                for community_id, ref in buffered:  # as `begin_deletion` empties the buffer
                    if key_matches(entry.key, str(community_id), str(ref)):
                        execute(
                            conn,
                            "DELETE FROM conversation_turns WHERE community_id = ? "
                            "AND message_ref = ?",
                            (str(community_id), str(ref)),
                        )
                for interaction_id, community_id, ref in kept:
                    if not key_matches(entry.key, str(community_id), str(ref)):
                        continue
                    execute(
                        conn,
                        "INSERT INTO message_deletions (community_id, message_key, "
                        "interaction_id, label, cause, started_at, answered) "
                        "VALUES (?, ?, ?, ?, ?, ?, 1)",
                        (
                            str(community_id),
                            entry.key,
                            str(interaction_id),
                            entry.label,
                            entry.cause,
                            to_db_time(entry.at),
                        ),
                    )
                    if entry.label not in matched:
                        matched.append(entry.label)
                if entry.label not in matched:
                    # Its message is not here (it came after the backup): noted as
                    # finished, so the next start does not match it all over again.
                    execute(
                        conn,
                        "INSERT INTO message_deletions (community_id, message_key, label, "
                        "cause, started_at, finished_at, answered) VALUES ('', ?, ?, ?, ?, ?, 1)",
                        (entry.key, entry.label, entry.cause, to_db_time(entry.at), now),
                    )
            return matched

        return await self._run_write(work)

    async def open_deletions(self) -> list[MessageDeletion]:
        """Unfinished deletions, oldest first (finished on start)."""
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM message_deletions WHERE finished_at IS NULL ORDER BY id"
        )
        return [_deletion(tuple(r)) for r in rows]

    async def set_deletion_version(self, deletion_id: int, version: int) -> None:
        await self._run_write(
            lambda conn: execute(
                conn,
                "UPDATE message_deletions SET version = ? WHERE id = ?",
                (version, deletion_id),
            )
        )

    async def deletions_after(self, community_id: str, version: int) -> bool:
        """Whether a message was taken back in a version after `version`."""
        row = await self._fetchone(
            "SELECT 1 FROM message_deletions WHERE community_id = ? AND version > ? LIMIT 1",
            (community_id, version),
        )
        return row is not None

    async def message_words(self, community_id: str, interaction_id: str) -> MemberWords:
        """What of one message other rows may quote (read before `erase_message`): the
        summary and insight of it, and the topics only it (and messages being deleted
        with it) produced."""

        def work(conn: Conn) -> MemberWords:
            words: list[str] = []
            topics: set[str] = set()
            versions: list[int] = []
            for version, step in fetchall(
                conn,
                "SELECT version, step_json FROM evidence_log WHERE community_id = ? "
                "AND interaction_id = ?",
                (community_id, interaction_id),
            ):
                versions.append(int(version))
                step_words(str(step), words, topics)
            for version in versions:
                for (payload,) in fetchall(
                    conn,
                    "SELECT payload_json FROM audit_events WHERE community_id = ? "
                    "AND version = ? AND kind = 'ess' AND "
                    f"{conn.dialect.json_text('payload_json', 'interaction_id')} = ?",
                    (community_id, version, interaction_id),
                ):
                    rating_words(str(payload), words, topics)
            own = topics - used_by_others(
                conn, community_id, "interaction_id", interaction_id, topics, staying_only=True
            )
            return MemberWords(
                texts=tuple(sorted(set(words), key=len, reverse=True)),
                topics=tuple(sorted(own)),
            )

        return await self._run_read(work)

    async def erase_message(
        self,
        deletion: MessageDeletion,
        words: MemberWords,
        at: datetime,
        episode_ids: tuple[str, ...] = (),
    ) -> int:
        """Delete the message's rows (its buffered exchange went with `begin_deletion`)
        and redact its words from the rest, then close the deletion; one transaction.
        `episode_ids` (the insights drawn from it) leave the episode outbox too. Returns
        the rows deleted or rewritten."""
        interaction_id = deletion.interaction_id
        if interaction_id is None:
            return 0
        cid = deletion.community_id
        redact = Redaction(
            interaction_id, deletion.label, frozenset(words.texts), frozenset(words.topics)
        )
        learned = await self._fetchone(
            "SELECT MIN(version) FROM evidence_log WHERE community_id = ? AND interaction_id = ?",
            (cid, interaction_id),
        )
        first = None if learned is None or learned[0] is None else int(learned[0])
        # Only the versions since it was learned can quote it (read outside the
        # transaction, as `erase_member` does).
        versions = [] if first is None else await versions_to_redact(self, cid, redact, first - 1)

        def work(conn: Conn) -> int:
            changed = delete_from_outbox(conn, cid, [interaction_id, *episode_ids])
            changed += execute(
                conn,
                "DELETE FROM interactions WHERE community_id = ? AND id = ?",
                (cid, interaction_id),
            )
            if first is not None:
                changed += execute(
                    conn,
                    "DELETE FROM audit_events WHERE community_id = ? AND version >= ? "
                    "AND kind = 'ess' AND "
                    f"{conn.dialect.json_text('payload_json', 'interaction_id')} = ?",
                    (cid, first, interaction_id),
                )
            changed += execute(
                conn,
                "DELETE FROM evidence_log WHERE community_id = ? AND interaction_id = ?",
                (cid, interaction_id),
            )
            changed += redact_history(
                conn,
                cid,
                redact,
                versions,
                ("message_deletions", deletion.id),
                ratings_since=first,
            )
            execute(
                conn,
                "UPDATE message_deletions SET redacting = 0, interaction_id = NULL, "
                "finished_at = ? WHERE id = ?",
                (to_db_time(at), deletion.id),
            )
            return changed

        changed = await self._run_write(work, scope=cid)
        await self._scrub_deleted(DELETION_TABLES, rebuild=False)
        return changed
