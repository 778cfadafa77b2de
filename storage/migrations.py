"""Forward-only schema migrations, for SQLite and for PostgreSQL.

Why numbered lists of statements instead of ``CREATE TABLE IF NOT EXISTS`` on start:
a deployed bot's database must be upgraded in place, exactly once per step, and a crash
in the middle of a step must leave the previous schema intact. Each entry of
`MIGRATIONS` is applied in ONE transaction together with its row in
``schema_migrations`` (so the recorded version can never disagree with the tables), in
order, and never edited after release: change the schema by appending a new entry.

Both engines run the same numbered steps. A plain string is written in SQLite's words
and `postgres_ddl` maps its column types for PostgreSQL (64-bit integers, identity
columns for AUTOINCREMENT, DOUBLE PRECISION, BYTEA, and the "C" collation on text so
that text compares byte by byte as in SQLite: the fixed-width times and the ids sort
the same on both). Where the two languages really differ (triggers) an entry is an
`Each` holding both texts: the guarantees are the same, the words are each engine's.

Every per-community table references ``communities(id)`` and leads its indexes with
``community_id``: queries are always scoped to one community, so communities never see
each other's rows.
"""

from __future__ import annotations

import re
import sqlite3
from dataclasses import dataclass

import aiosqlite

from sonality.store import utcnow
from storage.base import (
    Conn,
    Engine,
    SqliteEngine,
    execute,
    fetchone,
    run_on_sqlite_thread,
    to_db_time,
    write_transaction,
)
from storage.models import SchemaTooNewError


@dataclass(frozen=True)
class Each:
    """One migration statement spelled for each engine."""

    sqlite: str
    postgresql: str


Statement = str | Each

_APPEND_ONLY = "'personality_versions is append-only'"
# The triggers' refusals carry SQLSTATE 23000 (integrity_constraint_violation), so a
# driver reports them as the same kind of error SQLite's RAISE(ABORT) is.
_INTEGRITY = "USING ERRCODE = 'integrity_constraint_violation'"

