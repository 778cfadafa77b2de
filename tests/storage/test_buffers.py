"""Conversation buffers: bounded by turns, characters and age; pairs kept whole."""

from __future__ import annotations

from storage import Database
from storage.buffers import MAX_EXCHANGES_PER_USER

from .conftest import at

C = "discord:1"


async def _talk(
    db: Database,
    n: int,
    user: str = "u1",
    size: int = 1,
    keep_exchanges: int = MAX_EXCHANGES_PER_USER,
) -> None:
    for i in range(n):
        await db.append_exchange(
            C, user, f"q{i}" * size, f"a{i}" * size, at(i), keep_exchanges=keep_exchanges
        )


async def test_turns_come_back_oldest_first_as_pairs(db: Database) -> None:
    await _talk(db, 3)
    assert await db.recent_turns(C, "u1", max_turns=100, max_chars=10_000) == [
        ("user", "q0"), ("assistant", "a0"),
        ("user", "q1"), ("assistant", "a1"),
        ("user", "q2"), ("assistant", "a2"),
    ]  # fmt: skip


async def test_bounded_by_turn_count_in_whole_pairs(db: Database) -> None:
    await _talk(db, 5)
    four = await db.recent_turns(C, "u1", max_turns=4, max_chars=10_000)
    assert [c for _, c in four] == ["q3", "a3", "q4", "a4"]
    five = await db.recent_turns(C, "u1", max_turns=5, max_chars=10_000)
    assert five == four  # an odd limit never yields half a pair
    assert await db.recent_turns(C, "u1", max_turns=1, max_chars=10_000) == []


async def test_bounded_by_characters_without_gaps(db: Database) -> None:
    # exchanges of 20, 20, 200, 20 characters (oldest first)
    await db.append_exchange(C, "u1", "x" * 10, "y" * 10, at(0))
    await db.append_exchange(C, "u1", "x" * 10, "y" * 10, at(1))
    await db.append_exchange(C, "u1", "big" + "x" * 97, "y" * 100, at(2))
    await db.append_exchange(C, "u1", "new" + "x" * 7, "y" * 10, at(3))
    turns = await db.recent_turns(C, "u1", max_turns=100, max_chars=100)
    # Only the newest fits; the older small ones are NOT used to fill up (no gaps).
    assert [c[:3] for _, c in turns] == ["new", "yyy"]
    assert sum(len(c) for _, c in turns) <= 100
    assert len(await db.recent_turns(C, "u1", max_turns=100, max_chars=239)) == 4
    assert len(await db.recent_turns(C, "u1", max_turns=100, max_chars=240)) == 6
    assert await db.recent_turns(C, "u1", max_turns=100, max_chars=19) == []


async def test_old_turns_ignored_and_pruned(db: Database) -> None:
    await _talk(db, 4)  # at minutes 0..3
    fresh = await db.recent_turns(C, "u1", 100, 10_000, not_older_than=at(2))
    assert [c for _, c in fresh] == ["q2", "a2", "q3", "a3"]
    assert await db.prune_turns(older_than=at(1)) == 2  # one exchange = two rows
    assert [c for _, c in await db.recent_turns(C, "u1", 100, 10_000)][:2] == ["q1", "a1"]


async def test_rows_per_user_capped_on_append(db: Database) -> None:
    await _talk(db, 7, keep_exchanges=3)
    await _talk(db, 2, user="u2", keep_exchanges=3)
    row = await db._fetchone(
        "SELECT COUNT(*) FROM conversation_turns WHERE community_id = ? AND user_id = 'u1'", (C,)
    )
    assert row == (6,)
    kept = await db.recent_turns(C, "u1", 100, 10_000)
    assert [c for _, c in kept] == ["q4", "a4", "q5", "a5", "q6", "a6"]
    assert len(await db.recent_turns(C, "u2", 100, 10_000)) == 4


async def test_users_have_separate_buffers(db: Database) -> None:
    await db.append_exchange(C, "u1", "mine", "ok", at(0))
    assert await db.recent_turns(C, "u2", 100, 10_000) == []


async def test_a_stepped_window_keeps_its_start_for_several_messages(db: Database) -> None:
    """With 6 pairs and steps of 3, the oldest kept exchange changes every 3 messages,
    so the same earlier turns open the prompt (and stay cached) meanwhile."""
    starts = []
    for n in range(1, 13):
        await db.append_exchange(C, "u1", f"q{n}", f"a{n}", at(n))
        turns = await db.recent_turns(C, "u1", max_turns=12, max_chars=10_000, step_pairs=3)
        assert 4 <= len(turns) // 2 <= 6 or n < 4
        assert turns[-2:] == [("user", f"q{n}"), ("assistant", f"a{n}")]
        starts.append(turns[0][1])
    assert starts == ["q1"] * 6 + ["q4"] * 3 + ["q7"] * 3
