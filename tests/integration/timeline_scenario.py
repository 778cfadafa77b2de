"""A scripted community for the opinion timeline: two members argue, a third chats.

Used by the timeline tests and by the docs example (`timeline_example.py`), so the
picture in the README is exactly what the tests check. Everything goes through the
real runtime and the loopback model server; the server's rule-based brain scores the
arguments (the rules below), the engine does the rest: staging, cooling, netting,
reflection, rollback.

What happens, by interaction (cooling period 3 unless said otherwise):

- Maria and Tom argue about nuclear energy (for and against) and Tom makes the case
  for remote work; Sam only chats, so Sam never moves an opinion.
- A moderator reflects, then rolls back to the version where Tom's argument about
  waste storage and Maria's about the four-day week were still cooling: both are
  restored and commit later, still theirs.
- The cooling period drops to 1 (an operator's setting change, which reaches the
  community when its agent is next loaded: `operator_sets`) while Maria's argument
  still cools, so Tom's counter-argument becomes due at the same interaction and the
  two are netted into one commit, credited to the larger step (Maria's).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bot.messages import Community, User
from bot.runtime import Runtime
from sonality.agent import SonalityAgent
from sonality.config import EngineConfig
from tests.integration.conftest import command, say

COMMUNITY = Community(id="test:riverside", name="Riverside Makers")
MARIA = User(id="u-maria", name="Maria")
TOM = User(id="u-tom", name="Tom")
SAM = User(id="u-sam", name="Sam")

RULES: list[dict[str, Any]] = [
    dict(
        contains="meta-analysis of reactor",
        score=0.9,
        direction="supports",
        topics=["nuclear_energy"],
        novelty=0.9,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        summary="Maria cites a meta-analysis of reactor safety records.",
    ),
    dict(
        contains="capacity factor",
        score=0.8,
        direction="supports",
        topics=["nuclear_energy"],
        novelty=0.8,
        reasoning_type="empirical_data",
        source_reliability="established_expert",
        summary="Maria compares capacity factors of power sources.",
    ),
    dict(
        contains="cost overruns",
        score=0.75,
        direction="opposes",
        topics=["nuclear_energy"],
        novelty=0.8,
        reasoning_type="empirical_data",
        source_reliability="established_expert",
        summary="Tom lists cost overruns of recent reactor builds.",
    ),
    dict(
        contains="waste storage",
        score=0.7,
        direction="opposes",
        topics=["nuclear_energy"],
        novelty=0.7,
        reasoning_type="logical_argument",
        source_reliability="informed_opinion",
        summary="Tom argues long-term waste storage is unsolved.",
    ),
    dict(
        contains="remote work study",
        score=0.8,
        direction="supports",
        topics=["remote_work"],
        novelty=0.9,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        summary="Tom cites a randomised remote work study.",
    ),
    dict(
        contains="office collaboration",
        score=0.6,
        direction="opposes",
        topics=["remote_work"],
        novelty=0.6,
        reasoning_type="anecdotal",
        source_reliability="informed_opinion",
        summary="Maria says office collaboration sparks ideas.",
    ),
    dict(
        contains="four-day week trial",
        score=0.85,
        direction="supports",
        topics=["four_day_week"],
        novelty=0.9,
        reasoning_type="empirical_data",
        source_reliability="peer_reviewed",
        summary="Maria cites a national four-day week trial.",
    ),
    dict(
        contains="small modular reactors",
        score=0.45,
        direction="opposes",
        topics=["nuclear_energy"],
        novelty=0.4,
        reasoning_type="logical_argument",
        source_reliability="informed_opinion",
        summary="Tom doubts small modular reactors will be cheap.",
    ),
]


@dataclass
class Played:
    """Version numbers the tests check the picture's data against."""

    reflection: int = -1
    rollback: int = -1
    rollback_target: int = -1
    #: (topic, interaction, member id) of every commit, as the script intends it.
    expected_moves: list[tuple[str, int, str]] = field(default_factory=list)
    netted_at: int = -1  # the interaction where Maria's and Tom's updates were netted


def teach(brain: Any) -> None:
    for rule in RULES:
        brain.ess_rule(**rule)


