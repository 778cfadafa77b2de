"""Memories across two real bot processes on one PostgreSQL and one Chroma server.

The stack of test_multi_process.py (`python -m app` twice, Slack in HTTP mode, the
test posting each event to one process or the other). What is checked here is Chroma's
side: every learned message's episode written once, and the consolidated insights
(the ``-semantic`` collection) that one process writes recalled and forgotten through
the other. (A member forgotten through one process and no longer recalled from the
other's write-behind queue: test_multi_process.py, next to the test of that queue.)
"""

from __future__ import annotations

from functools import partial

from storage import Database
from tests.chroma_server import ChromaServer, chroma_server  # noqa: F401 (fixture)
from tests.integration.test_multi_process import (  # noqa: F401 (fixture "two_bots")
    COMMUNITY,
    BotProcess,
    TwoBotStack,
    chroma_documents,
    learned_ids,
    memories_in,
    outbox_messages,
    reply_request,
    two_bots,
    until_learned,
)
from tests.slack.conftest import (  # noqa: F401 (fixtures "fake", "http")
    fake_slack,
    http_session,
)

#: What a failed Chroma batch logged before the fix (issue 22, finding 13).
DUPLICATE_SIGNS = ("DuplicateID", "Expected IDs to be unique")
SORRY = "Sorry, something went wrong"


def logged(bot: BotProcess) -> list[str]:
    return [*bot.out.lines, *bot.err.lines]


async def test_messages_alternating_between_processes_are_each_learned_and_stored_once(
    two_bots: TwoBotStack,  # noqa: F811
) -> None:
    """Issue 22, finding 13: each process adopted the other's pending episodes again
    whenever it learned, so its write-behind queue held one episode twice; Chroma
    refused the whole batch (DuplicateIDError), the batch stayed at the head of the
    queue, every later write and every reflection inside learning failed, and messages
    were parked after three attempts. A reflection every 4 messages and the default
    10 s flush delay (episodes wait in both queues) make that happen in a dozen
    messages; the last two are left for the moderator's reflection."""
    every = {"SONALITY_REFLECTION_EVERY": "4"}
    a = await two_bots.start("a", **every)
    b = await two_bots.start("b", **every)
    count = 14
    for i in range(count):
        ts = await two_bots.mention(a if i % 2 == 0 else b, f"<@UBOT> message number {i}")
        await two_bots.answered(ts)
    db = await Database.open_url(two_bots.database_url)
    try:
        await until_learned(db)
        reflected = await two_bots.command(b, "reflect", user="UADMIN")
        assert SORRY not in reflected["text"] and "Reflected" in reflected["text"], reflected
        recorded = await outbox_messages(db)
        assert len(recorded) == count
        statuses = await db._fetchall(
            "SELECT status, COUNT(*) FROM interactions WHERE community_id = ? GROUP BY status",
            (COMMUNITY,),
        )
        assert [tuple(r) for r in statuses] == [("done", count)]
        # One evidence row and one version per message, in order, whoever learned it.
        assert await learned_ids(db) == [i for i, _ in recorded]
        versions = await db.community(COMMUNITY).versions(limit=100)
        learned = sorted(v.interaction_count for v in versions if v.cause == "interaction")
        assert learned == list(range(1, count + 1))
        assert [v.cause for v in versions].count("reflection") >= 1
    finally:
        await db.close()
    assert await two_bots.stop() == [0, 0], [logged(bot)[-10:] for bot in two_bots.bots]
    for bot in two_bots.bots:
        bad = [line for line in logged(bot) if any(s in line for s in DUPLICATE_SIGNS)]
        assert bad == [], bad[:3]
    # Every message's episode reached Chroma, and nothing waits in the outbox.
    stored = chroma_documents(two_bots)
    assert {i for i, _ in recorded} <= set(stored), sorted(set(stored))
    db = await Database.open_url(two_bots.database_url)
    try:
        assert await db.community(COMMUNITY).pending_episodes() == []
    finally:
        await db.close()


def insight_text(token: str) -> str:
    return f"I weigh the {token} measurements on their own merits."


