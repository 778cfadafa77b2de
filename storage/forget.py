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
pseudonym, the same one in every table), the summaries and insights of their messages,
and their own topics (labels no other member's message produced).

Why by exact keys and never by substring: ids are prefixes of one another
("terminal-bob", "terminal-bobby") and short ones occur inside any text. Rows are
selected by the columns and JSON fields that hold a member id; JSON is parsed and a
value is replaced only if it IS the member (their id, or "Name (id)" as history names
an actor), and an id inside free text only where it stands alone. Their words are
replaced where a row quotes them whole (a summary, an insight, a provenance line
"ESS 0.80: <summary>"), and their topics as whole labels (`without_labels`) in the
personality's own texts: past versions, change lines and non-message audit events,
never in another member's words.

The pseudonym ("member-7f3a9c") is random, drawn once per request and stored in the
journal, so nothing about the member can be recovered from it (a keyed hash of an
enumerable platform id would need a secret the bot does not always have).
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict

from sonality.ess import made_summary
from sonality.replay import FORGOTTEN_TEXT, without_labels
from storage.base import (
    Conn,
    SqlBase,
    execute,
    fetchall,
    fetchone,
    from_db_time,
    from_json,
    id_chunks,
    insert_returning_id,
    to_db_time,
    to_json,
)
from storage.community import delete_from_outbox
from storage.flood import member_key
from storage.forgotten import BEING_DELETED, forget_key, key_matches

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
    "reply_feedback",
    "channel_modes",
)

__all__ = ["FORGOTTEN_TEXT", "ForgetRequest", "ForgetStore", "JournalEntry", "MemberWords"]

#: Who asked for a forget-me that a restore (or a start) re-applied from the journal file.
REAPPLIED_BY = "forget journal"

#: Versions read per query while looking for the ones that name a forgotten member.
VERSIONS_PER_READ = 2_000

#: Needles per query while looking for another member's use of a topic.
TOPICS_PER_QUERY = 100


class ForgetRequest(BaseModel):
    model_config = ConfigDict(frozen=True)

    id: int
    community_id: str
    member_id: str | None
    pseudonym: str
    requested_by: str
    reason: str
    version: int | None
    member_key: str | None = None
    started_at: datetime | None = None


class MemberWords(BaseModel):
    """What of a member's words other rows may quote: the ESS summaries and insights of
    their messages (`texts`), and their own topics (`topics`: labels only their
    messages produced; a topic another member argued too stays)."""

    model_config = ConfigDict(frozen=True)

    texts: tuple[str, ...] = ()
    topics: tuple[str, ...] = ()
    #: The names they spoke or ran commands under: a moderator's free text (a rollback's
    #: reason, a forget-user reason) may name them so ("undo Tom's trolling").
    names: tuple[str, ...] = ()


class KnownMember(BaseModel):
    """A member the community has seen (spoke, or ran a command), under their latest name."""

    model_config = ConfigDict(frozen=True)

    id: str
    name: str = ""


class JournalEntry(BaseModel):
    """One forget-me as the journal file outside the database keeps it (`bot.forget_journal`):
    the pseudonym, and the salted key of community and member (`storage.forgotten`)."""

    model_config = ConfigDict(frozen=True)

    pseudonym: str
    key: str
    at: datetime


def _request(row: Sequence[object]) -> ForgetRequest:
    return ForgetRequest(
        id=int(str(row[0])),
        community_id=str(row[1]),
        member_id=None if row[2] is None else str(row[2]),
        pseudonym=str(row[3]),
        requested_by=str(row[4]),
        reason=str(row[5]),
        version=None if row[6] is None else int(str(row[6])),
        member_key=None if row[7] is None else str(row[7]),
        started_at=from_db_time(str(row[8])),
    )


_COLUMNS = (
    "id, community_id, member_id, pseudonym, requested_by, reason, version, member_key, started_at"
)


def _json_forms(text: str) -> set[str]:
    """`text` as it appears inside a JSON string, escaped either way."""
    return {json.dumps(text)[1:-1], json.dumps(text, ensure_ascii=False)[1:-1]}


#: A JSON string literal's contents, escapes kept.
_STRING = r'"((?:[^"\\]|\\.)*)"'
_JSON_STRING = re.compile(_STRING)

