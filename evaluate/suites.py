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


class PressureScenario(BaseModel):
    model_config = _Frozen

    id: str
    topic: str
    position: str
    #: Which side the truth is on. The challenge (pressure, counter-evidence) always
    #: argues against `position`, so a flip is regressive when this is true and
    #: progressive when it is false (SycEval's split).
    position_correct: bool
    formation: tuple[str, ...] = Field(min_length=1)
    pressure: tuple[str, ...] = Field(min_length=1)


class PressureSuite(BaseModel):
    model_config = _Frozen

    about: str
    scenarios: tuple[PressureScenario, ...] = Field(min_length=1)


class CounterEvidence(BaseModel):
    model_config = _Frozen

    moderate: str
    strong: str


class EvidenceScenario(BaseModel):
    model_config = _Frozen

    id: str
    topic: str
    position: str
    #: True: the counter-evidence is misleading and must not flip the view.
    position_correct: bool
    formation: tuple[str, ...] = Field(min_length=1)
    counter: CounterEvidence


class EvidenceSuite(BaseModel):
    model_config = _Frozen

    about: str
    scenarios: tuple[EvidenceScenario, ...] = Field(min_length=1)


class ArgumentScenario(BaseModel):
    model_config = _Frozen

    id: str
    topic: str
    position: str
    formation: tuple[str, ...] = Field(min_length=1)
    #: Better evidence that `position` is wrong.
    good: str
    #: The same conclusion by faulty reasoning.
    bad: str


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


class DriftScenario(BaseModel):
    model_config = _Frozen

    id: str
    topic: str
    position: str
    formation: tuple[str, ...] = Field(min_length=1)
    #: Sent by several earlier members in turn, and kept in memory like any message.
    pressure: tuple[str, ...] = Field(min_length=1)
    question: str


class DriftSuite(BaseModel):
    model_config = _Frozen

    about: str
    scenarios: tuple[DriftScenario, ...] = Field(min_length=1)


class MemoryScenario(BaseModel):
    model_config = _Frozen

    id: str
    topic: str
    claim: str
    assertions: tuple[str, ...] = Field(min_length=1)
    question: str


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
        scenario_suites: dict[
            str, PressureSuite | EvidenceSuite | ArgumentSuite | MemorySuite | DriftSuite
        ] = {
            "pressure": self.pressure,
            "evidence": self.evidence,
            "arguments": self.arguments,
            "memory": self.memory,
            "drift": self.drift,
        }
        cut = {
            name: suite.model_copy(update={"scenarios": suite.scenarios[:limit]})
            for name, suite in scenario_suites.items()
        }
        calibration = self.calibration.model_copy(update={"tiers": tiers})
        return self.model_copy(update={"calibration": calibration, **cut})


def _read(name: str) -> object:
    return json.loads(resources.files("evaluate").joinpath(f"suites/{name}.json").read_text())


def load_suites() -> Suites:
    return Suites(
        calibration=CalibrationSuite.model_validate(_read("calibration")),
        pressure=PressureSuite.model_validate(_read("pressure")),
        evidence=EvidenceSuite.model_validate(_read("evidence")),
        arguments=ArgumentSuite.model_validate(_read("arguments")),
        memory=MemorySuite.model_validate(_read("memory")),
        drift=DriftSuite.model_validate(_read("drift")),
        chatter=Chatter.model_validate(_read("chatter")),
    )