_V1: list[Statement] = [
    """
    CREATE TABLE communities (
        id TEXT PRIMARY KEY,
        platform TEXT NOT NULL,
        name TEXT NOT NULL DEFAULT '',
        created_at TEXT NOT NULL,
        last_activity_at TEXT,
        last_reflection_time TEXT
    )
    """,
    # Append-only history of personality states; the newest row is the current state.
    """
    CREATE TABLE personality_versions (
        community_id TEXT NOT NULL REFERENCES communities(id),
        version INTEGER NOT NULL CHECK (version >= 0),
        cause TEXT NOT NULL,
        change TEXT NOT NULL,
        actor TEXT,
        interaction_count INTEGER NOT NULL,
        state_json TEXT NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (community_id, version)
    ) WITHOUT ROWID
    """,
    # Enforced in the database, not only by convention: history is evidence.
    Each(
        "",
        f"""
        CREATE FUNCTION personality_versions_refuse() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION {_APPEND_ONLY} {_INTEGRITY}; END $$
        """,
    ),
    Each(
        """
        CREATE TRIGGER personality_versions_no_update
        BEFORE UPDATE ON personality_versions
        BEGIN SELECT RAISE(ABORT, 'personality_versions is append-only'); END
        """,
        """
        CREATE TRIGGER personality_versions_no_update
        BEFORE UPDATE ON personality_versions
        FOR EACH ROW EXECUTE FUNCTION personality_versions_refuse()
        """,
    ),
    Each(
        """
        CREATE TRIGGER personality_versions_no_delete
        BEFORE DELETE ON personality_versions
        BEGIN SELECT RAISE(ABORT, 'personality_versions is append-only'); END
        """,
        """
        CREATE TRIGGER personality_versions_no_delete
        BEFORE DELETE ON personality_versions
        FOR EACH ROW EXECUTE FUNCTION personality_versions_refuse()
        """,
    ),
    # The outbox. `seq` gives the processing order; `id` is the engine's interaction id,
    # unique per community (so one community can never ack another's row).
    """
    CREATE TABLE interactions (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL,
        community_id TEXT NOT NULL REFERENCES communities(id),
        speaker_id TEXT NOT NULL,
        speaker_name TEXT NOT NULL,
        message TEXT NOT NULL,
        reply TEXT NOT NULL,
        model TEXT NOT NULL,
        usage_json TEXT NOT NULL,
        created_at TEXT NOT NULL,
        status TEXT NOT NULL DEFAULT 'pending'
            CHECK (status IN ('pending', 'done', 'failed')),
        attempts INTEGER NOT NULL DEFAULT 0,
        last_error TEXT,
        updated_at TEXT NOT NULL,
        UNIQUE (community_id, id)
    )
    """,
    "CREATE INDEX interactions_by_status ON interactions (community_id, status, seq)",
    """
    CREATE TABLE audit_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        community_id TEXT NOT NULL REFERENCES communities(id),
        version INTEGER NOT NULL,
        interaction INTEGER NOT NULL,
        kind TEXT NOT NULL,
        payload_json TEXT NOT NULL,
        created_at TEXT NOT NULL,
        FOREIGN KEY (community_id, version)
            REFERENCES personality_versions (community_id, version)
    )
    """,
    "CREATE INDEX audit_events_by_kind ON audit_events (community_id, kind, id)",
    "CREATE INDEX audit_events_by_version ON audit_events (community_id, version)",
    """
    CREATE TABLE token_usage (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        community_id TEXT NOT NULL REFERENCES communities(id),
        purpose TEXT NOT NULL,
        model TEXT NOT NULL,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cache_read_tokens INTEGER NOT NULL,
        cache_write_tokens INTEGER NOT NULL,
        created_at TEXT NOT NULL
    )
    """,
    "CREATE INDEX token_usage_by_time ON token_usage (community_id, created_at)",
    """
    CREATE TABLE moderator_actions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        community_id TEXT NOT NULL REFERENCES communities(id),
        actor_id TEXT NOT NULL,
        actor_name TEXT NOT NULL,
        action TEXT NOT NULL,
        args TEXT NOT NULL,
        reason TEXT NOT NULL,
        allowed INTEGER NOT NULL CHECK (allowed IN (0, 1)),
        created_at TEXT NOT NULL
    )
    """,
    "CREATE INDEX moderator_actions_by_community ON moderator_actions (community_id, id)",
    # Short-term conversation memory per (community, user). Both turns of one exchange
    # share `exchange`, so pruning and reading can keep user+assistant pairs whole.
    """
    CREATE TABLE conversation_turns (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        community_id TEXT NOT NULL REFERENCES communities(id),
        user_id TEXT NOT NULL,
        exchange INTEGER NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('user', 'assistant')),
        content TEXT NOT NULL,
        created_at TEXT NOT NULL
    )
    """,
    """
    CREATE INDEX conversation_turns_by_user
    ON conversation_turns (community_id, user_id, exchange, id)
    """,
    "CREATE INDEX conversation_turns_by_time ON conversation_turns (created_at)",
    # Platform plumbing (generic: no platform SDK types, just ids and JSON).
    """
    CREATE TABLE seen_events (
        platform TEXT NOT NULL,
        event_id TEXT NOT NULL,
        seen_at TEXT NOT NULL,
        expires_at TEXT NOT NULL,
        PRIMARY KEY (platform, event_id)
    ) WITHOUT ROWID
    """,
    "CREATE INDEX seen_events_by_expiry ON seen_events (expires_at)",
    """
    CREATE TABLE installations (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        enterprise_id TEXT NOT NULL,
        team_id TEXT NOT NULL,
        user_id TEXT NOT NULL,
        is_enterprise_install INTEGER NOT NULL CHECK (is_enterprise_install IN (0, 1)),
        data_json TEXT NOT NULL,
        installed_at TEXT NOT NULL,
        UNIQUE (enterprise_id, team_id, user_id)
    )
    """,
    """
    CREATE TABLE oauth_states (
        state TEXT PRIMARY KEY,
        expires_at TEXT NOT NULL
    ) WITHOUT ROWID
    """,
]

_V2: list[Statement] = [
    # Episodes committed with a version but not yet written to Chroma (write-behind).
    """
    CREATE TABLE episode_outbox (
        community_id TEXT NOT NULL REFERENCES communities(id),
        episode_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        episode_json TEXT NOT NULL,
        created_at TEXT NOT NULL,
        PRIMARY KEY (community_id, episode_id)
    )
    """,
    "CREATE INDEX episode_outbox_order ON episode_outbox (community_id, seq)",
]

