"""`sonality.prompts` and the agent's trait summary as 002 describes them (the templates'
placeholders are checked in tests/engine/test_prompts.py)."""

from __future__ import annotations

from sonality.agent import SonalityAgent
from sonality.memory.sponge import BehavioralSignature, BeliefMeta, SpongeState
from sonality.prompts import CORE_IDENTITY, build_system_prompt


def test_the_system_prompt_has_its_sections_in_order() -> None:
    prompt = build_system_prompt(
        "I like tidy proofs.", ["They argued for chess clocks."], "Style: dry"
    )
    tags = [
        "core_identity",
        "personality_state",
        "personality_traits",
        "relevant_memories",
        "instructions",
    ]
    starts = [prompt.index(f"<{tag}>") for tag in tags]
    assert starts == sorted(starts)
    assert CORE_IDENTITY.strip() in prompt
    assert "I like tidy proofs." in prompt
    assert "Style: dry" in prompt
    assert "They argued for chess clocks." in prompt
    assert "merit" in prompt or "strength of its reasoning" in prompt  # not familiarity
    assert "familiar" in prompt


def test_traits_and_memories_are_optional() -> None:
    prompt = build_system_prompt("I like tidy proofs.", [])
    assert "<personality_traits>" not in prompt and "<relevant_memories>" not in prompt
    assert prompt.index("<core_identity>") < prompt.index("<personality_state>")
    assert prompt.index("<personality_state>") < prompt.index("<instructions>")


def test_the_trait_summary_shows_the_top_five_of_each() -> None:
    engagement = {f"topic_{i}": i for i in range(1, 8)}  # topic_7 most engaged
    opinions = {"a": 0.1, "b": -0.9, "c": 0.5, "d": -0.3, "e": 0.7, "f": 0.05}
    state = SpongeState(
        tone="calm, precise",
        opinion_vectors=opinions,
        belief_meta={"b": BeliefMeta(confidence=0.44), "e": BeliefMeta(confidence=0.2)},
        behavioral_signature=BehavioralSignature(
            disagreement_rate=0.25, topic_engagement=engagement
        ),
    )
    lines = SonalityAgent._build_structured_traits(state).splitlines()
    assert lines[0] == "Style: calm, precise"
    assert "Top topics: topic_7(7), topic_6(6), topic_5(5), topic_4(4), topic_3(3)" in lines
    assert (
        "Strongest opinions: b=-0.90 c=0.4, e=+0.70 c=0.2, c=+0.50 c=0.0, d=-0.30 c=0.0, "
        "a=+0.10 c=0.0"
    ) in lines
    assert lines[-1] == "Disagreement rate: 25%"
