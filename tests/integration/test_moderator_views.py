"""What moderators read: history that folds plain chat, diffs that show only changes,
a reflect that costs nothing when there is nothing to reflect on, words not codes."""

from __future__ import annotations

from tests.integration.conftest import A, chat_requests, command, say
from tests.integration.test_isolation_and_commands import CANARY, CANARY_TEXT, teach_canary


async def test_history_shows_what_changed_and_folds_plain_chat(runtime, llm_server):
    llm_server.brain.ess_rule(**CANARY)
    await teach_canary(runtime)  # v1 argument (staged), v2-v3 chat, v4 commits
    await say(runtime, "nice weather today")  # v5: chat

    history = await command(runtime, "history", moderator=False)
    lines = history.text.splitlines()
    assert lines[0] == "   … 1 chat message (v5): no opinion or narrative changed"
    assert lines[1].startswith("v4 ") and "committed canary_zebra_crossings" in lines[1]
    assert lines[2] == "   … 2 chat messages (v2–v3): no opinion or narrative changed"
    # The argument that staged the move is a line of its own, never folded as chat.
    assert lines[3].startswith("v1 ") and "staged canary_zebra_crossings" in lines[3]
    assert lines[4].startswith("v0 ") and len(lines) == 5

    everything = await command(runtime, "history", "all", moderator=False)
    assert [line.split()[0] for line in everything.text.splitlines()] == [
        f"v{n}" for n in range(5, -1, -1)
    ]
    short = await command(runtime, "history", "1", moderator=False)
    assert short.text.splitlines()[1].startswith("v4 ")
    assert not any(line.startswith("v0 ") for line in short.text.splitlines())


async def test_diff_shows_only_what_changed_including_updates_still_cooling(runtime, llm_server):
    llm_server.brain.ess_rule(**CANARY)
    await teach_canary(runtime)

    staged = await command(runtime, "diff", "0", "1", moderator=False)
    assert staged.text.splitlines() == [
        "Interactions: 0 → 1",
        "Pending insights: 0 → 1",
        "Still cooling in the newer version:",
        "  canary_zebra_crossings +0.038, commits at interaction 4",
    ]
    committed = await command(runtime, "diff", "3", "4", moderator=False)
    assert "Beliefs: 0 → 1" in committed.text
    assert "+ canary_zebra_crossings: +0.038" in committed.text
    assert "Still cooling in the newer version: nothing" in committed.text
    assert "Narrative" not in committed.text and "unchanged" not in committed.text
    same = await command(runtime, "diff", "4", "4", moderator=False)
    assert same.text == "No differences."


async def test_reflect_with_nothing_to_reflect_on_costs_nothing(runtime, llm_server):
    await say(runtime, "hello")
    first = await command(runtime, "reflect")
    assert first.ok and first.text.startswith("Reflected")
    agent = runtime.registry.get(A.id)
    version, requests = agent.sponge.version, len(llm_server.requests)

    again = await command(runtime, "reflect")
    assert again.ok and again.text.startswith("Nothing to reflect on")
    assert len(llm_server.requests) == requests and agent.sponge.version == version


async def test_the_status_line_names_the_topic_in_words(runtime, llm_server):
    llm_server.brain.ess_rule(**CANARY)
    await say(runtime, CANARY_TEXT)
    line = runtime.learning_status(A.id)
    assert line.startswith("ESS 0.85, evidence with data, for canary_zebra_crossings · v1")
    assert "empirical_data" not in line
    status = await command(runtime, "status", moderator=False)
    assert "Last message: ESS 0.85, evidence with data, for canary_zebra_crossings" in status.text
    assert chat_requests(llm_server)  # the message really went through the model