_V3: list[Statement] = [
    # Token usage as a daily rollup: one row per community, local day (SONALITY_TIMEZONE,
    # as 'YYYY-MM-DD'), role and model, bounded by time instead of by traffic.
    """
    CREATE TABLE usage_daily (
        community_id TEXT NOT NULL REFERENCES communities(id),
        day TEXT NOT NULL,
        role TEXT NOT NULL CHECK (role IN ('reply', 'evidence', 'reflection')),
        model TEXT NOT NULL,
        calls INTEGER NOT NULL,
        input_tokens INTEGER NOT NULL,
        output_tokens INTEGER NOT NULL,
        cache_write_tokens INTEGER NOT NULL,
        cache_read_tokens INTEGER NOT NULL,
        PRIMARY KEY (community_id, day, role, model)
    ) WITHOUT ROWID
    """,
    # The old per-call rows, summed. A migration cannot know the operator's time zone,
    # so each old row lands on its UTC date (the first ten characters of its ISO-8601
    # UTC `created_at`); rows written from now on use the local day. Purposes map to
    # roles as `storage.models.usage_role` does: ess, insight and anything else the
    # background did count as evidence.
    """
    INSERT INTO usage_daily (community_id, day, role, model, calls, input_tokens,
        output_tokens, cache_write_tokens, cache_read_tokens)
    SELECT community_id,
           substr(created_at, 1, 10),
           CASE purpose WHEN 'reply' THEN 'reply' WHEN 'reflection' THEN 'reflection'
                ELSE 'evidence' END,
           model,
           COUNT(*),
           SUM(input_tokens),
           SUM(output_tokens),
           SUM(cache_write_tokens),
           SUM(cache_read_tokens)
    FROM token_usage
    GROUP BY 1, 2, 3, 4
    """,
    "DROP TABLE token_usage",
    # A community's own daily spending limit, set by a moderator. No row: the default
    # (SONALITY_DAILY_BUDGET_USD); a NULL limit: explicitly none.
    """
    CREATE TABLE community_budgets (
        community_id TEXT PRIMARY KEY REFERENCES communities(id),
        daily_limit_usd REAL CHECK (daily_limit_usd IS NULL OR daily_limit_usd >= 0),
        set_by TEXT NOT NULL,
        set_at TEXT NOT NULL
    ) WITHOUT ROWID
    """,
]

_V4: list[Statement] = [
    # Versions stored as keyframes and patches (see storage/history.py). NULL: the row's
    # state_json is the full state, as every row written before this step is, so they
    # all stay valid keyframes; otherwise it is a merge patch against the previous
    # version, and this column names the keyframe its chain starts from. Adding a
    # column updates no row, so the append-only triggers are untouched.
    """
    ALTER TABLE personality_versions ADD COLUMN keyframe INTEGER
        CHECK (keyframe IS NULL OR (keyframe >= 0 AND keyframe < version))
    """,
    # A patch must extend its keyframe's chain: the version right before it is that
    # keyframe, or a patch of the same chain. So every chain is gap-free and starts
    # from a full state, whatever code writes to the file.
    Each(
        """
        CREATE TRIGGER personality_versions_patch_extends_chain
        BEFORE INSERT ON personality_versions
        WHEN NEW.keyframe IS NOT NULL
        BEGIN
            SELECT RAISE(ABORT, 'a patch version must follow a version of its keyframe''s chain')
            WHERE NOT EXISTS (
                SELECT 1 FROM personality_versions
                WHERE community_id = NEW.community_id AND version = NEW.version - 1
                  AND COALESCE(keyframe, version) = NEW.keyframe
            );
        END
        """,
        f"""
        CREATE FUNCTION personality_versions_check_chain() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NOT EXISTS (
                SELECT 1 FROM personality_versions
                WHERE community_id = NEW.community_id AND version = NEW.version - 1
                  AND COALESCE(keyframe, version) = NEW.keyframe
            ) THEN
                RAISE EXCEPTION 'a patch version must follow a version of its keyframe''s chain'
                    {_INTEGRITY};
            END IF;
            RETURN NEW;
        END $$
        """,
    ),
    Each(
        "",
        """
        CREATE TRIGGER personality_versions_patch_extends_chain
        BEFORE INSERT ON personality_versions
        FOR EACH ROW WHEN (NEW.keyframe IS NOT NULL)
        EXECUTE FUNCTION personality_versions_check_chain()
        """,
    ),
]

