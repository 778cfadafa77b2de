"""Command numbers a member can type, through the real runtime and real SQLite.

SQLite stores integers up to 2^63 - 1; a larger one made the binding raise
OverflowError, which reached the member as the internal-error apology. Each answer
here must be the short, private usage answer instead, and nothing may change.
"""

from __future__ import annotations

import pytest

from bot.messages import INTERNAL_ERROR
from bot.runtime import Runtime
from tests.integration.conftest import A, command, say

TOO_BIG = str(2**63)  # one past SQLite's largest integer
HUGE = "9" * 400
ENDLESS = "9" * 5000  # past Python's 4,300-digit limit for int()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        pytest.param(("rollback", TOO_BIG), f"There is no version {TOO_BIG}.", id="rollback-2^63"),
        pytest.param(
            ("rollback", HUGE), f"There is no version {HUGE[:23]}…", id="rollback-400-digits"
        ),
        pytest.param(("snapshot", TOO_BIG), "There is no version", id="snapshot-2^63"),
        pytest.param(("snapshot", f"v{HUGE}"), "There is no version", id="snapshot-v-prefixed"),
        pytest.param(("diff", "0", TOO_BIG), "There is no version", id="diff-0-2^63"),
        pytest.param(("diff", TOO_BIG, "0"), "There is no version", id="diff-2^63-0"),
        pytest.param(("rollback", ENDLESS), "is not a valid version", id="rollback-5000-digits"),
        pytest.param(("snapshot", "-1"), "The version must be at least 0", id="snapshot-negative"),
        pytest.param(("usage", TOO_BIG), "between 1 and 90", id="usage-days-2^63"),
        pytest.param(("history", TOO_BIG), "between 1 and 50", id="history-count-2^63"),
    ],
)
async def test_a_huge_number_is_a_short_private_answer(
    runtime: Runtime, args: tuple[str, ...], expected: str
) -> None:
    await say(runtime, "hello")  # a community with versions 0 and 1
    store = runtime.db.community(A.id)
    before = await store.latest_version()

    result = await command(runtime, *args)

    assert not result.ok and result.private
    assert result.text != INTERNAL_ERROR
    assert expected in result.text
    assert len(result.text) < 120, "a pasted wall of digits is not echoed back"
    assert await store.latest_version() == before


async def test_the_largest_storable_number_is_looked_up_and_not_found(runtime: Runtime) -> None:
    """2^63 - 1 itself still reaches storage, which simply has no such version."""
    await say(runtime, "hello")
    largest = str(2**63 - 1)
    for args in (("rollback", largest), ("snapshot", largest), ("diff", "0", largest)):
        result = await command(runtime, *args)
        assert not result.ok and result.text != INTERNAL_ERROR, args
        assert f"no version {largest}" in result.text, result.text