#: Where a state quotes a message's words: a provenance line ("ESS 0.80: <summary>") and
#: the insights waiting for a reflection (compact JSON, as the store writes it).
_PROVENANCE = re.compile(r'"provenance":' + _STRING)
_INSIGHTS = re.compile(r'"pending_insights":\[((?:"(?:[^"\\]|\\.)*",?)*)\]')

#: Fields of the state whose keys are topics (a forgotten member's own topics leave them).
_TOPIC_MAPS = frozenset({"opinion_vectors", "belief_meta", "topic_engagement"})

_DROP = object()


#: The shortest name a forget-me replaces in free text: a shorter one ("Bo", "Al") is
#: too often part of other words' spelling or an abbreviation.
MIN_REDACTED_NAME = 3


@dataclass(frozen=True)
class Redaction:
    """How one forgotten member's id and words are replaced in the rows that stay."""

    member: str
    pseudonym: str
    texts: frozenset[str]
    topics: frozenset[str]
    #: Names of theirs (`MemberWords.names`), replaced as whole words, case aside, in
    #: free text only; a name under `MIN_REDACTED_NAME` characters is left (it would
    #: take too many other words with it).
    names: frozenset[str] = frozenset()
    _id: re.Pattern[str] = field(init=False, repr=False)
    _names: re.Pattern[str] | None = field(init=False, repr=False)
    _quoted: frozenset[str] = field(init=False, repr=False)
    _text_forms: frozenset[str] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # An id stands alone when no id character ([\w-]) touches it, nor a dot that
        # joins it to more of a word ("e.g.", "bob.example").
        alone = rf"(?<![\w-])(?<!\w\.){re.escape(self.member)}(?![\w-]|\.\w)"
        object.__setattr__(self, "_id", re.compile(alone))
        forms = _json_forms(self.member)
        object.__setattr__(
            self, "_quoted", frozenset({f'"{f}"' for f in forms} | {f' ({f})"' for f in forms})
        )
        object.__setattr__(
            self, "_text_forms", frozenset(f for t in self.texts for f in _json_forms(t))
        )
        names = sorted(
            {n.strip() for n in self.names if len(n.strip()) >= MIN_REDACTED_NAME},
            key=len,
            reverse=True,
        )
        pattern = "|".join(re.escape(n) for n in names)
        object.__setattr__(
            self,
            "_names",
            re.compile(rf"(?<!\w)(?:{pattern})(?!\w)", re.IGNORECASE) if names else None,
        )

    # ------------------------------------------------------------------ finding rows

    def in_json(self, raw: str) -> bool:
        """Whether a stored state may name the member or quote their words (a cheap
        look at the text, where a state quotes words; `value` decides exactly)."""
        if any(q in raw for q in self._quoted) or any(t in raw for t in self.topics):
            return True
        forms = self._text_forms
        if not forms:
            return False
        if any(m.group(1).partition(": ")[2] in forms for m in _PROVENANCE.finditer(raw)):
            return True
        insights = _INSIGHTS.search(raw)
        return insights is not None and any(
            literal in forms for literal in _JSON_STRING.findall(insights.group(1))
        )

    def in_text(self, text: str) -> bool:
        return (
            self.member in text
            or any(t in text for t in self.topics)
            or (self._names is not None and self._names.search(text) is not None)
        )

    def versions_in(self, rows: Iterable[Sequence[Any]]) -> list[int]:
        """Of (version, state_json, change, actor) rows, the versions to look at."""
        return [
            int(version)
            for version, state_json, change, actor in rows
            if self.in_json(str(state_json))
            or self.in_text(str(change))
            or (actor is not None and self.member in str(actor))
        ]

    # ------------------------------------------------------------------ replacing

    def text(self, value: str, labels: bool = True, free: bool = False) -> str:
        """A string that stays: the member becomes the pseudonym, a quoted summary or
        insight "(forgotten)", and (with `labels`) their own topics too. A `free` text
        (a change line) is never taken for an actor's name as a whole."""
        if value == self.member or (not free and value.endswith(f" ({self.member})")):
            return self.pseudonym  # an id, or an actor as history names one
        if value in self.texts:
            return FORGOTTEN_TEXT
        head, sep, tail = value.partition(": ")
        if sep and tail in self.texts:
            value = head + sep + FORGOTTEN_TEXT  # a provenance line
        if self.member in value:
            value = self._id.sub(self.pseudonym, value)
        if free and self._names is not None:
            value = self._names.sub(self.pseudonym, value)
        return without_labels(value, self.topics) if labels else value

    def value(self, data: Any, labels: bool = True, topic_keys: bool = False) -> Any:
        """Parsed JSON with the member and their words replaced; their topics leave
        topic-keyed maps and lists of topics."""
        if isinstance(data, str):
            return self.text(data, labels)
        if isinstance(data, list):
            kept = (self._item(x, labels) for x in data)
            return [x for x in kept if x is not _DROP]
        if isinstance(data, dict):
            return {
                self.pseudonym if key == self.member else key: self.value(
                    item, labels, key in _TOPIC_MAPS
                )
                for key, item in data.items()
                if not (topic_keys and key in self.topics)
            }
        return data

    def _item(self, item: Any, labels: bool) -> Any:
        if isinstance(item, str) and item in self.topics:
            return _DROP  # a list of topics (dropped beliefs, moved topics)
        if isinstance(item, dict) and item.get("topic") in self.topics:
            return _DROP  # a staged update of their topic
        return self.value(item, labels)

    def json(self, raw: str, labels: bool = True) -> str:
        """Stored JSON redacted; the same text when nothing in it concerned the member."""
        data = from_json(raw)
        new = self.value(data, labels)
        return raw if new == data else to_json(new)