_V5_REMOVALS: list[Statement] = [
    # Communities the bot was removed from (Discord guild left or kicked, Slack app
    # uninstalled): the bot stays silent there, and their data is erased at `delete_at`
    # unless the bot is added back first (storage/removal.py). No foreign key: a
    # community can be removed before it ever spoke to the bot.
    """
    CREATE TABLE community_removals (
        community_id TEXT PRIMARY KEY,
        removed_at TEXT NOT NULL,
        delete_at TEXT NOT NULL
    ) WITHOUT ROWID
    """,
    "CREATE INDEX community_removals_by_deadline ON community_removals (delete_at)",
    # The audit trail of whole-community erasures, and the one gate through which
    # personality_versions rows may be deleted: only while an unfinished erasure of
    # that community exists. storage/removal.py opens one, deletes and closes it in a
    # single transaction, so no other writer ever sees the gate open.
    """
    CREATE TABLE community_erasures (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        community_id TEXT NOT NULL,
        removed_at TEXT,
        started_at TEXT NOT NULL,
        finished_at TEXT,
        rows_deleted INTEGER
    )
    """,
    "CREATE INDEX community_erasures_open ON community_erasures (community_id, finished_at)",
    Each(
        "DROP TRIGGER personality_versions_no_delete",
        "DROP TRIGGER personality_versions_no_delete ON personality_versions",
    ),
    Each(
        """
        CREATE TRIGGER personality_versions_no_delete
        BEFORE DELETE ON personality_versions
        WHEN NOT EXISTS (
            SELECT 1 FROM community_erasures
            WHERE community_id = OLD.community_id AND finished_at IS NULL
        )
        BEGIN SELECT RAISE(ABORT, 'personality_versions is append-only'); END
        """,
        f"""
        CREATE FUNCTION personality_versions_delete_gate() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NOT EXISTS (
                SELECT 1 FROM community_erasures
                WHERE community_id = OLD.community_id AND finished_at IS NULL
            ) THEN
                RAISE EXCEPTION {_APPEND_ONLY} {_INTEGRITY};
            END IF;
            RETURN OLD;
        END $$
        """,
    ),
    Each(
        "",
        """
        CREATE TRIGGER personality_versions_no_delete
        BEFORE DELETE ON personality_versions
        FOR EACH ROW EXECUTE FUNCTION personality_versions_delete_gate()
        """,
    ),
]

_V6_EVIDENCE: list[Statement] = [
    # The evidence log (sonality/evidence.py): every learned message's ESS result and
    # speaker, every decay and rollback, in commit order, so forgetting a member can
    # replay the opinions exactly without their messages. `member` and
    # `interaction_id` are columns so a forget-me deletes that member's steps by index.
    # Not audit: retention of the audit trail must not break the replay.
    """
    CREATE TABLE evidence_log (
        community_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        version INTEGER NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('message', 'decay', 'rollback')),
        interaction_id TEXT NOT NULL DEFAULT '',
        member TEXT NOT NULL DEFAULT '',
        step_json TEXT NOT NULL,
        PRIMARY KEY (community_id, seq)
    ) WITHOUT ROWID
    """,
    "CREATE INDEX evidence_log_by_member ON evidence_log (community_id, member)",
]

_V7_FORGET: list[Statement] = [
    # The forget-me journal (storage/forget.py). A row is written before anything is
    # deleted, so a forget-me interrupted by a crash is finished on the next start;
    # `member_id` is cleared when it finishes, so the finished row keeps only the
    # pseudonym, who asked (the member themself, or the moderator) and why.
    """
    CREATE TABLE forget_requests (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        community_id TEXT NOT NULL,
        member_id TEXT,
        pseudonym TEXT NOT NULL,
        requested_by TEXT NOT NULL,
        reason TEXT NOT NULL DEFAULT '',
        version INTEGER,
        redacting INTEGER NOT NULL DEFAULT 0 CHECK (redacting IN (0, 1)),
        started_at TEXT NOT NULL,
        finished_at TEXT,
        CHECK (finished_at IS NULL OR member_id IS NULL)
    )
    """,
    "CREATE INDEX forget_requests_open ON forget_requests (community_id, finished_at)",
    # The one way past versions may change: while a forget-me of that community holds
    # its redaction gate (set and cleared inside one transaction), and only the text
    # columns, so the member's id and words can be replaced by their pseudonym. The
    # version's number, cause, counts, time and chain stay exactly as written.
    Each(
        "DROP TRIGGER personality_versions_no_update",
        "DROP TRIGGER personality_versions_no_update ON personality_versions",
    ),
    Each(
        """
        CREATE TRIGGER personality_versions_no_update
        BEFORE UPDATE ON personality_versions
        WHEN NOT EXISTS (
            SELECT 1 FROM forget_requests
            WHERE community_id = OLD.community_id AND finished_at IS NULL AND redacting = 1
        ) OR NEW.community_id IS NOT OLD.community_id OR NEW.version IS NOT OLD.version
          OR NEW.cause IS NOT OLD.cause OR NEW.interaction_count IS NOT OLD.interaction_count
          OR NEW.created_at IS NOT OLD.created_at OR NEW.keyframe IS NOT OLD.keyframe
        BEGIN SELECT RAISE(ABORT, 'personality_versions is append-only'); END
        """,
        f"""
        CREATE FUNCTION personality_versions_update_gate() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF NOT EXISTS (
                SELECT 1 FROM forget_requests
                WHERE community_id = OLD.community_id AND finished_at IS NULL
                  AND redacting = 1
            ) OR NEW.community_id IS DISTINCT FROM OLD.community_id
              OR NEW.version IS DISTINCT FROM OLD.version
              OR NEW.cause IS DISTINCT FROM OLD.cause
              OR NEW.interaction_count IS DISTINCT FROM OLD.interaction_count
              OR NEW.created_at IS DISTINCT FROM OLD.created_at
              OR NEW.keyframe IS DISTINCT FROM OLD.keyframe
            THEN
                RAISE EXCEPTION {_APPEND_ONLY} {_INTEGRITY};
            END IF;
            RETURN NEW;
        END $$
        """,
    ),
    Each(
        "",
        """
        CREATE TRIGGER personality_versions_no_update
        BEFORE UPDATE ON personality_versions
        FOR EACH ROW EXECUTE FUNCTION personality_versions_update_gate()
        """,
    ),
]

