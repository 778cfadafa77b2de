"""`/sonality timeline`: the data behind the picture equals the stored history, and the
picture is a real PNG of the promised size, from the real runtime and the loopback model.

The community is `timeline_scenario`: Maria and Tom argue, Sam chats, a moderator
reflects and rolls back, and a setting change makes two members' updates commit
together. Every expectation is checked against what the store recorded (each version's
state, the audit trail), not against numbers copied from a run.
"""

from __future__ import annotations

import asyncio
import struct
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bot.runtime import Runtime
from bot.timeline import (
    HEIGHT_PX,
    WIDTH_PX,
    BeliefSeries,
    Timeline,
    TimelineError,
    alt_text,
    build_timeline,
    caption,
    parse_args,
    reach,
)
from sonality.store import StateCommit
from tests.fakes.anthropic_server import AnthropicFake
from tests.integration.conftest import command
from tests.integration.test_process import _start_bot
from tests.integration.timeline_scenario import COMMUNITY, MARIA, SAM, TOM, Played, play

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from the PNG header (the IHDR chunk comes first)."""
    assert data[:8] == PNG_SIGNATURE, "not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


@pytest.fixture
async def played(runtime: Runtime, anthropic_server: AnthropicFake) -> Played:
    return await play(runtime, anthropic_server.brain)


async def timeline_of(runtime: Runtime, topic: str | None = None) -> Timeline:
    return await build_timeline(runtime.db, COMMUNITY.id, COMMUNITY.name, topic=topic)


async def test_series_follow_the_stored_belief_history_version_by_version(
    runtime: Runtime, played: Played
) -> None:
    timeline = await timeline_of(runtime)
    store = runtime.db.community(COMMUNITY.id)
    latest = await store.latest_state()
    assert latest is not None
    assert (timeline.first_version, timeline.last_version) == (0, latest.version)
    assert timeline.last_interaction == latest.interaction_count == 20
    # Every topic ever held, strongest (now) first.
    assert [s.topic for s in timeline.series] == sorted(
        latest.opinion_vectors, key=lambda t: -abs(latest.opinion_vectors[t])
    )
    assert {s.topic for s in timeline.series} == {"nuclear_energy", "remote_work", "four_day_week"}
    for version in range(timeline.last_version + 1):
        state = await store.state_at(version)
        assert state is not None
        for series in timeline.series:
            point = series.at(version)
            stance = state.opinion_vectors.get(series.topic)
            if point is None:  # before its first point the belief did not exist
                assert stance is None
                continue
            assert point.stance == stance, (series.topic, version)
            meta = state.belief_meta.get(series.topic)
            expected = meta.confidence if meta is not None and stance is not None else 0.0
            assert point.confidence == expected, (series.topic, version)
    # Points sit at real versions, at those versions' interaction numbers.
    counts = {v.version: v.interaction_count for v in await store.versions(limit=100)}
    for series in timeline.series:
        assert all(counts[p.version] == p.interaction for p in series.points)


async def test_markers_sit_at_the_recorded_reflection_and_rollback(
    runtime: Runtime, played: Played
) -> None:
    timeline = await timeline_of(runtime)
    store = runtime.db.community(COMMUNITY.id)
    counts = {v.version: v.interaction_count for v in await store.versions(limit=100)}
    reflected = {
        e.version
        for e in await store.audit_events(kind="reflection", limit=100)
        if e.payload["ran"]
    }
    assert played.reflection in reflected
    markers = {(m.kind, m.version) for m in timeline.markers}
    assert markers == {("reflection", v) for v in reflected} | {("rollback", played.rollback)}
    for marker in timeline.markers:
        assert marker.interaction == counts[marker.version]
    [rollback] = [m for m in timeline.markers if m.kind == "rollback"]
    assert rollback.label == f"rollback to v{played.rollback_target}"


async def test_each_committed_move_is_credited_to_the_member_who_argued(
    runtime: Runtime, played: Played
) -> None:
    timeline = await timeline_of(runtime)
    store = runtime.db.community(COMMUNITY.id)
    moves = [m for s in timeline.series for m in s.moves]
    assert sorted((m.topic, m.interaction, m.member_id) for m in moves) == sorted(
        played.expected_moves
    )
    for move in moves:
        state = await store.state_at(move.version)
        assert state is not None and move.stance == state.opinion_vectors[move.topic]
    # Two members' updates netted into one commit: the larger step (Maria's) gets the dot.
    [netted] = [m for m in moves if m.interaction == played.netted_at]
    assert netted.updates == 2 and netted.contributors == (MARIA.id, TOM.id)
    # The rollback restored two cooling updates; they committed later, still credited.
    restored = {(m.topic, m.member_id) for m in moves if m.version > played.rollback}
    assert ("four_day_week", MARIA.id) in restored and ("nuclear_energy", TOM.id) in restored
    # Names as stored with their messages; Sam only chatted and is in no legend.
    assert [(m.name, m.moves) for m in timeline.members] == [("Maria", 5), ("Tom", 3)]
    assert SAM.id not in {m.id for m in timeline.members}


async def test_one_topic_alone_and_unknown_topics_refused(runtime: Runtime, played: Played) -> None:
    nuclear = await timeline_of(runtime, topic="nuclear")
    assert [s.topic for s in nuclear.series] == ["nuclear_energy"]
    assert nuclear.topic == "nuclear_energy" and nuclear.file_name.endswith("-nuclear_energy.png")
    assert {m.name for m in nuclear.members} == {"Maria", "Tom"}
    with pytest.raises(TimelineError) as unknown:
        await timeline_of(runtime, topic="tax_policy")
    assert not unknown.value.ok and "no belief about `tax_policy`" in unknown.value.text

    answer = await command(runtime, "timeline", "remote", "work", community=COMMUNITY, user=SAM)
    [picture] = answer.files
    assert answer.ok and picture.name.endswith("-remote_work.png")
    refused = await command(runtime, "timeline", "tax", "policy", community=COMMUNITY, user=SAM)
    assert not refused.ok and refused.private and refused.files == ()


async def test_the_command_answers_with_a_png_of_the_promised_size(
    runtime: Runtime, played: Played
) -> None:
    answer = await command(runtime, "timeline", community=COMMUNITY, user=SAM, moderator=False)
    assert answer.ok and not answer.private and "Opinion timeline" in answer.text
    [picture] = answer.files
    assert picture.mime_type == "image/png"
    assert png_size(picture.data) == (WIDTH_PX, HEIGHT_PX)
    assert len(picture.data) < 200_000
    latest = await runtime.db.community(COMMUNITY.id).latest_version()
    assert picture.name == f"timeline-v{latest}.png"
    assert "nuclear_energy" in picture.description  # alt text for screen readers


async def test_days_keep_only_recent_versions(runtime: Runtime, played: Played) -> None:
    now = datetime.now(UTC)
    recent = await build_timeline(runtime.db, COMMUNITY.id, topic=None, days=1, now=now)
    assert recent.first_version == 0 and recent.days == 1
    with pytest.raises(TimelineError) as quiet:
        await build_timeline(runtime.db, COMMUNITY.id, days=2, now=now + timedelta(days=3))
    assert quiet.value.ok and "Nothing changed in the last 2 days" in quiet.value.text
    assert parse_args(("nuclear energy", "30")) == ("nuclear_energy", 30)
    assert parse_args(("7",)) == (None, 7)
    for bad in ("0", "366"):
        with pytest.raises(TimelineError):
            parse_args((bad,))


async def test_a_forget_me_version_gets_its_marker(runtime: Runtime, played: Played) -> None:
    # forget-me is not built yet; a version caused by it must still be marked.
    store = runtime.db.community(COMMUNITY.id)
    latest = await store.latest_state()
    assert latest is not None
    forgotten = latest.model_copy(deep=True)
    forgotten.version = latest.version + 1
    forgotten.opinion_vectors.pop("remote_work")
    await store.commit(StateCommit(state=forgotten, cause="forget-me", change="forget-me"))
    timeline = await timeline_of(runtime)
    [marker] = [m for m in timeline.markers if m.kind == "forget-me"]
    assert marker.version == forgotten.version
    [remote] = [s for s in timeline.series if s.topic == "remote_work"]
    assert remote.points[-1].stance is None  # the line ends where the belief went


async def test_no_beliefs_is_a_short_answer_without_a_picture(runtime: Runtime) -> None:
    answer = await command(runtime, "timeline", community=COMMUNITY, moderator=False)
    assert answer.ok and answer.files == () and "no beliefs" in answer.text


def test_the_band_narrows_with_confidence_and_towards_zero() -> None:
    assert reach(0.0, 0.0) == pytest.approx((-0.1, 0.1))
    low, high = reach(0.2, 0.0)
    assert high - 0.2 == pytest.approx(0.1) and 0.2 - low == pytest.approx(0.1 / 1.2)
    sure_low, sure_high = reach(0.2, 1.0)
    assert sure_high - sure_low < high - low
    assert reach(-0.2, 0.5) == pytest.approx((-0.2 - 0.1 / 1.5, -0.2 + 0.1 / 1.7))
    assert BeliefSeries(topic="t", points=()).at(3) is None


async def test_the_terminal_writes_the_png_and_prints_its_path(
    tmp_path: Path, anthropic_server: AnthropicFake
) -> None:
    from tests.integration.timeline_scenario import teach

    teach(anthropic_server.brain)
    data = tmp_path / "data"
    proc = await _start_bot(data, anthropic_server.base_url, tmp_path)
    script = "\n".join(
        [
            "/as Maria",
            "A meta-analysis of reactor safety records says it is the safest.",
            "ok",
            "and?",
            "fine",
            "/sonality timeline",
        ]
    )
    out, err = await proc.communicate(script.encode() + b"\n")
    assert proc.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert len(lines) == 6  # one answer line per input line
    path = Path(lines[-1])
    assert path.is_absolute() and path.parent == data.resolve()
    assert path.name == "timeline-v4.png"
    assert png_size(await asyncio.to_thread(path.read_bytes)) == (WIDTH_PX, HEIGHT_PX)


async def test_a_forgotten_member_shows_only_as_a_pseudonym(
    runtime: Runtime, played: Played
) -> None:
    before = await timeline_of(runtime)
    tom = sorted(
        (m.version, m.topic) for s in before.series for m in s.moves if m.member_id == TOM.id
    )
    assert tom and "Tom" in {m.name for m in before.members}
    await command(runtime, "forget-me", "confirm", community=COMMUNITY, user=TOM, moderator=False)
    after = await timeline_of(runtime)
    [marker] = [m for m in after.markers if m.kind == "forget-me"]
    assert marker.version > played.rollback
    moves = [m for s in after.series for m in s.moves]
    # Tom's past moves stay on the picture (history is append-only), now credited to one
    # pseudonym; his id and name appear nowhere.
    assert TOM.id not in {m.member_id for m in moves}
    assert "Tom" not in {m.name for m in after.members}
    [pseudonym] = {m.member_id for m in moves if (m.version, m.topic) in set(tom)}
    assert pseudonym is not None and pseudonym.startswith("member-")
    assert {(m.id, m.name) for m in after.members if m.id != MARIA.id} == {(pseudonym, pseudonym)}
    assert ("Maria", 5) in [(m.name, m.moves) for m in after.members]
    assert "Tom" not in caption(after) + alt_text(after)
