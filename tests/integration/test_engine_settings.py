"""The engine settings reach every agent through the config the wiring builds from
them, in this process, without rewriting `sonality.config`: two runtimes side by side
with different settings each follow their own."""

from __future__ import annotations

from pathlib import Path

from app.wiring import open_runtime
from providers.anthropic import AnthropicLLM
from sonality import config
from tests.integration.conftest import A, command, make_settings, say


async def test_two_runtimes_in_one_process_follow_their_own_settings(
    tmp_path: Path, llm: AnthropicLLM
) -> None:
    every_7 = make_settings(tmp_path / "seven", SONALITY_REFLECTION_EVERY=7)
    every_9 = make_settings(
        tmp_path / "nine", SONALITY_REFLECTION_EVERY=9, SONALITY_ESS_THRESHOLD=0.8
    )
    async with (
        open_runtime(every_7, llm=llm) as seven,
        open_runtime(every_9, llm=llm) as nine,
    ):
        await say(seven, "hello there")
        await say(nine, "hello there")
        shown = [(await command(rt, "status")).text for rt in (seven, nine)]
        agents = [rt.registry.get(A.id) for rt in (seven, nine)]
    assert "Next reflection: after 6 more interaction(s)" in shown[0]
    assert "Next reflection: after 8 more interaction(s)" in shown[1]
    assert [a.config.reflection_every for a in agents if a] == [7, 9]
    assert [a.config.ess_threshold for a in agents if a] == [config.ESS_THRESHOLD, 0.8]
    # The environment's values are left as they were read.
    assert config.REFLECTION_EVERY == config.ENVIRONMENT.reflection_every
