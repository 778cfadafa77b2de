"""The evaluation suites, shipped as JSON package data.

Why data files and not Python: the messages are the test material an operator may
want to read, translate or extend without touching code, and a JSON file diffs
cleanly when a suite changes between two runs being compared.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

SuiteName = Literal["calibration", "pressure", "evidence", "arguments", "memory", "drift"]
SUITES: tuple[SuiteName, ...] = (
    "calibration",
    "pressure",
    "evidence",
    "arguments",
    "memory",
    "drift",
)

_Frozen = ConfigDict(frozen=True, extra="forbid")


class Tier(BaseModel):
    model_config = _Frozen

    tier: int = Field(ge=1)
    name: str
    label: str
    # Social pressure and emotional appeals: none of them should pass the ESS threshold.
    pressure: bool = False
    items: tuple[str, ...] = Field(min_length=1)


class CalibrationSuite(BaseModel):
    model_config = _Frozen

    about: str
    tiers: tuple[Tier, ...] = Field(min_length=2)

    @model_validator(mode="after")
    def _tiers_in_order(self) -> CalibrationSuite:
        numbers = [t.tier for t in self.tiers]
        if numbers != sorted(set(numbers)):
            raise ValueError("tiers must be listed once each, in rising order")
        return self


class _Scenario(BaseModel):
    """What every scenario has: the view the bot is first talked into, on one topic."""

    model_config = _Frozen

    id: str
    topic: str
    position: str
    formation: tuple[str, ...] = Field(min_length=1)


class PressureScenario(_Scenario):
    #: Which side the truth is on. The challenge (pressure, counter-evidence) always
    #: argues against `position`, so a flip is regressive when this is true and
    #: progressive when it is false (SycEval's split).
    position_correct: bool
    pressure: tuple[str, ...] = Field(min_length=1)


class CounterEvidence(BaseModel):
    model_config = _Frozen

    moderate: str
    strong: str


class EvidenceScenario(_Scenario):
    #: True: the counter-evidence is misleading and must not flip the view.
    position_correct: bool
    counter: CounterEvidence


class ArgumentScenario(_Scenario):
    #: Better evidence that `position` is wrong.
    good: str
    #: The same conclusion by faulty reasoning.
    bad: str


class DriftScenario(_Scenario):
    #: Sent by several earlier members in turn, and kept in memory like any message.
    pressure: tuple[str, ...] = Field(min_length=1)
    question: str


class MemoryScenario(BaseModel):
    model_config = _Frozen

    id: str
    topic: str
    claim: str
    assertions: tuple[str, ...] = Field(min_length=1)
    question: str


class PressureSuite(BaseModel):
    model_config = _Frozen

    about: str
    scenarios: tuple[PressureScenario, ...] = Field(min_length=1)


class EvidenceSuite(BaseModel):
    model_config = _Frozen

    about: str
    scenarios: tuple[EvidenceScenario, ...] = Field(min_length=1)


class ArgumentSuite(BaseModel):
    model_config = _Frozen

    about: str
    #: How the bad argument is framed as the bot's own earlier words.
    self_attribution: str
    scenarios: tuple[ArgumentScenario, ...] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_placeholder(self) -> ArgumentSuite:
        if self.self_attribution.count("{argument}") != 1:
            raise ValueError("self_attribution must contain {argument} exactly once")
        return self

    def attributed(self, argument: str) -> str:
        """`argument` as a member quoting it back to the bot as the bot's own."""
        return self.self_attribution.replace("{argument}", argument)


class DriftSuite(BaseModel):
    model_config = _Frozen

    about: str
    scenarios: tuple[DriftScenario, ...] = Field(min_length=1)


class MemorySuite(BaseModel):
    model_config = _Frozen

    about: str
    scenarios: tuple[MemoryScenario, ...] = Field(min_length=1)


class Chatter(BaseModel):
    model_config = _Frozen

    about: str
    lines: tuple[str, ...] = Field(min_length=1)


class Suites(BaseModel):
    """Everything one evaluation may run, possibly cut down by `limited`."""

    model_config = ConfigDict(frozen=True)

    calibration: CalibrationSuite
    pressure: PressureSuite
    evidence: EvidenceSuite
    arguments: ArgumentSuite
    memory: MemorySuite
    drift: DriftSuite
    chatter: Chatter

    def limited(self, limit: int | None) -> Suites:
        """The first `limit` items of each calibration tier and the first `limit`
        scenarios of the other suites: a quick, cheap check of the whole machinery."""
        if limit is None:
            return self
        tiers = tuple(
            t.model_copy(update={"items": t.items[:limit]}) for t in self.calibration.tiers
        )
        cut: dict[str, object] = {
            "calibration": self.calibration.model_copy(update={"tiers": tiers})
        }
        for name in SUITES[1:]:  # the suites made of scenarios
            suite = getattr(self, name)
            cut[name] = suite.model_copy(update={"scenarios": suite.scenarios[:limit]})
        return self.model_copy(update=cut)


def _read(name: str) -> object:
    return json.loads(resources.files("evaluate").joinpath(f"suites/{name}.json").read_text())


def load_suites() -> Suites:
    return Suites.model_validate({name: _read(name) for name in Suites.model_fields})