_V8_FLOOD: list[Statement] = [
    # The flood counter shared by every process on one PostgreSQL database
    # (storage/flood.py): one row per member who wrote in the last window, keyed by a
    # hash of (community, member) rather than the member's id. Rows expire (housekeeping
    # deletes windows that ended), a forget-me deletes the member's row, and a community
    # erasure finds it by `community_id`. No reference to `communities`: the count is
    # taken before anything else of a message is written, in one statement, and a
    # member's first message may come before the community's row exists. The index on
    # `window_start` alone serves the prune, which spans communities.
    """
    CREATE TABLE flood_windows (
        community_id TEXT NOT NULL,
        member_key TEXT NOT NULL,
        window_start TEXT NOT NULL,
        hits INTEGER NOT NULL,
        PRIMARY KEY (community_id, member_key)
    ) WITHOUT ROWID
    """,
    "CREATE INDEX flood_windows_by_start ON flood_windows (window_start)",
]

_V9_FLOOD_SLIDING: list[Statement] = [
    # The flood row keeps the window before the current one (storage/flood.py), so a
    # member cannot send the limit at the end of one window and again at the start of
    # the next. `last_hit` (the member's latest message) also serves the prune: a row
    # whose last message is a window old counts nothing any more. Rows from before this
    # step take their window's start as their last message (they live a minute).
    "ALTER TABLE flood_windows ADD COLUMN last_hit TEXT NOT NULL DEFAULT ''",
    "UPDATE flood_windows SET last_hit = window_start",
    "ALTER TABLE flood_windows ADD COLUMN previous_hits INTEGER NOT NULL DEFAULT 0",
    "ALTER TABLE flood_windows ADD COLUMN previous_first TEXT",
    "ALTER TABLE flood_windows ADD COLUMN previous_last TEXT",
    # When the member was last told to slow down, so one notice per window is given
    # across processes (storage/flood.py, `flood_warn`).
    "ALTER TABLE flood_windows ADD COLUMN warned_at TEXT",
    "DROP INDEX flood_windows_by_start",
    "CREATE INDEX flood_windows_by_last_hit ON flood_windows (last_hit)",
]

# ---- issue 22: forget journal keys (one block; renumber freely) ---------------------
_V10_FORGET_KEYS: list[Statement] = [
    # A finished forget-me clears `member_id`; `member_key` (a salt and the SHA-256 of
    # salt, community and member: storage/forgotten.py) lets a reply that was in flight
    # be refused when it lands, and a restore re-apply the forget-me. Requests from
    # before this step have none: they finished long before any reply now in flight.
    "ALTER TABLE forget_requests ADD COLUMN member_key TEXT",
]

_V11_MEMBER_SPEND: list[Statement] = [
    # What each member spent of their community's day, for the member share of the
    # spending limit (storage/spend.py, bot/budget.py): one row per community, local day
    # and member; `noticed` is set by the one process that told the member their share
    # is spent. Member data: a forget-me deletes the member's rows, housekeeping the
    # past days (the index on `day` serves that prune, which spans communities). No
    # reference to `communities`: a call's spend may be written before the community's
    # row, and erasing a community finds these rows by `community_id`.
    """
    CREATE TABLE member_spend (
        community_id TEXT NOT NULL,
        day TEXT NOT NULL,
        member_id TEXT NOT NULL,
        usd REAL NOT NULL,
        calls INTEGER NOT NULL,
        tokens INTEGER NOT NULL,
        noticed INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (community_id, day, member_id)
    ) WITHOUT ROWID
    """,
    "CREATE INDEX member_spend_by_day ON member_spend (day)",
]

