"""Topic engagement keeps the most engaged topics only, deterministically."""

from __future__ import annotations

import random

from sonality.state import MAX_TRACKED_TOPICS, SpongeState, prune_engagement


def test_engagement_is_bounded_and_keeps_the_most_engaged() -> None:
    state = SpongeState()
    for _ in range(5):
        state.track_topic("ai")
    for n in range(3 * MAX_TRACKED_TOPICS):
        state.track_topic(f"one_off_{n:03d}")
    engagement = state.behavioral_signature.topic_engagement
    assert len(engagement) == MAX_TRACKED_TOPICS
    assert engagement["ai"] == 5
    # The topic just counted is never the one dropped, so a newcomer gets a chance.
    assert f"one_off_{3 * MAX_TRACKED_TOPICS - 1:03d}" in engagement


def test_a_topic_mentioned_again_climbs_past_the_one_offs() -> None:
    state = SpongeState()
    for n in range(MAX_TRACKED_TOPICS):
        state.track_topic(f"old_{n:02d}")
    state.track_topic("rising")
    state.track_topic("rising")
    for n in range(MAX_TRACKED_TOPICS):
        state.track_topic(f"new_{n:02d}")
    engagement = state.behavioral_signature.topic_engagement
    assert engagement["rising"] == 2
    assert not any(topic.startswith("old_") for topic in engagement)


def test_ties_drop_the_topic_seen_first_and_survivors_keep_their_order() -> None:
    engagement = {"delta": 1, "alpha": 1, "charlie": 3, "bravo": 1, "echo": 2}
    assert prune_engagement(engagement, 3, keep="delta") == ["alpha", "bravo"]
    assert list(engagement) == ["delta", "charlie", "echo"]
    assert prune_engagement(engagement, 3) == []
    assert prune_engagement(engagement, 1) == ["delta", "echo"]


def test_pruning_replays_to_the_same_state_whatever_the_history_was() -> None:
    rng = random.Random(7)
    topics = [rng.choice([f"t{n}" for n in range(120)]) for _ in range(2000)]
    first, second = SpongeState(), SpongeState()
    for topic in topics:
        first.track_topic(topic)
    for topic in topics:
        second.track_topic(topic)
    assert first.behavioral_signature.topic_engagement == (
        second.behavioral_signature.topic_engagement
    )
    assert len(first.behavioral_signature.topic_engagement) == MAX_TRACKED_TOPICS


def test_a_state_stored_with_more_topics_is_pruned_on_its_next_message() -> None:
    state = SpongeState.model_validate(
        {"behavioral_signature": {"topic_engagement": {f"t{n:03d}": n for n in range(200)}}}
    )
    state.track_topic("t000")
    engagement = state.behavioral_signature.topic_engagement
    assert len(engagement) == MAX_TRACKED_TOPICS
    assert "t000" in engagement and engagement["t000"] == 1
    assert min(v for k, v in engagement.items() if k != "t000") == 151
