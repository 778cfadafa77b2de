"""Retention: how long the rows that only ever grow are kept.

Every table that gains rows with traffic has a rule, so the file is bounded by time,
not by how much a community ever said:

* ``interactions`` (the outbox): a **pending** row is never touched, however old; it is
  work still to do. Once finished (done, or parked as failed), the member's message, the
  reply and the error text are erased after the **message retention**
  (``SONALITY_MESSAGE_RETENTION_DAYS``), and the row itself is deleted after the **audit
  retention**. Nothing needs the text once the message is learned (the personality's
  versions, the episodes and the audit trail hold what came of it); the row's speaker
  id and name stay as long as the audit trail that names them.
* ``conversation_turns`` (the short-term buffer, which quotes both sides): deleted
  after the message retention, even when ``SONALITY_BUFFER_TTL_MINUTES`` (its usual,
  much shorter expiry, ``prune_turns``) is set longer.
* ``episode_outbox`` rows are work still to do and are kept, but the member's message
  and the reply inside an unwritten episode are erased after the message retention
  (Chroma only ever gets the ESS summary).
* A summary that quotes the member: releases before 2026-11-24 gave a message that
  could not be rated the message's first words as its ESS summary (today's fallback,
  `sonality.ess.fallback_summary`, quotes nothing). In the "ess" audit events and the
  evidence log such a summary is erased with the message.
* ``audit_events``, ``moderator_actions`` and ``usage_daily`` (token usage per day):
  deleted after the **audit retention** (``SONALITY_AUDIT_RETENTION_DAYS``). The
  personality's history keeps each version's cause, change and actor for good.
* ``evidence_log`` (what an exact opinion replay needs) is kept while the community
  is: forget-me depends on it. It holds ESS results, not messages.
* ``message_deletions``: a row that took nothing back (the platform reported the
  deletion of a message nothing was kept of) is deleted a day after; it only refuses
  an answer that was being written meanwhile. A row that took an answer back is kept,
  learned from or not (it holds no id of it; its version tells a rollback to leave the
  message out, and its label tells a start that the journal file's entry of it is
  already in force).
* ``seen_events`` (platform event dedup) and ``oauth_states``: deleted once expired.
  They are also pruned as new ones arrive; this covers a platform that went quiet.
* Not here: ``personality_versions`` are append-only (history is evidence; they are
  stored small instead, see `storage.history`).

Deleting runs in windows of `WINDOW` row ids, one short transaction each, so a first
run on a large file never holds up replies for long.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from storage.base import Conn, Dialect, SqlBase, execute, local_day, table_exists, to_db_time
from storage.deletion import TOMBSTONE_DAYS

WINDOW = 5_000
"""Row ids per transaction while deleting (a few milliseconds of work each)."""


class RetentionPolicy(BaseModel):
    """How many days rows are kept (`bot.settings` holds the operator's choice)."""

    model_config = ConfigDict(frozen=True)

    message_days: int = Field(default=90, ge=1)
    audit_days: int = Field(default=365, ge=1)


class RetentionReport(BaseModel):
    """What one run erased or deleted, per table."""

    model_config = ConfigDict(frozen=True)

    texts_erased: int = 0  # finished interactions whose message and reply were erased
    conversation_turns: int = 0
    episode_texts_erased: int = 0  # unwritten episodes whose message and reply were erased
    quoted_summaries_erased: int = 0  # older fallback summaries (the message's first words)
    interactions: int = 0
    audit_events: int = 0
    moderator_actions: int = 0
    usage_days: int = 0
    seen_events: int = 0
    oauth_states: int = 0
    message_deletions: int = 0  # rows of deletions that took nothing back

    @property
    def total(self) -> int:
        return sum(self.model_dump().values())

    def describe(self) -> str:
        return ", ".join(f"{name} {count}" for name, count in self.model_dump().items() if count)


#: An ESS result whose summary is the fallback (`sonality.ess.safe_default_ess`): before
#: 2026-11-24 the first words of the member's message, so raw text that goes with it.
def _quoting_summary(sql: Dialect, column: str, prefix: str = "") -> str:
    return (
        f"{sql.json_is_true(column, prefix + 'used_defaults')} "
        f"AND {sql.json_text(column, prefix + 'summary')} != ''"
    )


def _erase_quoting_evidence(conn: Conn, cutoff: str) -> int:
    """The evidence log's fallback summaries (see `_quoting_summary`) of messages older
    than `cutoff`, by the time of the interaction they record. A replay never reads the
    summary, so erasing it changes no opinion. A file without the log (older schema in
    a test) has nothing to erase."""
    if not table_exists(conn, "evidence_log"):
        return 0
    sql = conn.dialect
    return execute(
        conn,
        f"UPDATE evidence_log SET step_json = {sql.json_blank('step_json', 'ess.summary')} "
        "WHERE kind = 'message' "
        f"AND {_quoting_summary(sql, 'step_json', 'ess.')} "
        "AND (interaction_id IN (SELECT id FROM interactions "
        "WHERE interactions.community_id = evidence_log.community_id AND created_at < ?) "
        # its interaction row is gone: deleted by audit retention, so older still
        "OR NOT EXISTS (SELECT 1 FROM interactions WHERE interactions.community_id = "
        "evidence_log.community_id AND interactions.id = evidence_log.interaction_id))",
        (cutoff,),
    )


def _prune_deletions(conn: Conn, cutoff: str) -> int:
    """The rows of deletions that took nothing back, finished before `cutoff` (a file
    of an older schema in a test has none)."""
    if not table_exists(conn, "message_deletions"):
        return 0
    return execute(
        conn,
        "DELETE FROM message_deletions WHERE version IS NULL AND answered = 0 "
        "AND finished_at IS NOT NULL AND finished_at < ?",
        (cutoff,),
    )


class RetentionStore(SqlBase):
    async def apply_retention(self, now: datetime, policy: RetentionPolicy) -> RetentionReport:
        """Erase and delete what `policy` says is old at `now` (all communities)."""
        message_cutoff = to_db_time(now - timedelta(days=policy.message_days))
        audit_cutoff = to_db_time(now - timedelta(days=policy.audit_days))
        first_day = local_day(now - timedelta(days=policy.audit_days), self.tz).isoformat()
        stamp = to_db_time(now)
        finished = "status != 'pending'"
        interactions = await self._in_windows(
            "interactions", "seq", None, f"{finished} AND created_at < ?", (audit_cutoff,)
        )
        erased = await self._in_windows(
            "interactions",
            "seq",
            "message = '', reply = '', last_error = NULL",
            f"{finished} AND created_at < ? "
            "AND (message != '' OR reply != '' OR last_error IS NOT NULL)",
            (message_cutoff,),
        )
        turns = await self._in_windows(
            "conversation_turns", "id", None, "created_at < ?", (message_cutoff,)
        )
        quoted = await self._in_windows(
            "audit_events",
            "id",
            f"payload_json = {self.dialect.json_blank('payload_json', 'summary')}",
            f"created_at < ? AND kind = 'ess' AND {_quoting_summary(self.dialect, 'payload_json')}",
            (message_cutoff,),
        )
        audit = await self._in_windows(
            "audit_events", "id", None, "created_at < ?", (audit_cutoff,)
        )
        actions = await self._in_windows(
            "moderator_actions", "id", None, "created_at < ?", (audit_cutoff,)
        )

        tombstones = to_db_time(now - timedelta(days=TOMBSTONE_DAYS))

        def small_tables(conn: Conn) -> tuple[int, int, int, int, int, int]:
            sql = conn.dialect
            return (
                execute(
                    conn,
                    "UPDATE episode_outbox SET episode_json = "
                    f"{sql.json_blank('episode_json', 'user_message', 'agent_response')} "
                    f"WHERE ({sql.json_text('episode_json', 'user_message')} != '' "
                    f"OR {sql.json_text('episode_json', 'agent_response')} != '') "
                    # by the message's time (its interaction row), else by the row's own
                    "AND (created_at < ? OR episode_id IN (SELECT id FROM interactions "
                    "WHERE interactions.community_id = episode_outbox.community_id "
                    "AND interactions.created_at < ?))",
                    (message_cutoff, message_cutoff),
                ),
                _erase_quoting_evidence(conn, message_cutoff),
                execute(conn, "DELETE FROM usage_daily WHERE day < ?", (first_day,)),
                execute(conn, "DELETE FROM seen_events WHERE expires_at <= ?", (stamp,)),
                execute(conn, "DELETE FROM oauth_states WHERE expires_at <= ?", (stamp,)),
                _prune_deletions(conn, tombstones),
            )

        outbox, evidence, usage, seen, oauth, deletions = await self._run_write(small_tables)
        return RetentionReport(
            texts_erased=erased,
            conversation_turns=turns,
            episode_texts_erased=outbox,
            quoted_summaries_erased=quoted + evidence,
            interactions=interactions,
            audit_events=audit,
            moderator_actions=actions,
            usage_days=usage,
            seen_events=seen,
            oauth_states=oauth,
            message_deletions=deletions,
        )

    async def _in_windows(
        self,
        table: str,
        key: str,
        assignments: str | None,
        condition: str,
        params: tuple[object, ...],
    ) -> int:
        """Delete (`assignments` None) or update the rows of `table` matching `condition`,
        one window of `WINDOW` ids (`key`) at a time from the lowest id to the highest;
        returns the rows changed. Table, columns and condition are this module's
        constants, never input."""
        bounds = await self._fetchone(f"SELECT MIN({key}), MAX({key}) FROM {table}")
        if bounds is None or bounds[0] is None:
            return 0
        low, high = int(bounds[0]), int(bounds[1])
        change = (
            f"DELETE FROM {table}" if assignments is None else f"UPDATE {table} SET {assignments}"
        )
        sql = f"{change} WHERE {key} >= ? AND {key} < ? AND {condition}"

        def window(start: int) -> Callable[[Conn], int]:
            return lambda conn: execute(conn, sql, (start, start + WINDOW, *params))

        changed = 0
        for start in range(low, high + 1, WINDOW):
            changed += await self._run_write(window(start))
        return changed
