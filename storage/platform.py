"""Platform plumbing that must survive restarts: event dedup, app installations, OAuth state.

Generic on purpose (ids and JSON, no Slack/Discord imports) so `storage` stays free of
platform SDKs; the adapters translate their SDK objects to and from plain dicts.

- Event dedup: platforms redeliver events (Slack retries after 3 s without an ack); a
  redelivered message must not be answered twice, also not after a restart.
- Installations: multi-workspace Slack apps get one bot token per workspace via OAuth.
- OAuth state: the CSRF token of an install flow, valid once and only until it expires.

Installations hold bot tokens, which act for a whole workspace. With a secret key
(SONALITY_SECRET_KEY, given through `use_secret_key`) their JSON is stored encrypted
(Fernet: AES-128-CBC with an HMAC, so a wrong key or a changed row is detected rather
than decrypted to garbage), as ``fernet:<token>`` in ``data_json``. Rows written before a
key was set are plain JSON; `use_secret_key` encrypts them in place, once, on start.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from sonality.store import utcnow
from storage.base import Conn, SqlBase, execute, fetchall, from_json, to_db_time, to_json
from storage.models import IntegrityViolation, StorageError

if TYPE_CHECKING:
    from cryptography.fernet import Fernet


def _installation_key(
    enterprise_id: str | None, team_id: str | None, user_id: str | None, is_enterprise_install: bool
) -> tuple[str, str, str]:
    """Normalise like slack_sdk's stores: None -> "", and org-wide installs have no team."""
    team = "" if is_enterprise_install or team_id is None else team_id
    return enterprise_id or "", team, user_id or ""


def _installations_where(
    enterprise_id: str | None, team_id: str | None, user_id: str | None, is_enterprise_install: bool
) -> tuple[str, list[object]]:
    """The team's (or org's) rows; only `user_id`'s when one is given."""
    enterprise, team, user = _installation_key(
        enterprise_id, team_id, user_id, is_enterprise_install
    )
    where = " WHERE enterprise_id = ? AND team_id = ?"
    params: list[object] = [enterprise, team]
    if user_id is not None:
        where += " AND user_id = ?"
        params.append(user)
    return where, params


ENCRYPTED_PREFIX = "fernet:"
"""Marks an encrypted ``data_json``; plain JSON always starts with ``{``."""

#: The command in it runs on any Python 3 without the bot's environment: a Fernet key is
#: 32 random bytes in URL-safe base64, which is all `Fernet.generate_key()` makes.
KEY_COMMAND = (
    "python3 -c 'import base64, os; print(base64.urlsafe_b64encode(os.urandom(32)).decode())'"
)
KEY_HOWTO = f"make one with: {KEY_COMMAND}"


def make_cipher(key: str) -> Fernet:
    """A Fernet for SONALITY_SECRET_KEY, or a one-line `StorageError` if it is no key.

    `cryptography` is imported here, not at the top: its OpenSSL bindings stay resident
    (about 7 MB) and only a bot with Slack installations and a secret key uses them.
    """
    from cryptography.fernet import Fernet

    try:
        return Fernet(key.strip().encode("ascii"))
    except (ValueError, UnicodeEncodeError):
        raise StorageError(
            f"SONALITY_SECRET_KEY is not a valid key (32 url-safe base64 bytes); {KEY_HOWTO}"
        ) from None


def _wrong_key() -> StorageError:
    return StorageError(
        "SONALITY_SECRET_KEY does not decrypt the stored Slack installations: they were "
        "saved with another key (set that key again, or reinstall the app in each workspace)"
    )


def _seal(cipher: Fernet, payload: str) -> str:
    return ENCRYPTED_PREFIX + cipher.encrypt(payload.encode("utf-8")).decode("ascii")