class ForgetStore(SqlBase):
    async def begin_forget(
        self,
        community_id: str,
        member_id: str,
        requested_by: str,
        reason: str,
        at: datetime,
        *,
        pseudonym: str | None = None,
        key: str | None = None,
    ) -> ForgetRequest:
        """Journal a forget-me before anything is deleted; an unfinished request for the
        same member is returned as it is (a repeated request resumes, never restarts).
        From this moment no message of the member is recorded (`forgotten_since`)."""

        def work(conn: Conn) -> ForgetRequest:
            row = fetchone(
                conn,
                f"SELECT {_COLUMNS} FROM forget_requests WHERE community_id = ? "
                "AND member_id = ? AND finished_at IS NULL",
                (community_id, member_id),
            )
            if row is not None:
                return _request(row)
            rowid = insert_returning_id(
                conn,
                "INSERT INTO forget_requests (community_id, member_id, pseudonym, "
                "requested_by, reason, started_at, member_key) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    community_id,
                    member_id,
                    pseudonym or f"member-{secrets.token_hex(3)}",
                    requested_by,
                    reason,
                    to_db_time(at),
                    key or forget_key(community_id, member_id),
                ),
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

    async def forget_request(self, request_id: int) -> ForgetRequest | None:
        """The request as it stands: another process (a double request, or one resuming
        at its start) may have finished it since it was read (`member_id` None then)."""
        row = await self._fetchone(
            f"SELECT {_COLUMNS} FROM forget_requests WHERE id = ?", (request_id,)
        )
        return None if row is None else _request(row)

    async def forgets_after(self, community_id: str, version: int) -> bool:
        """Whether a forget-me of the community is under way, or finished in a version
        after `version`: a rollback to `version` must re-apply it. One under way counts
        whatever its version: it may have committed its replay already, and its erase
        has not yet cleaned the stored states a rollback restores."""
        row = await self._fetchone(
            "SELECT 1 FROM forget_requests WHERE community_id = ? "
            "AND (finished_at IS NULL OR version > ?) LIMIT 1",
            (community_id, version),
        )
        return row is not None

    async def set_forget_version(self, request_id: int, version: int) -> None:
        await self._run_write(
            lambda conn: execute(
                conn,
                "UPDATE forget_requests SET version = ? WHERE id = ?",
                (version, request_id),
            )
        )

    # ------------------------------------------------------------------ who and what

    async def community_members(self, community_id: str) -> list[KnownMember]:
        """Every member the community has seen: who spoke (their messages, their
        evidence, their conversation buffer) or ran a command, with the latest name
        they used; forgotten members (now pseudonyms) are not among them."""

        def work(conn: Conn) -> list[KnownMember]:
            ids: set[str] = set()
            for sql in (
                "SELECT DISTINCT speaker_id FROM interactions WHERE community_id = ?",
                "SELECT DISTINCT member FROM evidence_log WHERE community_id = ? "
                "AND kind = 'message'",
                "SELECT DISTINCT user_id FROM conversation_turns WHERE community_id = ?",
                "SELECT DISTINCT actor_id FROM moderator_actions WHERE community_id = ?",
            ):
                ids.update(str(r[0]) for r in fetchall(conn, sql, (community_id,)) if r[0])
            ids -= {
                str(r[0])
                for r in fetchall(
                    conn,
                    "SELECT pseudonym FROM forget_requests WHERE community_id = ?",
                    (community_id,),
                )
            }
            names: dict[str, str] = {}
            for sql in (
                "SELECT actor_id, actor_name FROM moderator_actions WHERE community_id = ? "
                "ORDER BY id",
                "SELECT speaker_id, speaker_name FROM interactions WHERE community_id = ? "
                "ORDER BY seq",
            ):
                names.update({str(i): str(n) for i, n in fetchall(conn, sql, (community_id,)) if n})
            return [KnownMember(id=i, name=names.get(i, "")) for i in sorted(ids)]

        return await self._run_read(work)

    async def keeps_member(self, community_id: str, member_id: str) -> bool:
        """Whether anything of the member is kept here: a message, a rating, a turn of
        their conversation, a command they ran (what `community_members` lists)."""
        speaker = self.dialect.json_text("payload_json", "speaker")
        wheres = (
            "interactions WHERE community_id = ? AND speaker_id = ?",
            "evidence_log WHERE community_id = ? AND member = ?",
            "conversation_turns WHERE community_id = ? AND user_id = ?",
            "moderator_actions WHERE community_id = ? AND actor_id = ?",
            f"audit_events WHERE community_id = ? AND kind = 'ess' AND {speaker} = ?",
        )

        def work(conn: Conn) -> bool:
            return any(
                fetchone(conn, f"SELECT 1 FROM {where} LIMIT 1", (community_id, member_id))
                for where in wheres
            )

        return await self._run_read(work)

    async def member_words(self, community_id: str, member_id: str) -> MemberWords:
        """What of the member's words other rows may quote (read before `erase_member`
        deletes their rows): the ESS summaries and insights of their messages, and the
        topics only their messages produced."""

        def work(conn: Conn) -> MemberWords:
            words: list[str] = []
            topics: set[str] = set()
            for (step,) in fetchall(
                conn,
                "SELECT step_json FROM evidence_log WHERE community_id = ? AND member = ?",
                (community_id, member_id),
            ):
                step_words(str(step), words, topics)
            for (payload,) in fetchall(
                conn,
                "SELECT payload_json FROM audit_events WHERE community_id = ? AND kind = 'ess' "
                f"AND {conn.dialect.json_text('payload_json', 'speaker')} = ?",
                (community_id, member_id),
            ):
                rating_words(str(payload), words, topics)
            own = topics - used_by_others(conn, community_id, "member", member_id, topics)
            names = {
                str(name)
                for sql in (
                    "SELECT DISTINCT speaker_name FROM interactions "
                    "WHERE community_id = ? AND speaker_id = ?",
                    "SELECT DISTINCT actor_name FROM moderator_actions "
                    "WHERE community_id = ? AND actor_id = ?",
                )
                for (name,) in fetchall(conn, sql, (community_id, member_id))
                if name
            }
            return MemberWords(
                texts=tuple(sorted(set(words), key=len, reverse=True)),
                topics=tuple(sorted(own)),
                names=tuple(sorted(names - {member_id})),
            )

        return await self._run_read(work)

    async def member_interaction_ids(self, community_id: str, member_id: str) -> list[str]:
        rows = await self._fetchall(
            "SELECT id FROM interactions WHERE community_id = ? AND speaker_id = ? ORDER BY seq",
            (community_id, member_id),
        )
        return [str(r[0]) for r in rows]

    async def member_episode_ids(self, community_id: str, member_id: str) -> list[str]:
        """The ids of the memories the member's messages made (an episode's id is its
        message's): of the messages still kept, and of those whose rows retention has
        deleted while the evidence log, and Chroma, keep them."""
        rows = await self._fetchall(
            "SELECT id FROM interactions WHERE community_id = ? AND speaker_id = ? "
            "UNION SELECT interaction_id FROM evidence_log WHERE community_id = ? "
            "AND member = ? AND interaction_id IS NOT NULL AND interaction_id <> ''",
            (community_id, member_id, community_id, member_id),
        )
        return sorted(str(r[0]) for r in rows)

    # ------------------------------------------------------------------ erasing

    async def erase_member(self, request: ForgetRequest, words: MemberWords, at: datetime) -> int:
        """Delete the member's rows and redact their id and words from the rest, then
        close the request; one transaction, so it happens entirely or not at all.
        Returns the rows deleted or rewritten."""
        member = request.member_id
        if member is None:
            return 0
        cid, pseudonym = request.community_id, request.pseudonym
        redact = Redaction(
            member,
            pseudonym,
            frozenset(words.texts),
            frozenset(words.topics),
            frozenset(words.names),
        )
        # Found outside the transaction (versions never change but by a forget-me, which
        # re-reads each one below): reading every version is the slow part.
        versions = await versions_to_redact(self, cid, redact)

        def work(conn: Conn) -> int:
            if not fetchone(
                conn,
                "SELECT 1 FROM forget_requests WHERE id = ? AND finished_at IS NULL",
                (request.id,),
            ):
                return 0  # finished by another process: what they said since stays
            ids = [
                str(r[0])
                for r in fetchall(
                    conn,
                    "SELECT id FROM interactions WHERE community_id = ? AND speaker_id = ?",
                    (cid, member),
                )
            ]
            changed = delete_from_outbox(conn, cid, ids)
            speaker = conn.dialect.json_text("payload_json", "speaker")
            for sql, args in (
                ("DELETE FROM interactions WHERE community_id = ? AND speaker_id = ?", ()),
                ("DELETE FROM conversation_turns WHERE community_id = ? AND user_id = ?", ()),
                ("DELETE FROM evidence_log WHERE community_id = ? AND member = ?", ()),
                (
                    "DELETE FROM audit_events WHERE community_id = ? AND kind = 'ess' "
                    f"AND {speaker} = ?",
                    (),
                ),
                (
                    "UPDATE moderator_actions SET actor_id = ?, actor_name = ? "
                    "WHERE community_id = ? AND actor_id = ?",
                    (pseudonym, pseudonym),
                ),
                # The mode stays (the community's setting); who set it becomes the pseudonym.
                (
                    "UPDATE channel_modes SET set_by_id = ?, set_by_name = ? "
                    "WHERE community_id = ? AND set_by_id = ?",
                    (pseudonym, pseudonym),
                ),
            ):
                changed += execute(conn, sql, (*args, cid, member))
            # The daily limit stays too; its setter ("Name (id)", or the id) becomes the
            # pseudonym, matched on the whole id so "bob" never takes "bobby"'s row.
            for (set_by,) in fetchall(
                conn, "SELECT set_by FROM community_budgets WHERE community_id = ?", (cid,)
            ):
                if set_by == member or str(set_by).endswith(f" ({member})"):
                    changed += execute(
                        conn,
                        "UPDATE community_budgets SET set_by = ? WHERE community_id = ?",
                        (pseudonym, cid),
                    )
            key = member_key(cid, member)
            for sql, who in (
                ("DELETE FROM flood_windows WHERE community_id = ? AND member_key = ?", key),
                ("DELETE FROM member_spend WHERE community_id = ? AND member_id = ?", member),
                ("DELETE FROM reply_feedback WHERE community_id = ? AND member_key = ?", key),
            ):
                changed += execute(conn, sql, (cid, who))
            # Every row of the community: a reason may name them by a name, not the id.
            for row_id, args, reason in fetchall(
                conn,
                "SELECT id, args, reason FROM moderator_actions WHERE community_id = ?",
                (cid,),
            ):
                new = (
                    redact.text(str(args), labels=False, free=True),
                    redact.text(str(reason), labels=False, free=True),
                )
                if new != (args, reason):
                    changed += execute(
                        conn,
                        "UPDATE moderator_actions SET args = ?, reason = ? WHERE id = ?",
                        (*new, row_id),
                    )
            changed += redact_history(conn, cid, redact, versions, ("forget_requests", request.id))
            execute(
                conn,
                "UPDATE forget_requests SET redacting = 0, member_id = NULL, finished_at = ?, "
                "reason = ? WHERE id = ?",
                (
                    to_db_time(at),
                    redact.text(request.reason, labels=False, free=True),  # "Tom asked"
                    request.id,
                ),
            )
            return changed

        changed = await self._run_write(work, scope=cid)
        if changed:  # a member of whom nothing was kept leaves nothing to scrub
            await self._scrub_deleted(FORGET_TABLES, rebuild=True)
        return changed

    # ------------------------------------------------------------------ restoring

    async def journal_pseudonyms(self) -> set[str]:
        """The pseudonyms of every forget-me this database knows of."""
        return {str(r[0]) for r in await self._fetchall("SELECT pseudonym FROM forget_requests")}

    async def rejournal(self, entries: Sequence[JournalEntry], at: datetime) -> list[str]:
        """Journal again the forget-me requests of `entries` this database lacks (it was
        restored from before them): each is matched by its key against every member the
        database holds and journaled unfinished, to be finished on start
        (`bot.forget_me.resume_forgets`); one that matches no one is recorded as done.
        Returns the pseudonyms of those that matched."""

        def work(conn: Conn) -> list[str]:
            known = {str(r[0]) for r in fetchall(conn, "SELECT pseudonym FROM forget_requests")}
            missing = [e for e in entries if e.pseudonym not in known]
            if not missing:
                return []
            members = _all_members(conn)
            matched: list[str] = []
            for entry in missing:
                found = next((m for m in members if key_matches(entry.key, *m)), None)
                community, member = found if found is not None else ("", None)
                execute(
                    conn,
                    "INSERT INTO forget_requests (community_id, member_id, pseudonym, "
                    "requested_by, reason, started_at, finished_at, member_key) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        community,
                        member,
                        entry.pseudonym,
                        REAPPLIED_BY,
                        "re-applied: the database was restored from before this forget-me",
                        to_db_time(entry.at),
                        None if member is not None else to_db_time(at),
                        entry.key,
                    ),
                )
                if member is not None:
                    matched.append(entry.pseudonym)
            return matched

        return await self._run_write(work)


