"""Reaching PostgreSQL (``DATABASE_URL``): the pool, and messages that never show a password.

Why psycopg 3 with its own pool and not an async driver: every storage operation is
already one synchronous function run in one thread hop (see `storage.base`), so a
synchronous connection borrowed for that one call costs exactly what the SQLite
engine's worker thread costs, and the same storage code serves both engines. The pool
keeps `POOL_SIZE` connections open; at most that many transactions run at once, each in
a thread of the engine's own executor (so a burst of database work cannot take every
thread of the event loop's default executor, which embedding and Chroma use).
"""

from __future__ import annotations

import re
from typing import Any

from storage.base import PostgresEngine, first_line
from storage.models import StorageError

POOL_SIZE = 8
"""Connections (and threads) per process: enough to overlap the slow network round trips
of a remote server, few enough that a dozen processes stay well under PostgreSQL's
default max_connections of 100."""

CONNECT_TIMEOUT_S = 10


def is_postgres_url(url: str | None) -> bool:
    return bool(url) and str(url).split("://", 1)[0] in ("postgresql", "postgres")


def describe_url(url: str) -> str:
    """``host:port/database`` of a connection URL, for messages and logs (no user, no
    password)."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        parts = conninfo_to_dict(url)
    except Exception:  # a malformed URL: name nothing from it
        return "(an unreadable DATABASE_URL)"
    host = str(parts.get("host") or "localhost")
    port = str(parts.get("port") or "5432")
    name = str(parts.get("dbname") or parts.get("user") or "")
    return f"{host}:{port}/{name}"


def _scrub(text: str, url: str) -> str:
    """`text` with the URL's password (if any) blanked out, whatever the driver put in it."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        password = conninfo_to_dict(url).get("password")
    except Exception:
        password = None
    if password:
        text = text.replace(str(password), "***")
    return re.sub(r"(postgres(?:ql)?://[^:/@\s]*:)[^@\s]*@", r"\1***@", text)


def connect_error(url: str, exc: BaseException) -> StorageError:
    where = describe_url(url)
    return StorageError(
        f"cannot reach PostgreSQL at {where} ({_scrub(first_line(exc), url)}); check that "
        "the server runs and DATABASE_URL's host, port, user and database are right"
    )


def check_postgres(url: str) -> int:
    """Connect once and return the schema version found (0: an empty database).

    The start-up check: it only reads, so nothing is created on a server the operator
    pointed at by mistake. Raises `StorageError` with a one-line reason.
    """
    import psycopg

    try:
        with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True) as conn:
            found = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
            if not found or not found[0]:
                return 0
            row = conn.execute("SELECT COALESCE(MAX(version), 0) FROM schema_migrations").fetchone()
            return int(row[0]) if row else 0
    except psycopg.Error as exc:
        raise connect_error(url, exc) from None


def open_postgres(url: str, pool_size: int = POOL_SIZE) -> PostgresEngine:
    """A started pool for `url`; blocking (call it in a thread). One direct connection is
    made first, so an unreachable server fails here with the driver's own reason rather
    than as a pool timeout."""
    import psycopg
    from psycopg_pool import ConnectionPool

    try:
        psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S).close()
    except psycopg.Error as exc:
        raise connect_error(url, exc) from None
    kwargs: dict[str, Any] = {"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_S}
    pool = ConnectionPool(
        url,
        min_size=1,
        max_size=max(1, pool_size),
        kwargs=kwargs,
        open=False,
        name="sonality",
        # No `check`: `PostgresEngine._answering` tests each borrowed connection itself
        # (one empty round trip), and after a server restart clears every dead one at once.
    )
    try:
        pool.open(wait=True, timeout=CONNECT_TIMEOUT_S)
    except Exception as exc:
        pool.close()
        raise connect_error(url, exc) from None
    return PostgresEngine(pool, describe_url(url), max(1, pool_size))
