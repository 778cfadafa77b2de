"""Session-wide fixtures shared by several test packages (the test PostgreSQL server).

DATABASE_URL is a common variable in developers' shells; the tests must never write to
whatever database it names, so it is removed for the whole run. Tests that want
PostgreSQL get the session's own server (`postgres_server`, tests/pg.py).
"""

import os

from tests.pg import postgres_server

os.environ.pop("DATABASE_URL", None)

__all__ = ["postgres_server"]