# ---- issue 25: Slack feedback buttons on replies (one block; renumber freely) -------
_V12_REPLY_FEEDBACK: list[Statement] = [
    # A member's thumbs up / down on one of the bot's replies (storage/feedback.py): one
    # row per reply and member, the member known only by the hash of community and
    # member (storage/flood.py `member_key`), the latest press winning. Member data: a
    # forget-me deletes the member's rows by that hash, my-data lists them.
    """
    CREATE TABLE reply_feedback (
        community_id TEXT NOT NULL REFERENCES communities(id),
        reply_id TEXT NOT NULL,
        member_key TEXT NOT NULL,
        positive INTEGER NOT NULL CHECK (positive IN (0, 1)),
        pressed_at TEXT NOT NULL,
        PRIMARY KEY (community_id, reply_id, member_key)
    ) WITHOUT ROWID
    """,
]

# ---- issue 25: replies to other bots in a row (one block; renumber freely) -----------
_V13_BOT_EXCHANGES: list[Statement] = [
    # How many times in a row the bot answered other bots in a channel (storage/bots.py,
    # bot/bot_exchanges.py): a row per channel with a count, deleted when a person writes
    # there. Kept in the database so neither a restart nor a second process starts the
    # count again. No member data (bots and channels only); erasing a community finds
    # the rows by `community_id`. No reference to `communities`: a bot may speak before
    # the community's row exists.
    """
    CREATE TABLE bot_exchanges (
        community_id TEXT NOT NULL,
        channel_id TEXT NOT NULL,
        replies INTEGER NOT NULL,
        PRIMARY KEY (community_id, channel_id)
    ) WITHOUT ROWID
    """,
]

# ---- issue 25: deleted messages take their influence back (one block; renumber freely) --
_V14_MESSAGE_DELETIONS: list[Statement] = [
    # The platform's id of the message each interaction answered ("discord:<id>",
    # "slack:<channel>/<ts>"), so a deletion or an edit finds what was kept of it; NULL
    # for the terminal and for rows from before this step. The platform id is unique
    # on its platform, so the index is not led by the community (a DM's deletion event
    # does not say whose DM it was).
    "ALTER TABLE interactions ADD COLUMN message_ref TEXT",
    "CREATE INDEX interactions_by_message ON interactions (message_ref)",
    # The same for the conversation buffer's turns, so both turns of the exchange go.
    "ALTER TABLE conversation_turns ADD COLUMN message_ref TEXT",
    # The journal of deleted (and edited) messages (storage/deletion.py), written before
    # anything is deleted, finished on start after a crash. `message_key` is a salt and
    # the SHA-256 of salt, community and message id (storage/forgotten.py), so a reply
    # still being written is refused when it lands (`deleted_since`) while the row
    # names no message; `interaction_id` is cleared when it finishes. `label` is the
    # version's actor and what replaces the interaction id in past versions. A row that
    # found nothing to withdraw is finished at once and pruned after a day. No reference
    # to `communities`: a message may be deleted before its community has a row.
    """
    CREATE TABLE message_deletions (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        community_id TEXT NOT NULL,
        message_key TEXT NOT NULL,
        interaction_id TEXT,
        label TEXT NOT NULL,
        cause TEXT NOT NULL CHECK (cause IN ('deleted', 'edited')),
        version INTEGER,
        redacting INTEGER NOT NULL DEFAULT 0 CHECK (redacting IN (0, 1)),
        started_at TEXT NOT NULL,
        finished_at TEXT,
        CHECK (finished_at IS NULL OR interaction_id IS NULL)
    )
    """,
    "CREATE INDEX message_deletions_open ON message_deletions (community_id, finished_at)",
    "CREATE INDEX message_deletions_by_start ON message_deletions (community_id, started_at)",
    # A deletion finds its message's evidence step by interaction id.
    "CREATE INDEX evidence_log_by_interaction ON evidence_log (community_id, interaction_id)",
    # Past versions may also be redacted while a message deletion holds its own gate
    # (the message's summary, insight and interaction id leave them, as a forgotten
    # member's words do); the same columns stay fixed as under a forget-me's gate.
    Each(
        "DROP TRIGGER personality_versions_no_update",
        "",
    ),
    Each(
        """
        CREATE TRIGGER personality_versions_no_update
        BEFORE UPDATE ON personality_versions
        WHEN (NOT EXISTS (
            SELECT 1 FROM forget_requests
            WHERE community_id = OLD.community_id AND finished_at IS NULL AND redacting = 1
        ) AND NOT EXISTS (
            SELECT 1 FROM message_deletions
            WHERE community_id = OLD.community_id AND finished_at IS NULL AND redacting = 1
        )) OR NEW.community_id IS NOT OLD.community_id OR NEW.version IS NOT OLD.version
          OR NEW.cause IS NOT OLD.cause OR NEW.interaction_count IS NOT OLD.interaction_count
          OR NEW.created_at IS NOT OLD.created_at OR NEW.keyframe IS NOT OLD.keyframe
        BEGIN SELECT RAISE(ABORT, 'personality_versions is append-only'); END
        """,
        f"""
        CREATE OR REPLACE FUNCTION personality_versions_update_gate() RETURNS trigger
        LANGUAGE plpgsql AS $$
        BEGIN
            IF (NOT EXISTS (
                SELECT 1 FROM forget_requests
                WHERE community_id = OLD.community_id AND finished_at IS NULL
                  AND redacting = 1
            ) AND NOT EXISTS (
                SELECT 1 FROM message_deletions
                WHERE community_id = OLD.community_id AND finished_at IS NULL
                  AND redacting = 1
            )) OR NEW.community_id IS DISTINCT FROM OLD.community_id
              OR NEW.version IS DISTINCT FROM OLD.version
              OR NEW.cause IS DISTINCT FROM OLD.cause
              OR NEW.interaction_count IS DISTINCT FROM OLD.interaction_count
              OR NEW.created_at IS DISTINCT FROM OLD.created_at
              OR NEW.keyframe IS DISTINCT FROM OLD.keyframe
            THEN
                RAISE EXCEPTION {_APPEND_ONLY} {_INTEGRITY};
            END IF;
            RETURN NEW;
        END $$
        """,
    ),
]