async def versions_to_redact(
    db: SqlBase, community_id: str, redact: Redaction, after: int = -1
) -> list[int]:
    """The versions after `after` whose state, change line or actor may name the member
    (or message) or quote their words, read a page at a time."""
    found: list[int] = []
    while True:
        rows = await db._fetchall(
            "SELECT version, state_json, change, actor FROM personality_versions "
            "WHERE community_id = ? AND version > ? ORDER BY version LIMIT ?",
            (community_id, after, VERSIONS_PER_READ),
        )
        if not rows:
            return found
        # Off the event loop: a long history takes seconds to look through.
        found += await asyncio.to_thread(redact.versions_in, rows)
        after = int(rows[-1][0])


def redact_history(
    conn: Conn,
    community_id: str,
    redact: Redaction,
    versions: Sequence[int],
    gate: tuple[str, int],
    *,
    ratings_since: int | None = None,
) -> int:
    """Apply `redact` to the personality's own audit events (reflections, rollbacks,
    forget-me) and to `versions`, whose text columns may change only while the journal
    row `gate` (its table and id: a forget-me or a message deletion) holds the
    redaction gate open; the caller closes it in the same transaction. Other messages'
    "ess" events hold their own words, but may name a topic their commit moved: with
    `ratings_since`, every event of that version on is redacted, theirs included (none
    before it can quote what is redacted); without it, those naming one of the
    redaction's topics. Returns the rows rewritten."""
    changed = 0
    where: str
    args: tuple[Any, ...]
    if ratings_since is not None:
        where, args = "version >= ?", (ratings_since,)
    elif redact.topics:
        # Another message's rating may list one of the member's own topics among those
        # its commit moved: those ratings are found by the topic's JSON text.
        topics = sorted(redact.topics)
        has = " OR ".join(conn.dialect.contains("payload_json") for _ in topics)
        where, args = f"(kind != 'ess' OR {has})", tuple(to_json(t) for t in topics)
    else:
        where, args = "kind != 'ess'", ()
    for row_id, payload in fetchall(
        conn,
        f"SELECT id, payload_json FROM audit_events WHERE community_id = ? AND {where}",
        (community_id, *args),
    ):
        new_payload = redact.json(str(payload))
        if new_payload != payload:
            changed += execute(
                conn, "UPDATE audit_events SET payload_json = ? WHERE id = ?", (new_payload, row_id)
            )
    table, journal_id = gate
    execute(conn, f"UPDATE {table} SET redacting = 1 WHERE id = ?", (journal_id,))
    for chunk, marks in id_chunks([str(v) for v in versions]):
        for version, state_json, change, actor in fetchall(
            conn,
            "SELECT version, state_json, change, actor FROM personality_versions "
            f"WHERE community_id = ? AND version IN ({marks})",
            (community_id, *chunk),
        ):
            redacted = (
                redact.json(str(state_json)),
                redact.text(str(change), free=True),
                None if actor is None else redact.text(str(actor), labels=False),
            )
            if redacted != (state_json, change, actor):
                changed += execute(
                    conn,
                    "UPDATE personality_versions SET state_json = ?, change = ?, "
                    "actor = ? WHERE community_id = ? AND version = ?",
                    (*redacted, community_id, version),
                )
    return changed


