"""`sonality.memory.sponge` as 002 and 003 describe it: the state's fields and their
defaults, belief arithmetic, and the version history `save` keeps."""

from __future__ import annotations

import inspect
import json
import math
from pathlib import Path

import pytest

from sonality.memory.sponge import (
    SEED_SNAPSHOT,
    BehavioralSignature,
    BeliefMeta,
    Shift,
    SpongeState,
)


def confidence_for(evidence: int) -> float:
    """003: min(1, log2(evidence + 1) / log2(20))."""
    return min(1.0, math.log2(evidence + 1) / math.log2(20))


def test_belief_meta_defaults() -> None:
    meta = BeliefMeta()
    assert (meta.confidence, meta.evidence_count, meta.last_reinforced, meta.provenance) == (
        0.0,
        1,
        0,
        "",
    )


def test_behavioral_signature_defaults() -> None:
    signature = BehavioralSignature()
    assert signature.disagreement_rate == 0.0
    assert signature.topic_engagement == {}


def test_a_shift_carries_interaction_time_text_and_size() -> None:
    shift = Shift(
        interaction=4, timestamp="2025-01-01T00:00:00+00:00", description="d", magnitude=0.2
    )
    assert (shift.interaction, shift.description, shift.magnitude) == (4, "d", 0.2)


def test_a_fresh_state_has_every_documented_default() -> None:
    state = SpongeState()
    assert state.version == 0
    assert state.interaction_count == 0
    assert state.snapshot == SEED_SNAPSHOT and len(SEED_SNAPSHOT) > 200
    assert state.opinion_vectors == {} and state.belief_meta == {}
    assert state.tone == "curious, direct, unpretentious"
    assert state.behavioral_signature == BehavioralSignature()
    assert state.recent_shifts == [] and state.pending_insights == []
    assert state.staged_opinion_updates == []
    assert state.last_reflection_at == 0
    # Defaults are per state, not shared between states.
    SpongeState().opinion_vectors["x"] = 1.0
    assert SpongeState().opinion_vectors == {}


def test_a_fresh_state_as_json_has_the_shape_003_shows() -> None:
    data = json.loads(SpongeState().model_dump_json())
    assert data["behavioral_signature"] == {"disagreement_rate": 0.0, "topic_engagement": {}}
    for key in (
        "version",
        "interaction_count",
        "snapshot",
        "opinion_vectors",
        "belief_meta",
        "tone",
        "recent_shifts",
        "pending_insights",
        "last_reflection_at",
        "staged_opinion_updates",
    ):
        assert key in data, key


def test_update_opinion_signature_and_defaults() -> None:
    params = inspect.signature(SpongeState.update_opinion).parameters
    assert list(params)[1:4] == ["topic", "direction", "magnitude"]
    assert params["provenance"].default == ""
    assert params["evidence_increment"].default == 1


def test_update_opinion_moves_counts_and_tracks_confidence() -> None:
    state = SpongeState(interaction_count=12)
    state.update_opinion("rent_control", -1.0, 0.04)
    assert state.opinion_vectors["rent_control"] == pytest.approx(-0.04)
    meta = state.belief_meta["rent_control"]
    assert meta.evidence_count == 1
    assert meta.confidence == pytest.approx(confidence_for(1))
    assert meta.last_reinforced == 12
    assert meta.provenance == ""

    state.interaction_count = 15
    state.update_opinion("rent_control", -1.0, 0.02, "ESS 0.7: a housing study", 3)
    meta = state.belief_meta["rent_control"]
    assert meta.evidence_count == 4  # a batch counts as several pieces of evidence
    assert meta.confidence == pytest.approx(confidence_for(4))
    assert (meta.last_reinforced, meta.provenance) == (15, "ESS 0.7: a housing study")


def test_confidence_saturates_and_stances_are_clamped() -> None:
    state = SpongeState()
    for _ in range(25):
        state.update_opinion("chess", 1.0, 0.3)
    assert state.opinion_vectors["chess"] == 1.0
    assert state.belief_meta["chess"].confidence == 1.0
    for _ in range(10):
        state.update_opinion("chess", -1.0, 0.5)
    assert state.opinion_vectors["chess"] == -1.0


def test_staged_updates_wait_then_commit_netted_by_topic() -> None:
    state = SpongeState(interaction_count=10)
    assert state.stage_opinion_update("ferries", 1.0, 0.05, 3) == 13
    assert state.stage_opinion_update("ferries", -1.0, 0.02, 3, provenance="p") == 13
    assert state.stage_opinion_update("trams", 1.0, 0.01, 5) == 15
    assert [u.signed_magnitude for u in state.staged_opinion_updates] == pytest.approx(
        [0.05, -0.02, 0.01]
    )

    state.interaction_count = 12
    assert state.apply_due_staged_updates() == []  # nothing due yet
    assert state.opinion_vectors == {}

    state.interaction_count = 13
    applied = state.apply_due_staged_updates()
    assert (
        len(applied) == 1 and "ferries" in applied[0] and all(isinstance(a, str) for a in applied)
    )
    assert state.opinion_vectors == {"ferries": pytest.approx(0.03)}  # +0.05 - 0.02
    assert state.belief_meta["ferries"].evidence_count == 2  # both arguments counted
    assert [u.topic for u in state.staged_opinion_updates] == ["trams"]