# ---- issue 25: channel modes (one block; renumber freely) --------------------------
_V15_CHANNEL_MODES: list[Statement] = [
    # The mode of each channel a moderator set with `/sonality channel` (storage/channels.py):
    # mention, free or off; channels without a row follow SONALITY_CHANNEL_MODE. Who set
    # it is member data: my-data lists it, a forget-me replaces the id and name with the
    # pseudonym, erasing the community deletes the rows.
    """
    CREATE TABLE channel_modes (
        community_id TEXT NOT NULL REFERENCES communities(id),
        channel_id TEXT NOT NULL,
        channel_name TEXT NOT NULL DEFAULT '',
        mode TEXT NOT NULL CHECK (mode IN ('mention', 'free', 'off')),
        set_by_id TEXT NOT NULL,
        set_by_name TEXT NOT NULL DEFAULT '',
        set_at TEXT NOT NULL,
        PRIMARY KEY (community_id, channel_id)
    ) WITHOUT ROWID
    """,
]

_V16_ANSWERED_DELETIONS: list[Statement] = [
    # Whether a deletion took back a kept answer (so the journal file outside the
    # database lists it): only a row that did not is pruned. A pruned row of one that
    # did made every start match the file's entry against every kept message again.
    # Rows from before cannot tell, except those that replayed a version.
    "ALTER TABLE message_deletions ADD COLUMN answered INTEGER NOT NULL DEFAULT 0",
    "UPDATE message_deletions SET answered = 1 "
    "WHERE version IS NOT NULL OR interaction_id IS NOT NULL",
]

MIGRATIONS: list[list[Statement]] = [
    _V1,
    _V2,
    _V3,
    _V4,
    _V5_REMOVALS,
    _V6_EVIDENCE,
    _V7_FORGET,
    _V8_FLOOD,
    _V9_FLOOD_SLIDING,
    _V10_FORGET_KEYS,
    _V11_MEMBER_SPEND,
    _V12_REPLY_FEEDBACK,
    _V13_BOT_EXCHANGES,
    _V14_MESSAGE_DELETIONS,
    _V15_CHANNEL_MODES,
    _V16_ANSWERED_DELETIONS,
]
"""Index i holds the statements that take the schema from version i to i + 1."""

SCHEMA_VERSION = len(MIGRATIONS)