def insight_stored(stack: TwoBotStack, token: str) -> bool:
    return insight_text(token) in chroma_documents(stack).values()


async def warm_up(stack: TwoBotStack, db: Database, team: str) -> None:
    """Both processes load the workspace, with no insight collection yet."""
    for n, bot in enumerate(stack.bots):
        await stack.answered(await stack.mention(bot, f"<@UBOT> hello number {n}", team=team))
    await until_learned(db, community=f"slack:{team}")


async def recalled_through(
    stack: TwoBotStack, bot: BotProcess, team: str, token: str, n: int
) -> str:
    """Ask `bot` about `token` (as a member who never argued it); the memories its reply
    request carried."""
    said = f"how do you weigh {token} measurements, question {n}?"
    await stack.answered(await stack.mention(bot, f"<@UBOT> {said}", team=team, user="U9"))
    return memories_in(reply_request(stack.anthropic, said))


async def test_insights_written_by_one_process_are_recalled_and_forgotten_through_the_other(
    two_bots: TwoBotStack,  # noqa: F811
) -> None:
    """Issue 22, finding 14: a process checked once, when it loaded a community, whether
    its insight collection existed; the other process creating it later stayed unseen,
    so its insights were never recalled there and a forget-me handled there left them
    in Chroma. In workspace T1 process a writes the insight and b must recall and forget
    it; in T2 the other way round."""
    stack = two_bots
    quick = {"SONALITY_EPISODE_FLUSH_SECONDS": "0.5"}  # insights reach Chroma at once
    a = await stack.start("a", **quick)
    b = await stack.start("b", **quick)
    rounds = [("T1", a, b, "zorblat", "U1"), ("T2", b, a, "quintaric", "U2")]
    for _, _, _, token, _ in rounds:
        stack.anthropic.brain.ess_rule(
            contains=f"{token} tide-gauge study",
            score=0.8,
            reasoning_type="empirical_data",
            topics=["sea_level"],
            direction="supports",
            summary=f"The sender cites the {token} tide-gauge study on sea level.",
        )
        # The reply to the argument, and the insight drawn from it (words that neither
        # the episode's summary nor the insight repeats, so reflection is not matched).
        stack.anthropic.brain.reply_rule(
            contains=f"{token} tide-gauge study shows", text=insight_text(token)
        )
    db = await Database.open_url(stack.database_url)
    try:
        for team, writer, other, token, member in rounds:
            community = f"slack:{team}"
            await warm_up(stack, db, team)
            said = f"<@UBOT> the {token} tide-gauge study shows seas rising"
            await stack.answered(await stack.mention(writer, said, team=team, user=member))
            await until_learned(db, community=community)
            done = await stack.command(writer, "reflect", user="UADMIN", team=team)
            assert "Reflected" in done["text"], done
            await stack.slack.wait_for(
                partial(insight_stored, stack, token),
                what=f"the {token} insight in Chroma",
                within=60,
            )
            # Recalled through both processes: the one that wrote it, and the other.
            for n, bot in enumerate((other, writer)):
                memories = await recalled_through(stack, bot, team, token, n)
                assert insight_text(token) in memories, (bot.port, memories)

            # The member forgets themselves through the process that did not write it.
            done = await stack.command(other, "forget-me confirm", user=member, team=team)
            assert "forgot" in done["text"].lower(), done
            kept = chroma_documents(stack)
            assert not any(token in d for d in kept.values() if "tide-gauge" in d), kept
            assert not any(insight_text(token) in d for d in kept.values()), kept
            for n, bot in enumerate((writer, other), start=2):
                memories = await recalled_through(stack, bot, team, token, n)
                assert insight_text(token) not in memories, (bot.port, memories)
    finally:
        await db.close()
    assert await stack.stop() == [0, 0], [logged(bot)[-10:] for bot in stack.bots]
    # Nothing either process still held brought them back as it stopped.
    stored = chroma_documents(stack).values()
    assert not any(insight_text(token) in d for *_, token, _ in rounds for d in stored)
