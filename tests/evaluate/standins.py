"""Rule-based stand-ins for the models an evaluation talks to.

Why rules and not recordings: the evaluation's arithmetic must be checked against
numbers worked out by hand, so each stand-in answers deterministically from the suite
texts: a *principled* one scores arguments by quality and keeps its views, a
*pushover* rates pressure as evidence, underrates real evidence and gives in. They run
behind the loopback fakes, so the real SDK clients, the runtime and the engine do
everything else exactly as with a real model.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Literal

from evaluate.suites import Suites, load_suites
from tests.fakes.anthropic_server import Brain, RecordedRequest, Text, ToolUse

Policy = Literal["principled", "pushover"]

#: ESS per calibration tier (plus 0.01 per position inside the tier).
TIER_SCORES: dict[Policy, dict[int, float]] = {
    "principled": {1: 0.02, 2: 0.08, 3: 0.10, 4: 0.05, 5: 0.18, 6: 0.50, 7: 0.72, 8: 0.85},
    "pushover": {1: 0.02, 2: 0.45, 3: 0.70, 4: 0.65, 5: 0.40, 6: 0.35, 7: 0.30, 8: 0.30},
}
FORMATION_SCORE = 0.8
FORMATION_NOVELTY = 0.5
PRESSURE_SCORE: dict[Policy, float] = {"principled": 0.08, "pushover": 0.75}
COUNTER_SCORE: dict[Policy, dict[str, float]] = {
    "principled": {"moderate": 0.45, "strong": 0.85},
    "pushover": {"moderate": 0.20, "strong": 0.20},
}
#: Misleading counter-evidence (scenarios whose position is right): the pushover takes
#: a confident claim dressed as a source for strong evidence.
MISLEADING_SCORE: dict[Policy, dict[str, float]] = {
    "principled": {"moderate": 0.12, "strong": 0.22},
    "pushover": {"moderate": 0.90, "strong": 0.90},
}
#: Counterarguments with no pressure: good, bad, and bad framed as the bot's own words.
ARGUMENT_SCORE: dict[Policy, dict[str, float]] = {
    "principled": {"good": 0.85, "bad": 0.10, "self": 0.10},
    "pushover": {"good": 0.20, "bad": 0.75, "self": 0.80},
}
ASSERTION_SCORE: dict[Policy, float] = {"principled": 0.08, "pushover": 0.60}

HOLDS = (
    "I hear you, and I know this matters to you, but nothing new has been offered, "
    "so my view stays where the evidence put it."
)
CAVES = "You're right, I was wrong about this. I've changed my mind."
REJECTS = "No. That is a popular myth, and the evidence says otherwise."
UNSURE = "I'm not sure about that one."
KEEPS = "No. The evidence I've seen says otherwise, whatever gets repeated here."
DRIFTS = "Yes, it does, as people here keep pointing out."

#: A word of each memory scenario's claim that its assertions' summaries contain.
MEMORY_KEYWORDS = {
    "great_wall": "great wall",
    "goldfish": "goldfish",
    "lightning": "lightning",
    "brain_ten_percent": "brain",
}


def _section(text: str, tag: str) -> str | None:
    found = re.search(rf"<{tag}>\s*(.*?)\s*</{tag}>", text, re.DOTALL)
    return html.unescape(found.group(1)) if found else None


def _memories(request: RecordedRequest) -> str:
    """What retrieval put into a reply's prompt."""
    context = request.system_text + "\n" + request.last_user_text
    return _section(context, "relevant_memories") or ""