_PG_TYPES = [
    (
        re.compile(r"\bINTEGER PRIMARY KEY AUTOINCREMENT\b"),
        "BIGINT GENERATED BY DEFAULT AS IDENTITY PRIMARY KEY",
    ),
    (re.compile(r"\)\s*WITHOUT ROWID\s*$"), ")"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bBLOB\b"), "BYTEA"),
    (re.compile(r"\bTEXT\b"), 'TEXT COLLATE "C"'),
]


def postgres_ddl(statement: str) -> str:
    """A plain (SQLite-worded) statement as PostgreSQL runs it: only column types of
    CREATE TABLE / ADD COLUMN change, every other statement is taken as it is."""
    head = statement.lstrip().upper()
    if not (head.startswith("CREATE TABLE") or head.startswith("ALTER TABLE")):
        return statement
    text = statement.strip()
    for pattern, replacement in _PG_TYPES:
        text = pattern.sub(replacement, text)
    return text


def statement_for(statement: Statement, postgres: bool) -> str:
    """The text of `statement` for one engine ("" when that engine has nothing to do)."""
    if isinstance(statement, Each):
        return statement.postgresql if postgres else statement.sqlite
    return postgres_ddl(statement) if postgres else statement


def current_version(conn: Conn) -> int:
    row = fetchone(conn, "SELECT COALESCE(MAX(version), 0) FROM schema_migrations")
    return int(row[0]) if row else 0


_SCHEMA_TABLE = (
    "CREATE TABLE IF NOT EXISTS schema_migrations ("
    "version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL)"
)

MIGRATION_LOCK = 0x50_4E_41_4C_49_54_59  # any constant; "SONALITY"-ish
"""PostgreSQL advisory lock key held while one process migrates (others wait)."""


async def migrate(
    target: aiosqlite.Connection | Engine, migrations: list[list[Statement]] | None = None
) -> int:
    """Apply every migration the database lacks, one transaction each; returns the version.

    Safe to call on every start (a no-op when up to date) and from two processes at once:
    the version is re-read under the engine's lock before each step (SQLite's write
    lock; on PostgreSQL a session advisory lock, taken before each step's snapshot, so
    a process that waited sees the steps the other one applied).
    """
    steps = MIGRATIONS if migrations is None else migrations
    engine = SqliteEngine(target) if isinstance(target, aiosqlite.Connection) else target
    if isinstance(engine, SqliteEngine):
        return await run_on_sqlite_thread(engine.conn, lambda c: _migrate_sqlite(c, steps))
    return await engine.outside_transaction(lambda c: _migrate_postgres(c, steps))


def _too_new(version: int, known: int) -> SchemaTooNewError:
    return SchemaTooNewError(
        f"database schema is version {version} but this code knows only "
        f"{known}; upgrade the bot instead of downgrading the database"
    )


def _migrate_sqlite(raw: sqlite3.Connection, steps: list[list[Statement]]) -> int:
    execute(Conn(raw, SqliteEngine.dialect), _SCHEMA_TABLE)
    version = current_version(Conn(raw, SqliteEngine.dialect))
    if version > len(steps):
        raise _too_new(version, len(steps))
    while version < len(steps):
        version = write_transaction(raw, lambda c: _apply_next_step(c, steps))
    return version


def _migrate_postgres(conn: Conn, steps: list[list[Statement]]) -> int:
    """Runs on a pooled connection in autocommit mode (see `PostgresEngine`)."""
    import psycopg

    raw = conn.raw
    raw.read_only = False
    raw.isolation_level = psycopg.IsolationLevel.READ_COMMITTED
    execute(conn, "SELECT pg_advisory_lock(?)", (MIGRATION_LOCK,))
    try:
        with raw.transaction():
            execute(conn, postgres_ddl(_SCHEMA_TABLE))
        with raw.transaction():
            version = current_version(conn)
        if version > len(steps):
            raise _too_new(version, len(steps))
        while version < len(steps):
            with raw.transaction():
                version = _apply_next_step(conn, steps)
        return version
    finally:
        execute(conn, "SELECT pg_advisory_unlock(?)", (MIGRATION_LOCK,))


def _apply_next_step(conn: Conn, steps: list[list[Statement]]) -> int:
    """Apply the step after the database's current version (if any is left); returns it."""
    version = current_version(conn)
    if version < len(steps):
        for statement in steps[version]:
            text = statement_for(statement, conn.dialect.postgres)
            if text.strip():
                execute(conn, text)
        version += 1
        execute(
            conn,
            "INSERT INTO schema_migrations (version, applied_at) VALUES (?, ?)",
            (version, to_db_time(utcnow())),
        )
    return version