async def operator_sets(runtime: Runtime, community: Community, **changes: Any) -> None:
    """An operator's change of engine settings for one community, as a restart applies
    it: the community's agent finishes its learning and is unloaded, and from its next
    load on it follows the runtime's config with `changes` (checked like any config)."""
    await runtime.registry.unload(community.id)
    load = runtime.registry.factory

    async def changed(loading: Community) -> SonalityAgent:
        agent = await load(loading)
        if loading.id == community.id:
            agent.config = EngineConfig(**{**agent.config.model_dump(), **changes})
        return agent

    runtime.registry.factory = changed


async def play(runtime: Runtime, brain: Any, community: Community = COMMUNITY) -> Played:
    """Run the script; returns what the tests expect to find in the timeline."""
    teach(brain)
    played = Played()
    moderator = User(id="u-mod", name="Mo")

    async def talk(user: User, text: str) -> int:
        await say(runtime, text, community=community, user=user)
        agent = runtime.registry.get(community.id)
        assert agent is not None
        return agent.sponge.interaction_count

    async def version() -> int:
        agent = runtime.registry.get(community.id)
        assert agent is not None
        return agent.sponge.version

    factory = runtime.registry.factory
    # The script counts on a cooling period of 3, whatever the environment sets.
    await operator_sets(runtime, community, opinion_cooling_period=3)
    try:
        await talk(MARIA, "A meta-analysis of reactor safety records says it is the safest.")  # 1
        await talk(SAM, "Morning all, who brought the coffee?")  # 2
        await talk(TOM, "A remote work study found output rose by 13%.")  # 3
        await talk(SAM, "The new laser cutter is amazing.")  # 4: Maria's commits
        played.expected_moves.append(("nuclear_energy", 4, MARIA.id))
        await talk(TOM, "Look at the cost overruns at every recent reactor build.")  # 5
        await talk(MARIA, "Its capacity factor beats wind and solar by far.")  # 6
        played.expected_moves.append(("remote_work", 6, TOM.id))
        await talk(SAM, "Anyone up for pizza on Friday?")  # 7
        await talk(SAM, "I fixed the 3D printer's bed.")  # 8
        played.expected_moves.append(("nuclear_energy", 8, TOM.id))
        await talk(MARIA, "The four-day week trial kept output and cut burnout.")  # 9
        played.expected_moves.append(("nuclear_energy", 9, MARIA.id))
        reflected = await command(runtime, "reflect", community=community, user=moderator)
        assert reflected.ok, reflected.text
        played.reflection = await version()
        await talk(TOM, "And waste storage is still unsolved after fifty years.")  # 10
        played.rollback_target = await version()
        await talk(SAM, "Does anyone know a good soldering iron?")  # 11
        rolled = await command(
            runtime,
            "rollback",
            str(played.rollback_target),
            "testing",
            community=community,
            user=moderator,
        )
        assert rolled.ok, rolled.text
        played.rollback = await version()
        # Restored: Maria's four-day week (due 12 -> 13), Tom's waste (due 13 -> 14).
        await talk(SAM, "Soldering iron found, thanks!")  # 12
        await talk(SAM, "The workshop is open late today.")  # 13
        played.expected_moves.append(("four_day_week", 13, MARIA.id))
        await talk(SAM, "Reminder: tidy your bench.")  # 14
        played.expected_moves.append(("nuclear_energy", 14, TOM.id))
        await talk(MARIA, "Office collaboration sparks ideas you never get on video.")  # 15
        await talk(MARIA, "Again: its capacity factor is unmatched.")  # 16, due 19
        runtime.registry.factory = factory
        await operator_sets(runtime, community, opinion_cooling_period=1)
        await talk(SAM, "Who borrowed my calipers?")  # 17
        played.expected_moves.append(("remote_work", 18, MARIA.id))
        await talk(TOM, "I doubt small modular reactors will ever be cheap.")  # 18, due 19
        await talk(SAM, "Calipers are back, never mind.")  # 19: both nuclear updates
        played.expected_moves.append(("nuclear_energy", 19, MARIA.id))
        played.netted_at = 19
        await talk(SAM, "Good night everyone.")  # 20
    finally:
        runtime.registry.factory = factory  # the agent loaded now keeps its config
    return played