class PlatformStore(SqlBase):
    # Set by `use_secret_key`; None: installations are stored and read as plain JSON.
    _cipher: Fernet | None = None

    # --- secret key --------------------------------------------------------------------

    async def use_secret_key(self, key: str) -> int:
        """Encrypt installations with `key` from now on; returns how many plain rows it
        encrypted on the way (the migration of files written before a key was set).

        Refuses (one-line `StorageError`) a malformed key, or a key that cannot decrypt
        rows already encrypted: a silently wrong key would make every workspace look
        uninstalled. The check and the re-encryption run in one transaction.
        """
        cipher = make_cipher(key)

        def work(conn: Conn) -> int:
            rows = [
                (int(r[0]), str(r[1]))
                for r in fetchall(conn, "SELECT id, data_json FROM installations")
            ]
            plain = [(i, d) for i, d in rows if not d.startswith(ENCRYPTED_PREFIX)]
            sealed = [d for _, d in rows if d.startswith(ENCRYPTED_PREFIX)]
            if sealed:
                from cryptography.fernet import InvalidToken  # loaded by make_cipher

                try:
                    cipher.decrypt(sealed[0][len(ENCRYPTED_PREFIX) :].encode("ascii"))
                except InvalidToken:
                    raise _wrong_key() from None
            for row_id, data in plain:
                execute(
                    conn,
                    "UPDATE installations SET data_json = ? WHERE id = ?",
                    (_seal(cipher, data), row_id),
                )
            return len(plain)

        encrypted = await self._run_write(work)
        self._cipher = cipher
        return encrypted

    def _open_installation(self, stored: str) -> Any:
        if not stored.startswith(ENCRYPTED_PREFIX):
            return from_json(stored)
        if self._cipher is None:
            raise StorageError(
                "the stored Slack installations are encrypted: set SONALITY_SECRET_KEY "
                "to the key they were saved with"
            )
        from cryptography.fernet import InvalidToken  # loaded by make_cipher

        try:
            raw = self._cipher.decrypt(stored[len(ENCRYPTED_PREFIX) :].encode("ascii"))
        except InvalidToken:
            raise _wrong_key() from None
        return from_json(raw.decode("utf-8"))

    # --- event dedup -------------------------------------------------------------------

    async def mark_event_seen(
        self, platform: str, event_id: str, at: datetime, ttl_seconds: float
    ) -> bool:
        """True the first time (platform, event_id) is seen within its TTL, else False.

        Atomic (an INSERT ... ON CONFLICT DO NOTHING in one transaction), so two
        concurrent deliveries of the same event get exactly one True. Expired rows are
        pruned on the way, which is also what lets an id be seen "for the first time"
        again after its TTL.
        """
        if ttl_seconds <= 0:
            raise StorageError("ttl_seconds must be positive")
        now = to_db_time(at)
        expires = to_db_time(at + timedelta(seconds=ttl_seconds))

        def work(conn: Conn) -> int:
            execute(conn, "DELETE FROM seen_events WHERE expires_at <= ?", (now,))
            return execute(
                conn,
                "INSERT INTO seen_events (platform, event_id, seen_at, expires_at) "
                "VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                (platform, event_id, now, expires),
            )

        return await self._run_write(work, scope=f"event:{platform}:{event_id}") == 1

    # --- installations -----------------------------------------------------------------

    async def save_installation(self, key: Mapping[str, Any], data: Mapping[str, Any]) -> None:
        """Store an installation (replacing the one with the same enterprise/team/user).

        `key` holds enterprise_id, team_id, user_id, is_enterprise_install (missing keys
        count as None/False). `data` must be JSON-serialisable; datetimes are stored (and
        come back) as ISO-8601 strings, which slack_sdk's `Installation(**data)` accepts.
        The replaced row is deleted and a new one inserted, so "latest" is simply the
        highest row id.
        """
        is_enterprise = bool(key.get("is_enterprise_install", False))
        enterprise, team, user = _installation_key(
            key.get("enterprise_id"), key.get("team_id"), key.get("user_id"), is_enterprise
        )
        payload = to_json(dict(data))
        if self._cipher is not None:
            payload = _seal(self._cipher, payload)
        installed_at = to_db_time(utcnow())

        def work(conn: Conn) -> None:
            execute(
                conn,
                "DELETE FROM installations WHERE enterprise_id = ? AND team_id = ? AND user_id = ?",
                (enterprise, team, user),
            )
            execute(
                conn,
                "INSERT INTO installations (enterprise_id, team_id, user_id, "
                "is_enterprise_install, data_json, installed_at) VALUES (?, ?, ?, ?, ?, ?)",
                (enterprise, team, user, int(is_enterprise), payload, installed_at),
            )

        await self._run_write(work)

    async def find_installation(
        self,
        enterprise_id: str | None,
        team_id: str | None,
        user_id: str | None = None,
        is_enterprise_install: bool = False,
    ) -> dict[str, Any] | None:
        """The latest installation's data for a team (or org), or None.

        Without `user_id`: the newest installation by anyone in that team, i.e. the
        current bot installation. With `user_id`: that user's own installation.
        """
        where, params = _installations_where(enterprise_id, team_id, user_id, is_enterprise_install)
        row = await self._fetchone(
            "SELECT data_json FROM installations" + where + " ORDER BY id DESC LIMIT 1", params
        )
        if row is None:
            return None
        data = self._open_installation(str(row[0]))
        return dict(data) if isinstance(data, dict) else None

    async def delete_installation(
        self,
        enterprise_id: str | None,
        team_id: str | None,
        user_id: str | None = None,
        is_enterprise_install: bool = False,
    ) -> int:
        """Delete a team's installations (all users, or only `user_id`'s); returns rows removed."""
        where, params = _installations_where(enterprise_id, team_id, user_id, is_enterprise_install)
        return await self._run_write(
            lambda conn: execute(conn, "DELETE FROM installations" + where, params)
        )

    # --- OAuth state -------------------------------------------------------------------

    async def issue_oauth_state(self, state: str, expires_at: datetime) -> None:
        """Remember a freshly generated OAuth state until `expires_at`."""
        params = (state, to_db_time(expires_at))

        def work(conn: Conn) -> None:
            try:
                execute(conn, "INSERT INTO oauth_states (state, expires_at) VALUES (?, ?)", params)
            except IntegrityViolation as exc:
                raise StorageError("this OAuth state was already issued") from exc

        await self._run_write(work)

    async def consume_oauth_state(self, state: str, now: datetime) -> bool:
        """True exactly once for an issued, unexpired state; it is deleted either way.

        A DELETE's row count decides, so two concurrent callbacks can't both succeed.
        """
        stamp = to_db_time(now)

        def work(conn: Conn) -> int:
            consumed = execute(
                conn,
                "DELETE FROM oauth_states WHERE state = ? AND expires_at > ?",
                (state, stamp),
            )
            execute(conn, "DELETE FROM oauth_states WHERE expires_at <= ?", (stamp,))
            return consumed

        return await self._run_write(work) == 1
