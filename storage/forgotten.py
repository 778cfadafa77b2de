"""Who was forgotten (and which messages were deleted), kept as salted hashes, and the
checks every write of a member's words makes against them.

Why a hash: a finished forget-me keeps no member id (the journal row's `member_id` is
cleared), yet two things must still recognise the member afterwards. A reply that was
being written while they confirmed forget-me must not be recorded when it lands
(`forgotten_since`), and a restored backup from before the forget-me must be forgotten
again (`bot.forget_journal`, which keeps the same keys in a file outside the database).
So the journal keeps `member_key`: a random salt and the SHA-256 of salt, community and
member. Anyone holding an id can test it against the key (that is what recognising
means), but the key names no one by itself, and the salt keeps one installation's keys
useless for another's.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import datetime

from storage.base import Conn, fetchall, to_db_time

#: The interactions whose deletion is under way in a community (journaled, not yet
#: erased): `?` is the community. A query of its own so it can stand in `NOT IN`.
BEING_DELETED = (
    "SELECT interaction_id FROM message_deletions WHERE community_id = ? "
    "AND finished_at IS NULL AND interaction_id IS NOT NULL"
)


def forget_key(community_id: str, member_id: str, salt: str | None = None) -> str:
    """``salt:digest`` for one member of one community (a new salt unless given)."""
    salt = secrets.token_hex(16) if salt is None else salt
    digest = hashlib.sha256(f"{salt}\x00{community_id}\x00{member_id}".encode()).hexdigest()
    return f"{salt}:{digest}"


def key_matches(key: str | None, community_id: str, member_id: str) -> bool:
    """Whether `key` (from `forget_key`) is this member's."""
    if not key or ":" not in key:
        return False
    salt = key.split(":", 1)[0]
    return hmac.compare_digest(forget_key(community_id, member_id, salt), key)


def forgotten_since(conn: Conn, community_id: str, member_id: str, since: datetime) -> bool:
    """Whether the member is being forgotten now, or ran a forget-me at or after
    `since` (when their message was asked): then nothing of that message is written.
    Usually no row qualifies, so this costs one indexed read on the write it guards."""
    rows = fetchall(
        conn,
        "SELECT member_id, member_key FROM forget_requests WHERE community_id = ? "
        "AND (finished_at IS NULL OR started_at >= ?)",
        (community_id, to_db_time(since)),
    )
    return any(
        (found is not None and str(found) == member_id)
        or key_matches(None if key is None else str(key), community_id, member_id)
        for found, key in rows
    )


def deleted_since(conn: Conn, community_id: str, message_ref: str, since: datetime) -> bool:
    """Whether the message `message_ref` was deleted (or edited) at or after `since`
    (when it was asked): then nothing of that answer is written. The journal keeps the
    message's id only as a salted key (`forget_key`), so the rows of the community
    since then are tested one by one; usually there are none."""
    if not message_ref:
        return False
    rows = fetchall(
        conn,
        "SELECT message_key FROM message_deletions WHERE community_id = ? AND started_at >= ?",
        (community_id, to_db_time(since)),
    )
    return any(key_matches(str(key), community_id, message_ref) for (key,) in rows)
