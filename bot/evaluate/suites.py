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

SuiteName = Literal["calibration", "pressure", "evidence", "memory"]
SUITES: tuple[SuiteName, ...] = ("calibration", "pressure", "evidence", "memory")

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
    formation: tuple[str, ...] = Field(min_length=1)
    counter: CounterEvidence


class EvidenceSuite(BaseModel):
    model_config = _Frozen

    about: str
    scenarios: tuple[EvidenceScenario, ...] = Field(min_length=1)


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
    memory: MemorySuite
    chatter: Chatter

    def limited(self, limit: int | None) -> Suites:
        """The first `limit` items of each calibration tier and the first `limit`
        scenarios of the other suites: a quick, cheap check of the whole machinery."""
        if limit is None:
            return self
        tiers = tuple(
            t.model_copy(update={"items": t.items[:limit]}) for t in self.calibration.tiers
        )
        return self.model_copy(
            update={
                "calibration": self.calibration.model_copy(update={"tiers": tiers}),
                "pressure": self.pressure.model_copy(
                    update={"scenarios": self.pressure.scenarios[:limit]}
                ),
                "evidence": self.evidence.model_copy(
                    update={"scenarios": self.evidence.scenarios[:limit]}
                ),
                "memory": self.memory.model_copy(
                    update={"scenarios": self.memory.scenarios[:limit]}
                ),
            }
        )


def _read(name: str) -> object:
    return json.loads(resources.files("bot.evaluate").joinpath(f"suites/{name}.json").read_text())


def load_suites() -> Suites:
    return Suites(
        calibration=CalibrationSuite.model_validate(_read("calibration")),
        pressure=PressureSuite.model_validate(_read("pressure")),
        evidence=EvidenceSuite.model_validate(_read("evidence")),
        memory=MemorySuite.model_validate(_read("memory")),
        chatter=Chatter.model_validate(_read("chatter")),
    )
