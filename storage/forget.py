"""Forgetting one member of a community: the journal and the SQLite side of forget-me.

Why a journal: forget-me touches several tables, the personality (a new version whose
opinions are replayed without the member) and Chroma. A row in `forget_requests` is
written first, every step is idempotent, and an unfinished row is picked up again on
the next start, so a crash (even kill -9) never leaves a member half-forgotten.

Why past versions may be rewritten here and nowhere else: versions are append-only by
trigger, but a forgotten member's id and words must leave them too. The trigger lets a
version's text columns change only while a forget-me of that community holds the
redaction gate (`redacting = 1`), which `erase_member` opens and closes inside one
transaction; the number, cause, counts, time and chain of every version stay as written.
Past versions keep their opinions; they lose the member's identity (replaced by a
pseudonym, the same one in every table) and the summaries of their messages.

The pseudonym ("member-7f3a9c") is random, drawn once per request and stored in the
journal, so nothing about the member can be recovered from it (a keyed hash of an
enumerable platform id would need a secret the bot does not always have).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Sequence
from datetime import datetime

from pydantic import BaseModel, ConfigDict

from storage.base import (
    Conn,
    SqlBase,
    execute,
    fetchall,
    fetchone,
    from_json,
    insert_returning_id,
    to_db_time,
)
from storage.community import delete_from_outbox
from storage.flood import member_key

#: The tables `erase_member` deletes from or rewrites.
FORGET_TABLES = (
    "episode_outbox",
    "interactions",
    "conversation_turns",
    "evidence_log",
    "audit_events",
    "moderator_actions",
    "personality_versions",
    "flood_windows",
    "member_spend",
)

#: What a forgotten member's words are replaced with in past versions.
FORGOTTEN_TEXT = "(forgotten)"


BLANK_ACTOR = "COALESCE(actor, '')"


class ForgetRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: int
    community_id: str
    member_id: str | None
    pseudonym: str
    requested_by: str
    reason: str
    version: int | None


def _request(row: Sequence[object]) -> ForgetRequest:
    return ForgetRequest(
        id=int(str(row[0])),
        community_id=str(row[1]),
        member_id=None if row[2] is None else str(row[2]),
        pseudonym=str(row[3]),
        requested_by=str(row[4]),
        reason=str(row[5]),
        version=None if row[6] is None else int(str(row[6])),
    )


_COLUMNS = "id, community_id, member_id, pseudonym, requested_by, reason, version"


def _json_forms(text: str) -> set[str]:
    """`text` as it appears inside a JSON string, escaped either way."""
    return {json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]}


def _redact(text: str, member_id: str, pseudonym: str, words: Iterable[str]) -> str:
    for form in _json_forms(member_id):
        text = text.replace(f'"{form}"', f'"{pseudonym}"')
    for word in words:
        for form in _json_forms(word):
            if form:
                text = text.replace(form, FORGOTTEN_TEXT)
    return text


class ForgetStore(SqlBase):
    async def begin_forget(
        self, community_id: str, member_id: str, requested_by: str, reason: str, at: datetime
    ) -> ForgetRequest:
        """Journal a forget-me before anything is deleted; an unfinished request for the
        same member is returned as it is (a repeated request resumes, never restarts)."""

        def work(conn: Conn) -> ForgetRequest:
            row = fetchone(
                conn,
                f"SELECT {_COLUMNS} FROM forget_requests WHERE community_id = ? "
                "AND member_id = ? AND finished_at IS NULL",
                (community_id, member_id),
            )
            if row is not None:
                return _request(row)
            pseudonym = f"member-{secrets.token_hex(3)}"
            rowid = insert_returning_id(
                conn,
                "INSERT INTO forget_requests (community_id, member_id, pseudonym, "
                "requested_by, reason, started_at) VALUES (?, ?, ?, ?, ?, ?)",
                (community_id, member_id, pseudonym, requested_by, reason, to_db_time(at)),
            )
            found = fetchone(conn, f"SELECT {_COLUMNS} FROM forget_requests WHERE id = ?", (rowid,))
            assert found is not None
            return _request(found)

        return await self._run_write(work, scope=community_id)

    async def open_forgets(self) -> list[ForgetRequest]:
        """Unfinished requests, oldest first (finished on start)."""
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM forget_requests WHERE finished_at IS NULL ORDER BY id"
        )
        return [_request(r) for r in rows]

    async def finished_forgets(self, community_id: str) -> list[ForgetRequest]:
        """Finished requests of a community, oldest first (a rollback re-applies them)."""
        rows = await self._fetchall(
            f"SELECT {_COLUMNS} FROM forget_requests WHERE community_id = ? "
            "AND finished_at IS NOT NULL ORDER BY id",
            (community_id,),
        )
        return [_request(r) for r in rows]

    async def set_forget_version(self, request_id: int, version: int) -> None:
        await self._run_write(
            lambda conn: execute(
                conn,
                "UPDATE forget_requests SET version = ? WHERE id = ?",
                (version, request_id),
            )
        )

    async def member_words(self, community_id: str, member_id: str) -> list[str]:
        """What of the member's words other rows may quote: the ESS summaries and the
        insights drawn from their messages (read before `erase_member` deletes them)."""

        def work(conn: Conn) -> list[str]:
            words: list[str] = []
            for (step,) in fetchall(
                conn,
                "SELECT step_json FROM evidence_log WHERE community_id = ? AND member = ?",
                (community_id, member_id),
            ):
                ess = from_json(str(step)).get("ess") or {}
                if ess.get("summary"):
                    words.append(str(ess["summary"])[:160])
            for (payload,) in fetchall(
                conn,
                "SELECT payload_json FROM audit_events WHERE community_id = ? AND kind = 'ess' "
                f"AND {conn.dialect.json_text('payload_json', 'speaker')} = ?",
                (community_id, member_id),
            ):
                event = from_json(str(payload))
                for key in ("summary", "insight"):
                    if event.get(key):
                        words.append(str(event[key]))
                if event.get("summary"):
                    words.append(str(event["summary"])[:160])
            return sorted(set(words), key=len, reverse=True)

        return await self._run_read(work)

    async def member_interaction_ids(self, community_id: str, member_id: str) -> list[str]:
        rows = await self._fetchall(
            "SELECT id FROM interactions WHERE community_id = ? AND speaker_id = ? ORDER BY seq",
            (community_id, member_id),
        )
        return [str(r[0]) for r in rows]

    async def erase_member(self, request: ForgetRequest, words: Sequence[str], at: datetime) -> int:
        """Delete the member's rows and redact their id and words from the rest, then
        close the request; one transaction, so it happens entirely or not at all.
        Returns the rows deleted or rewritten."""
        member = request.member_id
        if member is None:
            return 0
        cid, pseudonym = request.community_id, request.pseudonym

        def work(conn: Conn) -> int:
            ids = [
                str(r[0])
                for r in fetchall(
                    conn,
                    "SELECT id FROM interactions WHERE community_id = ? AND speaker_id = ?",
                    (cid, member),
                )
            ]
            changed = delete_from_outbox(conn, cid, ids)
            changed += execute(
                conn,
                "DELETE FROM interactions WHERE community_id = ? AND speaker_id = ?",
                (cid, member),
            )
            changed += execute(
                conn,
                "DELETE FROM conversation_turns WHERE community_id = ? AND user_id = ?",
                (cid, member),
            )
            changed += execute(
                conn,
                "DELETE FROM evidence_log WHERE community_id = ? AND member = ?",
                (cid, member),
            )
            changed += execute(
                conn,
                "DELETE FROM flood_windows WHERE community_id = ? AND member_key = ?",
                (cid, member_key(cid, member)),
            )
            changed += execute(
                conn,
                "DELETE FROM member_spend WHERE community_id = ? AND member_id = ?",
                (cid, member),
            )
            changed += execute(
                conn,
                "DELETE FROM audit_events WHERE community_id = ? AND kind = 'ess' "
                f"AND {conn.dialect.json_text('payload_json', 'speaker')} = ?",
                (cid, member),
            )
            changed += execute(
                conn,
                "UPDATE moderator_actions SET actor_id = ?, actor_name = ? "
                "WHERE community_id = ? AND actor_id = ?",
                (pseudonym, pseudonym, cid, member),
            )
            # Rows that quote the member's words also name them (a summary travels with
            # its update's `member`, an ESS event with its speaker), so SQLite's own
            # instr() (strpos() on PostgreSQL) picks the rows to rewrite without Python
            # reading every version.
            has = conn.dialect.contains
            for row_id, payload in fetchall(
                conn,
                "SELECT id, payload_json FROM audit_events WHERE community_id = ? "
                f"AND {has('payload_json')}",
                (cid, member),
            ):
                new = _redact(str(payload), member, pseudonym, words).replace(member, pseudonym)
                changed += execute(
                    conn, "UPDATE audit_events SET payload_json = ? WHERE id = ?", (new, row_id)
                )
            execute(conn, "UPDATE forget_requests SET redacting = 1 WHERE id = ?", (request.id,))
            for version, state_json, change, actor in fetchall(
                conn,
                "SELECT version, state_json, change, actor FROM personality_versions "
                f"WHERE community_id = ? AND ({has('state_json')} OR {has('change')} "
                f"OR {has(BLANK_ACTOR)})",
                (cid, member, member, member),
            ):
                texts = [str(state_json), str(change), str(actor or "")]
                new_state = _redact(texts[0], member, pseudonym, words)
                new_change = _redact(texts[1], member, pseudonym, words).replace(member, pseudonym)
                new_actor = None if actor is None else texts[2].replace(member, pseudonym)
                changed += execute(
                    conn,
                    "UPDATE personality_versions SET state_json = ?, change = ?, actor = ? "
                    "WHERE community_id = ? AND version = ?",
                    (new_state, new_change, new_actor, cid, version),
                )
            execute(
                conn,
                "UPDATE forget_requests SET redacting = 0, member_id = NULL, finished_at = ? "
                "WHERE id = ?",
                (to_db_time(at), request.id),
            )
            return changed

        changed = await self._run_write(work, scope=cid)
        await self._scrub_deleted(FORGET_TABLES, rebuild=True)
        return changed
