"""Session-wide fixtures shared by several test packages (the test PostgreSQL server)."""

from tests.pg import postgres_server

__all__ = ["postgres_server"]