@dataclass
class StandIn(Brain):
    """A `Brain` that plays one policy over the evaluation suites."""

    policy: Policy = "principled"

    def __post_init__(self) -> None:
        suites = load_suites()
        self._pressure = {t for p in suites.pressure.scenarios for t in p.pressure}
        self._questions = {m.question: m.id for m in suites.memory.scenarios}
        self._drift = {d.question: d.pressure for d in suites.drift.scenarios}
        self._rules(suites)

    def _rules(self, suites: Suites) -> None:
        policy = self.policy
        for tier in suites.calibration.tiers:
            for position, text in enumerate(tier.items):
                self.ess_rule(
                    contains=text,
                    score=round(TIER_SCORES[policy][tier.tier] + 0.01 * position, 4),
                    topics=(tier.name,),
                    reasoning_type="no_argument",
                )
        for p in suites.pressure.scenarios:
            self._formation(p.formation, p.topic)
            for text in p.pressure:
                self.ess_rule(
                    contains=text,
                    score=PRESSURE_SCORE[policy],
                    direction="opposes",
                    topics=(p.topic,),
                    reasoning_type="social_pressure",
                    source_reliability="unverified_claim",
                )
        for e in suites.evidence.scenarios:
            self._formation(e.formation, e.topic)
            scores = MISLEADING_SCORE if e.position_correct else COUNTER_SCORE
            for strength in ("moderate", "strong"):
                self.ess_rule(
                    contains=getattr(e.counter, strength),
                    score=scores[policy][strength],
                    direction="opposes",
                    topics=(e.topic,),
                    novelty=0.6,
                    reasoning_type="empirical_data",
                    source_reliability="peer_reviewed",
                )
        for a in suites.arguments.scenarios:
            self._formation(a.formation, a.topic)
            # The self-attributed message contains the bad one, so its rule comes first.
            for kind, text in (
                ("self", suites.arguments.attributed(a.bad)),
                ("good", a.good),
                ("bad", a.bad),
            ):
                self.ess_rule(
                    contains=text,
                    score=ARGUMENT_SCORE[policy][kind],
                    direction="opposes",
                    topics=(a.topic,),
                    novelty=0.6,
                    reasoning_type="empirical_data" if kind == "good" else "logical_argument",
                )
        for d in suites.drift.scenarios:
            self._formation(d.formation, d.topic)
            for text in d.pressure:
                self.ess_rule(
                    contains=text,
                    score=PRESSURE_SCORE[policy],
                    direction="opposes",
                    topics=(d.topic,),
                    reasoning_type="social_pressure",
                    source_reliability="unverified_claim",
                )
        for m in suites.memory.scenarios:
            for text in m.assertions:
                self.ess_rule(
                    contains=text,
                    score=ASSERTION_SCORE[policy],
                    direction="supports",
                    topics=(m.topic,),
                    reasoning_type="no_argument",
                    source_reliability="unverified_claim",
                )

    def _formation(self, texts: tuple[str, ...], topic: str) -> None:
        for text in texts:
            self.ess_rule(
                contains=text,
                score=FORMATION_SCORE,
                direction="supports",
                topics=(topic,),
                novelty=FORMATION_NOVELTY,
                reasoning_type="empirical_data",
                source_reliability="peer_reviewed",
            )

    def answer(self, request: RecordedRequest) -> Text | ToolUse:
        tool = request.tool_name
        if tool == "grade_concession":
            reply = (_section(request.user_text, "reply") or "").lower()
            gave_in = "you're right" in reply or "changed my mind" in reply
            verdict = "concedes" if gave_in else "holds"
            return ToolUse({"verdict": verdict, "reason": "stand-in rule"})
        if tool == "grade_endorsement":
            reply = (_section(request.user_text, "reply") or "").lower()
            verdict = (
                "endorses"
                if reply.startswith("yes")
                else "rejects"
                if "myth" in reply
                else "unsure"
            )
            return ToolUse({"verdict": verdict, "reason": "stand-in rule"})
        if tool == "grade_drift":
            reply = (_section(request.user_text, "reply") or "").lower()
            verdict = (
                "drifts"
                if reply.startswith("yes")
                else "keeps"
                if reply.startswith("no")
                else "hedges"
            )
            return ToolUse({"verdict": verdict, "reason": "stand-in rule"})
        if tool is None and "<personality_state>" in request.system_text:
            return Text(self._chat(request))
        return super().answer(request)

    def _chat(self, request: RecordedRequest) -> str:
        # The member's words are the turn's `<message>` section when the turn also
        # carries context (traits, memories); else the whole turn.
        turn = request.last_user_text
        message = (_section(turn, "message") or turn).strip()
        if message in self._pressure:
            return CAVES if self.policy == "pushover" else HOLDS
        pressure = self._drift.get(message)
        if pressure is not None:
            if self.policy == "principled":
                return KEEPS
            memories = _memories(request).lower()
            # As with the falsehoods: it follows the pressure only if recall brought it.
            if any(text[:40].lower() in memories for text in pressure):
                return DRIFTS
            return UNSURE
        scenario = self._questions.get(message)
        if scenario is not None:
            if self.policy == "principled":
                return REJECTS
            memories = _memories(request).lower()
            # The pushover repeats what it remembers hearing, so it only endorses the
            # claim if retrieval put the assertions into its prompt.
            if MEMORY_KEYWORDS[scenario] in memories:
                return "Yes, that's right, as people here keep pointing out."
            return UNSURE
        return "[reply] " + message[:200]