def test_decay_defaults_and_the_power_law() -> None:
    params = inspect.signature(SpongeState.decay_beliefs).parameters
    assert (params["decay_rate"].default, params["min_confidence"].default) == (0.15, 0.05)

    state = SpongeState(interaction_count=40)
    state.opinion_vectors = {"recent": 0.2, "old": 0.3, "well_known": 0.5, "faint": 0.1}
    state.belief_meta = {
        "recent": BeliefMeta(confidence=confidence_for(2), evidence_count=2, last_reinforced=36),
        "old": BeliefMeta(confidence=confidence_for(2), evidence_count=2, last_reinforced=10),
        "well_known": BeliefMeta(confidence=1.0, evidence_count=30, last_reinforced=0),
        "faint": BeliefMeta(confidence=0.0, evidence_count=0, last_reinforced=0),
    }
    dropped = state.decay_beliefs()
    # gap 4 < 5: untouched.
    assert state.belief_meta["recent"].confidence == pytest.approx(confidence_for(2))
    # gap 30: retention (1 + 30) ** -0.15 beats the floor min(0.6, 2 * 0.06).
    assert state.belief_meta["old"].confidence == pytest.approx(confidence_for(2) * 31**-0.15)
    # gap 40 with 30 pieces of evidence: the floor min(0.6, 1.8) = 0.6 holds.
    assert state.belief_meta["well_known"].confidence == pytest.approx(0.6)
    # Below 0.05: dropped from the beliefs and the opinions, and named.
    assert dropped == ["faint"]
    assert "faint" not in state.belief_meta and "faint" not in state.opinion_vectors


def test_only_the_last_ten_shifts_are_kept() -> None:
    state = SpongeState()
    for i in range(13):
        state.interaction_count = i
        state.record_shift(f"shift {i}", 0.01 * i)
    assert [s.description for s in state.recent_shifts] == [f"shift {i}" for i in range(3, 13)]
    assert state.recent_shifts[-1].interaction == 12
    assert state.recent_shifts[-1].magnitude == pytest.approx(0.12)
    assert state.recent_shifts[-1].timestamp  # ISO time of the shift


def test_topics_and_disagreement_are_tracked() -> None:
    state = SpongeState()
    for topic in ("jazz", "jazz", "opera"):
        state.track_topic(topic)
    assert state.behavioral_signature.topic_engagement == {"jazz": 2, "opera": 1}

    # A running mean over the interactions counted so far.
    for count, disagreed in enumerate([True, False, False, True], start=1):
        state.interaction_count = count
        state.track_disagreement(disagreed)
    assert state.behavioral_signature.disagreement_rate == pytest.approx(0.5)


def test_load_without_a_file_gives_the_seed_state(tmp_path: Path) -> None:
    assert SpongeState.load(tmp_path / "sponge.json") == SpongeState()


def test_save_keeps_every_version_in_the_history(tmp_path: Path) -> None:
    path, history = tmp_path / "sponge.json", tmp_path / "sponge_history"
    state = SpongeState()
    for version in range(3):
        state.version = version
        state.snapshot = f"{SEED_SNAPSHOT} (as of version {version})"
        state.save(path, history)
    # The current state in the file, each earlier one archived under its version.
    assert SpongeState.load(path) == state
    assert sorted(p.name for p in history.iterdir()) == ["sponge_v0.json", "sponge_v1.json"]
    for version in (0, 1):
        archived = SpongeState.load(history / f"sponge_v{version}.json")
        assert archived.version == version
        assert archived.snapshot.endswith(f"(as of version {version})")
    # Written atomically: no temporary file is left beside it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sponge.json", "sponge_history"]


def test_load_drops_the_removed_fields(tmp_path: Path) -> None:
    path = tmp_path / "sponge.json"
    old = json.loads(SpongeState(version=7, tone="wry").model_dump_json())
    old.update(vibe="sunny", affect_state={"mood": 1}, commitments=[], personality_ema={})
    path.write_text(json.dumps(old))
    loaded = SpongeState.load(path)
    assert (loaded.version, loaded.tone) == (7, "wry")
    for removed in ("vibe", "affect_state", "commitments", "personality_ema"):
        assert removed not in loaded.model_dump()


def test_the_seed_path_names_the_engine_s_own_classes() -> None:
    """`sonality.memory.sponge` re-exports `sonality.state`: a state loaded by the bot
    is an instance of the seed path's class, not a copy of it."""
    from sonality import state
    from sonality.memory import sponge

    for name in sponge.__all__:
        assert getattr(sponge, name) is getattr(state, name), name
    assert {"SpongeState", "BeliefMeta", "BehavioralSignature", "Shift"} <= set(sponge.__all__)
