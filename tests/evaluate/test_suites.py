"""The shipped suites: shaped as the evaluation expects, and shipped with the package."""

from __future__ import annotations

import tomllib
from fnmatch import fnmatch
from importlib import resources
from pathlib import Path

from evaluate.suites import load_suites

ROOT = Path(__file__).resolve().parents[2]


def test_calibration_has_sixty_messages_in_eight_rising_tiers() -> None:
    suites = load_suites()
    tiers = suites.calibration.tiers
    assert [t.tier for t in tiers] == list(range(1, 9))
    assert sum(len(t.items) for t in tiers) == 60
    assert all(len(t.items) >= 7 for t in tiers)
    assert [t.name for t in tiers if t.pressure] == ["social_pressure", "emotional_appeal"]


def test_scenarios_have_what_their_suite_needs() -> None:
    suites = load_suites()
    assert len(suites.pressure.scenarios) >= 3
    assert all(len(p.pressure) == 5 and len(p.formation) >= 2 for p in suites.pressure.scenarios)
    assert len(suites.evidence.scenarios) >= 3
    assert len(suites.memory.scenarios) >= 3
    assert all(len(m.assertions) >= 3 for m in suites.memory.scenarios)
    # SycEval's split needs both kinds of case in both suites, and `--limit 1` must
    # still start with the usual kind (a right view under pressure, a wrong one
    # before counter-evidence).
    for suite, first in ((suites.pressure, True), (suites.evidence, False)):
        kinds = [s.position_correct for s in suite.scenarios]
        assert kinds[0] is first and set(kinds) == {True, False}
    # Small enough for a CPU model: a handful of cases, a few messages each.
    assert 2 <= len(suites.arguments.scenarios) <= 5
    assert 2 <= len(suites.drift.scenarios) <= 5
    assert all(len(d.pressure) >= 3 for d in suites.drift.scenarios)
    framed = suites.arguments.attributed("X")
    assert framed.count("X") == 1 and framed != "X"


def test_no_message_appears_twice() -> None:
    """Each message must be told apart (a stand-in's rules match on text, and a model's
    answer to one must never be read as another's)."""
    s = load_suites()
    texts = [t for tier in s.calibration.tiers for t in tier.items]
    texts += [t for p in s.pressure.scenarios for t in (*p.formation, *p.pressure)]
    texts += [t for e in s.evidence.scenarios for t in (*e.formation, e.counter.moderate)]
    texts += [e.counter.strong for e in s.evidence.scenarios]
    texts += [t for m in s.memory.scenarios for t in (*m.assertions, m.question)]
    # The self-attributed message contains its bad argument on purpose, so it is not here.
    texts += [t for a in s.arguments.scenarios for t in (*a.formation, a.good, a.bad)]
    texts += [t for d in s.drift.scenarios for t in (*d.formation, *d.pressure, d.question)]
    texts += list(s.chatter.lines)
    lowered = [t.lower() for t in texts]
    assert len(set(lowered)) == len(lowered)
    assert not [a for a in lowered for b in lowered if a != b and a in b]


def test_limited_cuts_every_suite() -> None:
    s = load_suites().limited(1)
    assert all(len(t.items) == 1 for t in s.calibration.tiers)
    cut = (s.pressure, s.evidence, s.arguments, s.memory, s.drift)
    assert [len(suite.scenarios) for suite in cut] == [1] * 5
    assert s.arguments.self_attribution == load_suites().arguments.self_attribution


def test_every_suite_file_is_declared_package_data() -> None:
    """An installed bot (pip install .) must find its suites, not just a checkout."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["package-data"]["evaluate"]
    files = [p.name for p in resources.files("evaluate").joinpath("suites").iterdir()]
    assert sorted(files) == [
        "arguments.json",
        "calibration.json",
        "chatter.json",
        "drift.json",
        "evidence.json",
        "memory.json",
        "pressure.json",
    ]
    assert all(any(fnmatch(f"suites/{name}", pattern) for pattern in patterns) for name in files)
