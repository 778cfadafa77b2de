"""Session-wide fixtures shared by several test packages (the test PostgreSQL server).

DATABASE_URL is a common variable in developers' shells; the tests must never write to
whatever database it names, so it is removed for the whole run. Tests that want
PostgreSQL get the session's own server (`postgres_server`, tests/pg.py).

The bot runs in the test processes, so they need the glibc settings it starts itself
under (sonality/memory/freed_memory.py); scripts/test.py passes them. Started another
way, the run says in its header that files are scanned without them.
"""

import os

from sonality.memory.freed_memory import runs_scrubbed
from tests.pg import postgres_server

os.environ.pop("DATABASE_URL", None)

__all__ = ["postgres_server"]


def pytest_report_header() -> str | None:
    if runs_scrubbed(os.environ):
        return None
    return (
        "freed memory is not fully scrubbed: start the tests with python3 scripts/test.py "
        "(GLIBC_TUNABLES), or forget-me and picture tests may find heap garbage in files"
    )
