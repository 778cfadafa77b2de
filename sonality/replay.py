"""Recompute the opinions from the evidence log, leaving some members or messages out.

A forget-me must undo a member's influence, and a deleted message its own. The rules
are deterministic, so replaying the log from the seed through the agent's own steps,
without those messages, gives the opinions as if they had never been sent. The tunables
are the replaying agent's `EngineConfig` (each decay keeps its recorded rate). Everything
the messages derive is recomputed: opinions and their bookkeeping, the topic counts and the
disagreement rate (`behavioral_signature`), and the recent shifts; no LLM, no store.

A member's own topics (labels only their messages produced) are their words too: the
narrative loses them as well (`without_labels`), as do the change texts and past
versions (`storage.forget`, which uses the same function).
"""

from __future__ import annotations

import contextlib
import gc
import re
import threading
import time
from collections.abc import Collection, Iterable, Iterator
from typing import Any

from sonality.config import EngineConfig, or_environment
from sonality.ess import ESSResult
from sonality.evidence import DECAY, MESSAGE, ROLLBACK, EvidenceStep, RecordedESS
from sonality.opinions import apply_due, disagrees, update_opinions, update_topics
from sonality.rollback import rebase
from sonality.state import SpongeState

#: What a forgotten member's words and own topics are replaced with where text stays.
FORGOTTEN_TEXT = "(forgotten)"


#: The longest one pause may be extended by replays joining it, in seconds.
MAX_PAUSE_SECONDS = 30.0

