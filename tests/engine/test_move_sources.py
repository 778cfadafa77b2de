"""Per-member provenance of staged updates survives netting and commits (issue 11)."""

from __future__ import annotations

from sonality.state import MoveSource, SpongeState


def test_netted_updates_keep_every_source_largest_first() -> None:
    s = SpongeState()
    s.stage_opinion_update("ai", 1.0, 0.02, 2, "a", interaction_id="m1", member="u1", version=3)
    s.stage_opinion_update("ai", -1.0, 0.05, 2, "b", interaction_id="m2", member="u2", version=3)
    s.stage_opinion_update("tax", 1.0, 0.01, 5, "c", interaction_id="m3", member="u3", version=3)
    s.interaction_count = 2

    assert s.apply_due_staged_updates() == ["ai -0.030 (2 updates)"]

    meta = s.belief_meta["ai"]
    assert meta.moved_by == [
        MoveSource(interaction_id="m2", member="u2", version=3, delta=-0.05),
        MoveSource(interaction_id="m1", member="u1", version=3, delta=0.02),
    ]
    [waiting] = s.staged_opinion_updates  # not due yet: still carries its source
    assert (waiting.interaction_id, waiting.member, waiting.version) == ("m3", "u3", 3)


def test_sources_survive_a_stored_round_trip_and_old_states_still_load() -> None:
    s = SpongeState()
    s.stage_opinion_update("ai", 1.0, 0.02, 0, interaction_id="m1", member="u1", version=7)
    s.apply_due_staged_updates()
    loaded = SpongeState.from_json(s.model_dump_json())
    assert loaded.belief_meta["ai"].moved_by[0].member == "u1"
    old = SpongeState.from_json(
        '{"belief_meta": {"ai": {"confidence": 0.2, "provenance": "x"}},'
        ' "staged_opinion_updates": [{"topic": "ai", "signed_magnitude": 0.1,'
        ' "staged_at": 1, "due_interaction": 4, "provenance": "y"}]}'
    )
    assert old.belief_meta["ai"].moved_by == []
    assert old.staged_opinion_updates[0].member == ""


def test_a_later_commit_replaces_the_credit_of_the_previous_move() -> None:
    s = SpongeState()
    s.stage_opinion_update("ai", 1.0, 0.02, 0, interaction_id="m1", member="u1", version=1)
    s.apply_due_staged_updates()
    s.stage_opinion_update("ai", 1.0, 0.02, 0, interaction_id="m2", member="u2", version=2)
    s.apply_due_staged_updates()
    assert [m.member for m in s.belief_meta["ai"].moved_by] == ["u2"]