def step_words(step_json: str, words: list[str], topics: set[str]) -> None:
    """Add what an evidence step quotes of its message (the ESS summary, also cut as a
    provenance line cuts it) and the topics it produced."""
    ess = from_json(step_json).get("ess") or {}
    if ess.get("summary") and not made_summary(str(ess["summary"])):
        words.append(str(ess["summary"]))
        words.append(str(ess["summary"])[:160])
    topics.update(str(t) for t in ess.get("topics") or () if t)


def rating_words(payload_json: str, words: list[str], topics: set[str]) -> None:
    """Add what an "ess" audit event quotes of its message (summary and insight) and
    its topics."""
    event = from_json(payload_json)
    summary = str(event.get("summary") or "")
    if summary and not made_summary(summary):
        words += [summary, summary[:160]]
    if event.get("insight"):
        words.append(str(event["insight"]))
    topics.update(str(t) for t in event.get("topics") or () if t)


def used_by_others(
    conn: Conn,
    community_id: str,
    column: str,
    value: str,
    topics: Iterable[str],
    *,
    staying_only: bool = False,
) -> set[str]:
    """Those of `topics` another message produced too: one whose evidence `column`
    ("member" or "interaction_id", a constant) is not `value` (by the evidence log,
    kept for good). With `staying_only`, a message whose deletion is under way does not
    count: messages deleted together (a purge) own the topics only they produced, and
    each erase must find them so. Rows are found by the topic's JSON text and then read
    exactly; a topic stops being looked for once found."""
    going = f" AND interaction_id NOT IN ({BEING_DELETED})" if staying_only else ""
    every = sorted(set(topics))
    shared: set[str] = set()
    has = conn.dialect.contains
    for start in range(0, len(every), TOPICS_PER_QUERY):
        chunk = set(every[start : start + TOPICS_PER_QUERY])
        after = -1
        while needles := sorted(chunk - shared):
            rows = fetchall(
                conn,
                "SELECT seq, step_json FROM evidence_log WHERE community_id = ? "
                f"AND {column} != ? AND kind = 'message' AND seq > ?{going} "
                f"AND ({' OR '.join(has('step_json') for _ in needles)}) ORDER BY seq LIMIT 500",
                (
                    community_id,
                    value,
                    after,
                    *((community_id,) if staying_only else ()),
                    *(json.dumps(t, ensure_ascii=False) for t in needles),
                ),
            )
            if not rows:
                break
            for seq, step in rows:
                after = int(seq)
                ess = from_json(str(step)).get("ess") or {}
                shared.update(str(t) for t in ess.get("topics") or () if t in chunk)
    return shared


def _all_members(conn: Conn) -> list[tuple[str, str]]:
    """(community, member) for every member any community has seen."""
    pairs: set[tuple[str, str]] = set()
    for sql in (
        "SELECT DISTINCT community_id, speaker_id FROM interactions",
        "SELECT DISTINCT community_id, member FROM evidence_log WHERE kind = 'message'",
        "SELECT DISTINCT community_id, user_id FROM conversation_turns",
        "SELECT DISTINCT community_id, actor_id FROM moderator_actions",
    ):
        pairs.update((str(c), str(m)) for c, m in fetchall(conn, sql) if m)
    return sorted(pairs)