_paused = 0
_paused_since = 0.0
_pause_lock = threading.Lock()
_was_enabled = True


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a whole log is parsed and replayed.

    Why: a log of 100,000 steps is a few hundred thousand tracked objects, and each full
    collection the parsing sets off walks all of them while it holds every thread,
    the event loop's too (about 100 ms at 100,000 interactions, figure 7b). The parsed
    steps hold no cycles and are freed by their reference counts once the replay is
    done, so nothing is lost by not collecting meanwhile. Drop them before leaving
    (`release_in_slices`), or the next young collection walks them.

    Concurrent replays share one pause: the last to leave turns the collector back on,
    and only if it was on when the first came in. A replay does not join a pause older
    than `MAX_PAUSE_SECONDS` (it runs with the collector as it is), so members deleting
    messages in several communities in turn cannot keep the collector off for good.
    """
    global _paused, _paused_since, _was_enabled
    with _pause_lock:
        joined = _paused == 0 or time.monotonic() - _paused_since <= MAX_PAUSE_SECONDS
        if _paused == 0:
            _was_enabled = gc.isenabled()
            _paused_since = time.monotonic()
            gc.disable()
        if joined:
            _paused += 1
    try:
        yield
    finally:
        if joined:
            with _pause_lock:
                _paused -= 1
                if _paused == 0 and _was_enabled:
                    gc.enable()


def release_in_slices(items: list[Any], size: int = 1024) -> None:
    """Empty `items` a slice at a time, from the end.

    Why: dropping the last reference to a list of 100,000 parsed steps frees them all
    in one call into C, which holds every thread (the event loop's too) for as long as
    that takes, about 100 ms. Freed a slice at a time, the interpreter can switch
    threads between slices. Call it from a worker thread when nothing else refers to
    the items any more."""
    while items:
        del items[-size:]


class ReplayError(ValueError):
    """The evidence log cannot be replayed (for example a rollback to an unknown state)."""


def ess_of(recorded: RecordedESS) -> ESSResult:
    return ESSResult(**recorded.model_dump())


def apply_message(
    state: SpongeState, step: EvidenceStep, config: EngineConfig | None = None
) -> None:
    """One learned message, in `SonalityAgent._post_process`'s order, under `config`
    (the environment's when none is given)."""
    if step.ess is None:
        raise ReplayError(f"message step {step.interaction_id!r} has no ESS result")
    ess = ess_of(step.ess)
    state.interaction_count += 1
    update_topics(state, ess, config=config)
    disagreed = disagrees(state, ess)
    # Skipped when nothing is due: no effect, and most of the cost on a long log.
    if any(u.due_interaction <= state.interaction_count for u in state.staged_opinion_updates):
        apply_due(state)
    update_opinions(
        state,
        ess,
        interaction_id=step.interaction_id,
        member=step.member,
        version=step.version,
        config=config,
    )
    state.track_disagreement(disagreed)


def replay(
    steps: Iterable[EvidenceStep],
    *,
    without_members: Collection[str] = (),
    without_interactions: Collection[str] = (),
    seed: SpongeState | None = None,
    config: EngineConfig | None = None,
) -> SpongeState:
    """The opinions after `steps` from `seed` under `config` (the environment's when
    none is given), without the given members' messages and interactions. A rollback
    step restores the replayed state of its target version, so evidence a moderator
    undid stays undone."""
    config = or_environment(config)  # one config for the whole log
    members = set(without_members)
    interactions = set(without_interactions)
    ordered = list(steps)
    targets = sorted({s.target_version for s in ordered if s.kind == ROLLBACK}, reverse=True)
    saved: dict[int, SpongeState] = {}
    state = (seed or SpongeState()).model_copy(deep=True)
    for step in ordered:
        # A target's state is the one before the first step of a later version.
        while targets and targets[-1] < step.version:
            saved[targets.pop()] = state.model_copy(deep=True)
        if step.kind == MESSAGE:
            if step.member in members or step.interaction_id in interactions:
                continue
            apply_message(state, step, config)
        elif step.kind == DECAY:
            state.decay_beliefs(step.rate)
        elif step.kind == ROLLBACK:
            target = saved.get(step.target_version)
            if target is None:
                raise ReplayError(f"rollback to v{step.target_version} before it was replayed")
            state = rebase(target, state.interaction_count)
    return state


def without_labels(text: str, labels: Collection[str]) -> str:
    """`text` with every whole occurrence of a topic label (not inside a longer word or
    label: "art" leaves "smart" and "art_history" alone) replaced by `FORGOTTEN_TEXT`."""
    for label in sorted((x for x in labels if x and x in text), key=len, reverse=True):
        text = re.sub(rf"(?<!\w){re.escape(label)}(?!\w)", FORGOTTEN_TEXT, text)
    return text


def own_topics(
    steps: Iterable[EvidenceStep], members: Collection[str], interactions: Collection[str] = ()
) -> set[str]:
    """Topics only the messages of `members` (and the messages `interactions`) produced
    (no other message named them): once those are forgotten the label itself is their
    word."""
    theirs: set[str] = set()
    others: set[str] = set()
    for step in steps:
        if step.kind == MESSAGE and step.ess is not None:
            left_out = step.member in members or step.interaction_id in interactions
            (theirs if left_out else others).update(step.ess.topics)
    return theirs - others


def forgotten(
    steps: Iterable[EvidenceStep],
    current: SpongeState,
    without_members: Collection[str],
    drop_insights: Collection[str],
    drop_topics: Collection[str] = (),
    without_interactions: Collection[str] = (),
    *,
    config: EngineConfig | None = None,
    seed: SpongeState | None = None,
) -> tuple[SpongeState, list[str]]:
    """The version after `current` with everything the log derives replayed without
    `without_members` and the messages `without_interactions`, and the topics that
    moved (their own topics left out: naming them would keep their words).
    `drop_insights` (drawn from their messages) go, so reflection cannot bring their
    words back; `drop_topics` (their own topics) leave the narrative too.

    With `seed` (a stored state), `steps` are only the log after it: the replay starts
    there instead of from the first message. Own topics cannot be told from part of
    the log, so `drop_topics` must then hold them all."""
    ordered = list(steps)
    members = set(without_members)
    interactions = set(without_interactions)
    labels = set(drop_topics)
    if seed is None:
        labels |= own_topics(ordered, members, interactions)
    replayed = rebase(
        replay(
            ordered,
            without_members=members,
            without_interactions=interactions,
            seed=seed,
            config=config,
        ),
        current.interaction_count,
    )
    state = current.model_copy(deep=True)
    state.opinion_vectors = replayed.opinion_vectors
    state.belief_meta = replayed.belief_meta
    state.staged_opinion_updates = replayed.staged_opinion_updates
    state.behavioral_signature = replayed.behavioral_signature
    state.recent_shifts = replayed.recent_shifts
    drop = set(drop_insights)
    state.pending_insights = [
        without_labels(i, labels) for i in state.pending_insights if i not in drop
    ]
    state.snapshot = without_labels(state.snapshot, labels)
    state.version = current.version + 1
    moved = sorted(
        t
        for t in set(current.opinion_vectors) | set(state.opinion_vectors)
        if current.opinion_vectors.get(t) != state.opinion_vectors.get(t) and t not in labels
    )
    return state, moved
