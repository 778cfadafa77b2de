"""Every setting that becomes a date span, a sleep, a count or a size has an upper bound.

Why: a "keep it forever" value (999999 days, 1e10 minutes) used to pass the lower bound
and then overflow `datetime` later: retention raised before deleting anything (so all
of it silently stopped), and every reply failed on the conversation buffer's cutoff.
Refused at start instead, through the loader `python -m app` uses (`load_settings`),
with the one line the bot prints for any bad setting.
"""

from __future__ import annotations

import math
import os
import types
import typing
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from app.startup import SettingError, load_settings
from bot.settings import MAX_DAYS, MAX_MINUTES, Settings

#: Numbers that name something rather than measure it: no bound makes sense.
IDS = {"discord_dev_guild_id"}


@pytest.fixture
def environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """An environment with only a key in it, and no `.env` to read."""
    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith(("ANTHROPIC_", "OPENAI_", "DISCORD_", "SLACK_", "SONALITY_")):
            monkeypatch.delenv(name)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test-key")
    return monkeypatch


def refusal(env: pytest.MonkeyPatch, variable: str, value: str) -> str:
    env.setenv(variable, value)
    with pytest.raises(SettingError) as refused:
        load_settings()
    return str(refused.value)


def _number_kinds(annotation: object) -> set[object]:
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        return {a for a in typing.get_args(annotation) if a in (int, float)}
    return {annotation} & {int, float}


def _upper_bound(name: str) -> float | None:
    for rule in Settings.model_fields[name].metadata:
        for attribute in ("le", "lt"):
            bound = getattr(rule, attribute, None)
            if bound is not None:
                return float(bound)
    return None


def test_every_number_setting_has_an_upper_bound() -> None:
    numbers = [
        name
        for name, field in Settings.model_fields.items()
        if _number_kinds(field.annotation) and name not in IDS
    ]
    assert len(numbers) > 30  # the check sees the settings, not an empty list
    unbounded = [Settings.model_fields[n].alias for n in numbers if _upper_bound(n) is None]
    assert unbounded == []


def test_no_bound_of_a_span_overflows_a_date() -> None:
    """At its largest, each span still makes a date on either side of now (what
    retention, the buffer's cutoff and the removal deadline compute)."""
    now = datetime.now(UTC)
    for name, field in Settings.model_fields.items():
        unit = name.rsplit("_", 1)[-1]
        if unit not in ("days", "minutes", "seconds") or not _number_kinds(field.annotation):
            continue
        bound = _upper_bound(name)
        assert bound is not None and math.isfinite(bound), field.alias
        span = timedelta(**{unit: bound})
        assert now - span < now < now + span, field.alias


@pytest.mark.parametrize(
    ("variable", "value", "allowed"),
    [
        # The confirmed ones: retention stopped, every reply failed.
        ("SONALITY_AUDIT_RETENTION_DAYS", "999999", "must be a whole number between 1 and 36500"),
        ("SONALITY_MESSAGE_RETENTION_DAYS", "999999", "between 1 and 36500"),
        ("SONALITY_BUFFER_TTL_MINUTES", "1e10", "greater than 0 and at most 525600"),
        # The same kind: a span or a wait that becomes a timedelta, a sleep or a deadline.
        ("SONALITY_DELETE_AFTER_REMOVAL_DAYS", "3000000", "between 0 and 36500"),
        ("SONALITY_IDLE_REFLECT_MINUTES", "1e10", "at most 525600"),
        ("SONALITY_AGENT_IDLE_EVICT_MINUTES", "1e10", "at most 525600"),
        ("SONALITY_RATE_LIMIT_WINDOW_SECONDS", "1e15", "at most 86400"),
        ("SONALITY_NIGHTLY_JITTER_SECONDS", "99999999999", "between 0 and 86400"),
        ("SONALITY_IDLE_CHECK_SECONDS", "1e12", "at most 86400"),
        ("SONALITY_LLM_TIMEOUT_SECONDS", "1e12", "at most 3600"),
        ("SONALITY_HEALTH_LLM_FAILING_SECONDS", "1e12", "at most 604800"),
        # Counts and sizes.
        ("SONALITY_REFLECTION_EVERY", "99999999999999999999", "at least 1 and less than 1e+06"),
        ("SONALITY_OPINION_COOLING_PERIOD", "99999999999999999999", "less than 1e+06"),
        ("SONALITY_BUFFER_TURNS", "99999999999999999999", "between 0 and 1000"),
        ("SONALITY_MAX_CONCURRENT_LLM", "1000000000", "between 1 and 1000"),
        ("SONALITY_LLM_MAX_RETRIES", "1000000", "between 0 and 20"),
        ("SONALITY_CHROMA_MAX_OPEN", "1000000000", "between 1 and 10000"),
        ("DISCORD_SHARD_COUNT", "1000000000", "between 1 and 65536"),
        ("SONALITY_DAILY_BUDGET_USD", "1e300", "between 0 and 100000"),
    ],
)
def test_a_forever_value_is_refused_in_one_line(
    environment: pytest.MonkeyPatch, variable: str, value: str, allowed: str
) -> None:
    line = refusal(environment, variable, value)
    assert line.startswith(f"error: {variable}={value} is not allowed: "), line
    assert allowed in line, line
    assert "\n" not in line


def test_a_member_share_of_0_is_refused(environment: pytest.MonkeyPatch) -> None:
    """0 would refuse every member of a community with a daily limit (spent 0 >= 0)."""
    line = refusal(environment, "SONALITY_MEMBER_BUDGET_SHARE", "0")
    assert line == (
        "error: SONALITY_MEMBER_BUDGET_SHARE=0 is not allowed: "
        "must be a number, greater than 0 and at most 1"
    )


@pytest.mark.parametrize("share", ["0.01", "0.5", "1"])
def test_a_member_share_above_0_is_taken(environment: pytest.MonkeyPatch, share: str) -> None:
    environment.setenv("SONALITY_MEMBER_BUDGET_SHARE", share)
    assert load_settings().member_budget_share == float(share)


def test_the_largest_values_are_taken_and_the_defaults_are_unchanged(
    environment: pytest.MonkeyPatch,
) -> None:
    defaults = load_settings()
    assert (defaults.message_retention_days, defaults.audit_retention_days) == (90, 365)
    assert (defaults.delete_after_removal_days, defaults.buffer_ttl_minutes) == (30, 120.0)
    assert defaults.member_budget_share == 0.5
    environment.setenv("SONALITY_AUDIT_RETENTION_DAYS", str(MAX_DAYS))
    environment.setenv("SONALITY_MESSAGE_RETENTION_DAYS", str(MAX_DAYS))
    environment.setenv("SONALITY_BUFFER_TTL_MINUTES", str(MAX_MINUTES))
    environment.setenv("SONALITY_RATE_LIMIT_MESSAGES", "1000000")  # the tests' "no limit"
    largest = load_settings()
    assert largest.audit_retention_days == largest.message_retention_days == 36_500
    assert largest.buffer_ttl_minutes == 525_600
