"""`/sonality timeline` asked while a forget-me or a message deletion is under way.

Both commit their version first and erase after it, and the erase adds no version. A
picture made in between still names the member (their audit rows and messages are not
erased yet); it must not be the answer once the forget-me or deletion has finished,
although the version range is the same: the answer is made again, without the name.
"""

from __future__ import annotations

from typing import Any

import pytest

import bot.timeline as tl
from bot.messages import IncomingMessage, User
from bot.runtime import Runtime
from bot.timeline import Timeline
from tests.fakes.anthropic_server import AnthropicFake
from tests.integration.conftest import command, say
from tests.integration.timeline_scenario import COMMUNITY, MARIA, SAM, play

LENA = User(id="u-lena", name="Lena")


def spy_builds(monkeypatch: pytest.MonkeyPatch) -> list[Timeline]:
    """Every timeline made from the stored history, in order."""
    built: list[Timeline] = []
    real_build = tl._build

    async def spy(db: Any, job: Any, offload: Any) -> Timeline:
        timeline = await real_build(db, job, offload)
        built.append(timeline)
        return timeline

    monkeypatch.setattr(tl, "_build", spy)
    return built


def names(timeline: Timeline) -> set[str]:
    return {m.name for m in timeline.members}


async def test_a_timeline_made_mid_forget_is_not_served_after_it(
    runtime: Runtime, anthropic_server: AnthropicFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    await play(runtime, anthropic_server.brain)
    built = spy_builds(monkeypatch)
    real_erase = runtime.db.erase_member
    mid: list[Any] = []

    async def erase(request: Any, words: Any, at: Any) -> int:
        # Another member asks between the forget-me's version and its erase.
        mid.append(await command(runtime, "timeline", community=COMMUNITY, moderator=False))
        return await real_erase(request, words, at)

    monkeypatch.setattr(runtime.db, "erase_member", erase)
    done = await command(
        runtime, "forget-me", "confirm", community=COMMUNITY, user=MARIA, moderator=False
    )
    assert done.ok and "Forgotten" in done.text, done.text
    monkeypatch.setattr(runtime.db, "erase_member", real_erase)
    assert len(mid) == 1 and len(built) == 1
    assert "Maria" in names(built[0])  # the interleaving happened

    after = await command(runtime, "timeline", community=COMMUNITY, moderator=False)
    assert after.ok and after is not mid[0]
    assert len(built) == 2
    assert (built[1].first_version, built[1].last_version) == (
        built[0].first_version,
        built[0].last_version,
    )
    assert "Maria" not in names(built[1])
    assert "Maria" not in after.text + after.files[0].description
    # Asked again: the fresh answer is kept.
    again = await command(runtime, "timeline", community=COMMUNITY, moderator=False)
    assert again is after and len(built) == 2


async def test_a_timeline_made_mid_deletion_is_not_served_after_it(
    runtime: Runtime, anthropic_server: AnthropicFake, monkeypatch: pytest.MonkeyPatch
) -> None:
    await play(runtime, anthropic_server.brain)
    anthropic_server.brain.ess_rule(
        contains="solar subsidies",
        score=0.8,
        direction="opposes",
        topics=["nuclear_energy"],
        novelty=0.8,
        reasoning_type="empirical_data",
        source_reliability="established_expert",
        summary="Lena says solar subsidies buy more power per euro.",
    )
    # Lena's only message, with a platform id so it can be deleted; Sam's chat lets
    # her argument commit, credited to her.
    message = IncomingMessage(
        community=COMMUNITY,
        channel_id="c1",
        message_id="900001",
        user=LENA,
        text="Solar subsidies buy more power per euro than reactors.",
    )
    assert await runtime.handle(message) is not None
    await runtime.drain()
    for text in ("Who has the key to the workshop?", "The glue gun is back.", "Thanks!"):
        await say(runtime, text, community=COMMUNITY, user=SAM)

    built = spy_builds(monkeypatch)
    real_erase = runtime.db.erase_message
    mid: list[Any] = []

    async def erase(*args: Any, **kwargs: Any) -> int:
        mid.append(await command(runtime, "timeline", community=COMMUNITY, moderator=False))
        return await real_erase(*args, **kwargs)

    monkeypatch.setattr(runtime.db, "erase_message", erase)
    assert await runtime.message_deleted("test", "900001", COMMUNITY.id) == 1
    monkeypatch.setattr(runtime.db, "erase_message", real_erase)
    assert len(mid) == 1 and len(built) == 1
    assert "Lena" in names(built[0])  # the interleaving happened

    after = await command(runtime, "timeline", community=COMMUNITY, moderator=False)
    assert after.ok and after is not mid[0]
    assert len(built) == 2
    assert built[1].last_version == built[0].last_version
    assert "Lena" not in names(built[1])
