"""`forget-user` names a member the community has seen, exactly (issue 22, findings 4
and 5): at the terminal by the name they spoke under, the rest of the line being the
reason; nobody, several, or a fragment of an id is refused and forgets nothing.
(Slack's mentions: test_forget_slack.py.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from adapters.terminal import COMMUNITY as TERMINAL
from bot.messages import User
from tests.fakes.anthropic_server import AnthropicFake
from tests.integration.conftest import A, command, say
from tests.integration.test_forget_acceptance import terminal

WORD = "saffronkayak63"


def rate(server: AnthropicFake) -> None:
    server.brain.ess_rule(
        contains=WORD,
        score=0.8,
        direction="supports",
        topics=["tidal_power"],
        novelty=0.8,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        summary=f"The sender cites the {WORD} tidal study.",
    )


async def test_forget_user_by_the_name_a_member_spoke_under(
    tmp_path: Path, llm: Any, anthropic_server: AnthropicFake
) -> None:
    rate(anthropic_server)
    async with terminal(tmp_path / "data", llm) as (runtime, lines):
        await lines("/as Bob", f"The {WORD} study favours tidal power.")
        await lines("/as Bobby", "Tidal power sounds nice.")
        await lines("/as Mo")
        db, store = runtime.db, runtime.db.community(TERMINAL.id)
        bobby = await db.member_rows(TERMINAL.id, "terminal-bobby")
        versions = await store.versions(limit=100)

        for typo in ("NoSuchPerson typo", "e typo", "bo typo", "terminal-bo typo"):
            [answer] = await lines(f"/sonality forget-user {typo}")
            assert "Nothing was forgotten" in answer, answer
        assert await store.versions(limit=100) == versions
        assert await db.member_interaction_ids(TERMINAL.id, "terminal-bob")

        [done] = await lines("/sonality forget-user Bob asked by email")
        assert "Forgotten, as member-" in done, done
        assert await db.member_interaction_ids(TERMINAL.id, "terminal-bob") == []
        assert await db.member_rows(TERMINAL.id, "terminal-bobby") == bobby
        [logged, *_] = await db.moderator_actions(TERMINAL.id)
        assert (logged.action, logged.reason, logged.args) == (
            "forget-user",
            "asked by email",
            "(member withheld)",
        )
        # Every audit payload is still JSON, so the views that read them still work.
        for event in await store.audit_events(limit=1000):
            assert json.loads(json.dumps(event.payload))
        [timeline] = await lines("/sonality timeline")
        assert "wrong" not in timeline.lower()
        [again] = await lines("/sonality forget-user Bob asked twice")
        assert "Nothing was forgotten" in again  # Bob is a pseudonym now


async def test_forget_user_refuses_a_name_several_members_use(runtime: Any) -> None:
    sam1, sam2 = User(id="u-sam-1", name="Sam"), User(id="u-sam-2", name="Sam")
    await say(runtime, "hello", user=sam1)
    await say(runtime, "hi there", user=sam2)
    versions = await runtime.db.community(A.id).versions(limit=100)

    refused = await command(runtime, "forget-user", "sam", "asked", "by", "email")
    assert not refused.ok and "Several members here are called sam" in refused.text
    assert "u-sam-1" in refused.text and "u-sam-2" in refused.text
    assert await runtime.db.community(A.id).versions(limit=100) == versions

    done = await command(runtime, "forget-user", "u-sam-2", "asked", "by", "email")
    assert done.ok and "Forgotten" in done.text
    assert await runtime.db.member_interaction_ids(A.id, "u-sam-2") == []
    assert await runtime.db.member_interaction_ids(A.id, "u-sam-1")


async def test_forget_me_of_a_member_with_nothing_kept_writes_no_version(runtime: Any) -> None:
    """Nor rebuilds the database file: any member may ask, again and again, and on
    SQLite a rebuild holds the connection every community uses."""
    statements: list[str] = []
    if not runtime.db.dialect.postgres:
        await runtime.db._conn.set_trace_callback(statements.append)
    await say(runtime, "hello", user=User(id="u-other", name="Other"))
    versions = await runtime.db.community(A.id).versions(limit=100)
    for _ in range(3):
        done = await command(
            runtime, "forget-me", "confirm", user=User(id="u-new", name="New"), moderator=False
        )
        assert done.ok and "Nothing to forget" in done.text
    assert await runtime.db.community(A.id).versions(limit=100) == versions
    assert "VACUUM" not in statements
    done = await command(
        runtime, "forget-me", "confirm", user=User(id="u-other", name="Other"), moderator=False
    )
    assert done.ok and "Forgotten" in done.text
    assert runtime.db.dialect.postgres or statements.count("VACUUM") == 1


async def test_the_picked_id_wins_over_a_display_name_that_takes_in_the_reason(
    runtime: Any,
) -> None:
    """Discord's member picker sends an id, then the reason. A member whose display name
    is that id and the reason's first word must not be forgotten in the picked one's place."""
    victim = User(id="123456789012345678", name="Vic")
    eve = User(id="876543210987654321", name="123456789012345678 asked")
    await say(runtime, "I think rent control is great.", user=victim)
    await say(runtime, "Hello everyone.", user=eve)
    eve_rows = await runtime.db.member_interaction_ids(A.id, eve.id)

    done = await command(runtime, "forget-user", victim.id, "asked by DM")
    assert done.ok and "Forgotten" in done.text
    assert await runtime.db.member_interaction_ids(A.id, victim.id) == []
    assert await runtime.db.member_interaction_ids(A.id, eve.id) == eve_rows
    [logged, *_] = await runtime.db.moderator_actions(A.id)
    assert logged.reason == "asked by DM"


async def test_a_line_whose_start_names_two_members_forgets_neither(runtime: Any) -> None:
    bob, bob_asked = User(id="u-bob", name="Bob"), User(id="u-bob-asked", name="Bob asked")
    await say(runtime, "hello", user=bob)
    await say(runtime, "hi there", user=bob_asked)
    versions = await runtime.db.community(A.id).versions(limit=100)

    refused = await command(runtime, "forget-user", "Bob", "asked", "by", "email")
    assert not refused.ok and "names several members" in refused.text, refused.text
    assert "Bob (u-bob)" in refused.text and "Bob asked (u-bob-asked)" in refused.text
    assert await runtime.db.community(A.id).versions(limit=100) == versions
    assert await runtime.db.member_interaction_ids(A.id, bob.id)
    assert await runtime.db.member_interaction_ids(A.id, bob_asked.id)


async def test_a_refused_line_leaves_no_part_of_a_name_in_the_moderator_log(runtime: Any) -> None:
    await say(runtime, "hello", user=User(id="u-jo", name="Jo Smith"))
    refused = await command(runtime, "forget-user", "Jo", "Smithe", "asked", "by", "email")
    assert not refused.ok and "Nothing was forgotten" in refused.text
    [logged, *_] = await runtime.db.moderator_actions(A.id)
    assert "Smith" not in logged.reason and logged.reason == "refused: no single member named"


async def test_a_moderators_words_that_name_the_member_are_redacted_too(runtime: Any) -> None:
    """A rollback's reason and a moderator's logged reason are free text: "undo Tom's
    trolling" names Tom by the name he spoke under, not by his id. After his forget-me
    they name his pseudonym; a name of two letters is left (it is in too many words)."""
    tom, mo = User(id="u-tom-7", name="Tom"), User(id="u-mod", name="Mo")
    await say(runtime, "hello from tom", user=tom)
    version = (await runtime.db.community(A.id).versions(limit=1))[0].version
    assert (await command(runtime, "rollback", str(version), "undo", "TOM's", "trolling")).ok
    done = await command(runtime, "forget-user", tom.id, "Tom asked by email", user=mo)
    assert done.ok and "Forgotten" in done.text
    history = await command(runtime, "history", "all", "50")
    assert "tom" not in history.text.lower(), history.text
    assert "undo member-" in history.text
    reasons = [a.reason for a in await runtime.db.moderator_actions(A.id)]
    reasons += [str(r) for (r,) in await runtime.db._fetchall("SELECT reason FROM forget_requests")]
    assert not [r for r in reasons if "tom" in r.lower()], reasons
