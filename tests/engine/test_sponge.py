"""SpongeState arithmetic and persistence, checked against the seed formulas with exact numbers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sonality.config import MAX_RECENT_SHIFTS
from sonality.state import (
    SEED_SNAPSHOT,
    BeliefMeta,
    SpongeState,
    belief_confidence,
)


def approx(value: float) -> object:
    return pytest.approx(value, rel=1e-9, abs=1e-12)


# --- confidence -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("evidence", "expected"),
    [(0, 0.0), (1, 0.23137821315975915), (3, 0.4627564263195183), (19, 1.0), (500, 1.0)],
)
def test_belief_confidence_is_log2_of_evidence_over_log2_20(evidence: int, expected: float):
    assert belief_confidence(evidence) == approx(expected)


def test_seed_snapshot_is_a_real_text():
    assert 450 <= len(SEED_SNAPSHOT) <= 750
    assert SpongeState().snapshot == SEED_SNAPSHOT


# --- update_opinion -------------------------------------------------------------------


def test_update_opinion_new_belief():
    s = SpongeState(interaction_count=7)
    s.update_opinion("nuclear_energy", 1.0, 0.05, provenance="ESS 0.6: grid data")
    assert s.opinion_vectors["nuclear_energy"] == approx(0.05)
    meta = s.belief_meta["nuclear_energy"]
    assert meta.evidence_count == 1
    assert meta.confidence == approx(0.23137821315975915)
    assert meta.last_reinforced == 7
    assert meta.provenance == "ESS 0.6: grid data"


def test_update_opinion_existing_belief_accumulates_evidence():
    s = SpongeState()
    s.update_opinion("tax", -1.0, 0.1)
    s.interaction_count = 4
    s.update_opinion("tax", -1.0, 0.05, provenance="second", evidence_increment=2)
    assert s.opinion_vectors["tax"] == approx(-0.15)
    meta = s.belief_meta["tax"]
    assert meta.evidence_count == 3
    assert meta.confidence == approx(0.4627564263195183)
    assert meta.last_reinforced == 4
    assert meta.provenance == "second"


def test_update_opinion_new_belief_with_increment():
    s = SpongeState()
    s.update_opinion("x", 1.0, 0.01, evidence_increment=3)
    assert s.belief_meta["x"].evidence_count == 3


@pytest.mark.parametrize(
    ("start", "direction", "expected"), [(0.95, 1.0, 1.0), (-0.95, -1.0, -1.0)]
)
def test_update_opinion_clamps(start: float, direction: float, expected: float):
    s = SpongeState(opinion_vectors={"t": start}, belief_meta={"t": BeliefMeta()})
    s.update_opinion("t", direction, 0.2)
    assert s.opinion_vectors["t"] == expected


# --- staging --------------------------------------------------------------------------


def test_stage_returns_due_and_queues_signed_delta():
    s = SpongeState(interaction_count=5)
    due = s.stage_opinion_update("ai", -1.0, 0.03, cooling_period=3, provenance="p")
    assert due == 8
    (u,) = s.staged_opinion_updates
    assert (u.topic, u.signed_magnitude, u.staged_at, u.due_interaction, u.provenance) == (
        "ai",
        -0.03,
        5,
        8,
        "p",
    )
    assert "ai" not in s.opinion_vectors


def test_apply_due_nets_per_topic_and_keeps_evidence():
    s = SpongeState(interaction_count=10)
    s.stage_opinion_update("nuclear_energy", 1.0, 0.03, 3, provenance="first")
    s.interaction_count = 11
    s.stage_opinion_update("nuclear_energy", -1.0, 0.01, 2, provenance="second")
    s.stage_opinion_update("later", 1.0, 0.05, 10)

    s.interaction_count = 12
    assert s.apply_due_staged_updates() == []  # first one is due at 13

    s.interaction_count = 13
    summaries = s.apply_due_staged_updates()
    assert summaries == ["nuclear_energy +0.020 (2 updates)"]
    assert s.opinion_vectors["nuclear_energy"] == approx(0.02)
    meta = s.belief_meta["nuclear_energy"]
    assert meta.evidence_count == 2
    assert meta.confidence == approx(0.3667257913420846)
    assert meta.last_reinforced == 13
    assert meta.provenance == "second"
    assert [u.topic for u in s.staged_opinion_updates] == ["later"]
    assert s.apply_due_staged_updates() == []


def test_apply_due_negative_net_and_single_update_summary():
    s = SpongeState(opinion_vectors={"a": 0.5}, belief_meta={"a": BeliefMeta(evidence_count=4)})
    s.stage_opinion_update("a", -1.0, 0.04, 0)
    assert s.apply_due_staged_updates() == ["a -0.040 (1 update)"]
    assert s.opinion_vectors["a"] == approx(0.46)
    assert s.belief_meta["a"].evidence_count == 5


def test_apply_due_zero_net_keeps_stance_but_counts_evidence():
    s = SpongeState(opinion_vectors={"z": 0.3}, belief_meta={"z": BeliefMeta(evidence_count=1)})
    s.stage_opinion_update("z", 1.0, 0.03, 0)
    s.stage_opinion_update("z", -1.0, 0.01, 0)
    s.stage_opinion_update("z", -1.0, 0.02, 0)
    assert s.apply_due_staged_updates() == ["z +0.000 (3 updates)"]
    assert s.opinion_vectors["z"] == 0.3
    assert s.belief_meta["z"].evidence_count == 4


# --- decay ----------------------------------------------------------------------------


def test_decay_power_law_retention():
    s = SpongeState(interaction_count=10)
    s.opinion_vectors["t"] = 0.2
    s.belief_meta["t"] = BeliefMeta(confidence=0.23, evidence_count=1, last_reinforced=0)
    assert s.decay_beliefs() == []
    # belief_confidence(1) * (1 + 10) ** -0.15; the 0.06 floor is lower
    assert s.belief_meta["t"].confidence == approx(0.16147807373772755)


def test_decay_floor_protects_well_evidenced_beliefs():
    s = SpongeState(interaction_count=1000)
    s.opinion_vectors["t"] = 0.7
    s.belief_meta["t"] = BeliefMeta(confidence=0.8, evidence_count=10, last_reinforced=0)
    s.decay_beliefs()
    # retention 1001 ** -0.15 = 0.355 < floor min(0.6, 0.06 * 10) = 0.6
    assert s.belief_meta["t"].confidence == approx(0.48026226388120274)


def test_decay_skips_recent_beliefs():
    s = SpongeState(interaction_count=4)
    s.opinion_vectors["t"] = 0.2
    s.belief_meta["t"] = BeliefMeta(confidence=0.123, evidence_count=1, last_reinforced=0)
    s.decay_beliefs(decay_rate=5.0)
    assert s.belief_meta["t"].confidence == 0.123


def test_decay_is_idempotent_at_same_interaction_count():
    s = SpongeState(interaction_count=30)
    s.opinion_vectors = {"a": 0.1, "b": -0.4}
    s.belief_meta = {
        "a": BeliefMeta(confidence=0.23, evidence_count=1, last_reinforced=0),
        "b": BeliefMeta(confidence=0.6, evidence_count=5, last_reinforced=10),
    }
    s.decay_beliefs()
    first = {t: m.confidence for t, m in s.belief_meta.items()}
    s.decay_beliefs()
    assert {t: m.confidence for t, m in s.belief_meta.items()} == first
    assert first["a"] < 0.23


def test_decay_drops_weak_beliefs_from_both_maps():
    s = SpongeState(interaction_count=10)
    s.opinion_vectors = {"weak": 0.1, "strong": 0.5}
    s.belief_meta = {
        "weak": BeliefMeta(confidence=0.23, evidence_count=1, last_reinforced=0),
        "strong": BeliefMeta(confidence=0.6, evidence_count=5, last_reinforced=0),
    }
    # weak: 0.2314 / 11 = 0.021 < 0.05; strong: 0.598 * max(1/11, 0.3) = 0.179
    assert s.decay_beliefs(decay_rate=1.0) == ["weak"]
    assert "weak" not in s.opinion_vectors and "weak" not in s.belief_meta
    assert s.belief_meta["strong"].confidence == approx(0.17943120135055313)


# --- behaviour tracking -----------------------------------------------------------------


def test_record_shift_keeps_last_ten_with_iso_timestamps():
    s = SpongeState(interaction_count=3)
    for i in range(MAX_RECENT_SHIFTS + 3):
        s.record_shift(f"shift {i}", 0.01 * i)
    assert len(s.recent_shifts) == MAX_RECENT_SHIFTS == 10
    assert s.recent_shifts[0].description == "shift 3"
    assert s.recent_shifts[-1].description == "shift 12"
    assert s.recent_shifts[-1].interaction == 3
    assert s.recent_shifts[-1].timestamp.endswith("+00:00")


def test_track_topic_counts():
    s = SpongeState()
    s.track_topic("ai")
    s.track_topic("ai")
    s.track_topic("art")
    assert s.behavioral_signature.topic_engagement == {"ai": 2, "art": 1}


def test_track_disagreement_running_mean():
    s = SpongeState()
    s.track_disagreement(True)  # count 0 guarded: first sample
    assert s.behavioral_signature.disagreement_rate == 1.0
    s2 = SpongeState()
    for i, disagreed in enumerate([True, False, False, True], start=1):
        s2.interaction_count = i
        s2.track_disagreement(disagreed)
    assert s2.behavioral_signature.disagreement_rate == approx(0.5)
    s2.interaction_count = 5
    s2.track_disagreement(False)
    assert s2.behavioral_signature.disagreement_rate == approx(0.4)


def test_belief_summary_orders_by_strength():
    s = SpongeState()
    s.update_opinion("mild", 1.0, 0.1)
    s.update_opinion("strong", -1.0, 0.5)
    lines = s.belief_summary().splitlines()
    assert lines[0].startswith("strong: -0.50")
    assert lines[1].startswith("mild: +0.10")
    assert s.belief_summary(limit=1).count("\n") == 0


# --- persistence ------------------------------------------------------------------------


def test_load_missing_file_gives_seed_state(tmp_path: Path):
    s = SpongeState.load(tmp_path / "nope.json")
    assert s == SpongeState()


def test_save_load_round_trip_and_archives(tmp_path: Path):
    path = tmp_path / "data" / "sponge.json"
    history = tmp_path / "data" / "history"

    s = SpongeState()
    s.update_opinion("ai", 1.0, 0.3, provenance="p")
    s.stage_opinion_update("ai", 1.0, 0.01, 3)
    s.record_shift("moved", 0.3)
    s.save(path, history)
    assert not history.exists() or list(history.iterdir()) == []
    assert SpongeState.load(path) == s

    s.version = 1
    s.interaction_count = 2
    s.save(path, history)
    s.version = 2
    s.save(path, history)

    assert sorted(p.name for p in history.iterdir()) == ["sponge_v0.json", "sponge_v1.json"]
    assert json.loads((history / "sponge_v1.json").read_text())["version"] == 1
    assert json.loads((history / "sponge_v0.json").read_text())["interaction_count"] == 0
    loaded = SpongeState.load(path)
    assert loaded == s and loaded.version == 2
    assert [p.name for p in path.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_save_archive_uses_version_inside_existing_file(tmp_path: Path):
    path = tmp_path / "sponge.json"
    path.write_text(SpongeState(version=41).model_dump_json())
    SpongeState(version=3).save(path, tmp_path / "h")
    assert [p.name for p in (tmp_path / "h").iterdir()] == ["sponge_v41.json"]


def test_from_json_migrates_legacy_and_unknown_fields():
    old = {
        "version": 7,
        "interaction_count": 30,
        "snapshot": "old me",
        "opinion_vectors": {"ai": 0.2},
        "belief_meta": {"ai": {"confidence": 0.3, "evidence_count": 2, "mood": "x"}},
        "vibe": "chill",
        "affect_state": {"valence": 0.2},
        "commitments": ["be nice"],
        "personality_ema": {"openness": 0.5},
        "some_future_field": 1,
    }
    s = SpongeState.from_json(json.dumps(old))
    assert s.version == 7 and s.snapshot == "old me"
    assert s.belief_meta["ai"].evidence_count == 2
    assert s.staged_opinion_updates == []
    dumped = json.loads(s.model_dump_json())
    for gone in ("vibe", "affect_state", "commitments", "personality_ema", "some_future_field"):
        assert gone not in dumped
    assert SpongeState.from_json(s.model_dump_json().encode()) == s


def test_from_json_rejects_non_object():
    with pytest.raises(ValueError):
        SpongeState.from_json("[1, 2]")
