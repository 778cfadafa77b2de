"""The personality state ("sponge"): narrative, opinions and their bookkeeping.

Deterministic arithmetic only (no LLM, no clock but shift timestamps), because the state
is versioned, rolled back and replayed.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import tempfile
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sonality.config import BELIEF_DECAY_RATE, MAX_RECENT_SHIFTS
from sonality.prompts import prompt_label

log = logging.getLogger(__name__)

SEED_SNAPSHOT = (
    "I am a young mind and most of my views are still taking shape. I lean analytical: "
    "explanations that show how something works, backed by evidence, persuade me more "
    "than ideology or appeals to feeling. New ideas genuinely interest me, and when I "
    "have not thought about something yet I would rather admit it than fake an opinion. "
    "My guess is that I will end up fairly pragmatic, caring more about what actually "
    "works than about what sounds good, but I am ready to be proven wrong about that. "
    "If I disagree with you I will tell you so and explain my reasons, and if I do not "
    "know something I will tell you that too."
)

# Fields older states carried; dropped on load.
LEGACY_FIELDS = ("vibe", "affect_state", "commitments", "personality_ema")

# Confidence reaches 1 at 19 pieces of evidence: log2(n + 1) / log2(20).
_CONFIDENCE_SATURATION = 20
_DECAY_GRACE_INTERACTIONS = 5
# Retention floor: this much per piece of evidence, up to the cap.
_DECAY_FLOOR_PER_EVIDENCE = 0.06
_DECAY_FLOOR_CAP = 0.6
# A netted delta this small is float noise: no move.
_NET_ZERO_TOLERANCE = 1e-12

#: Topics whose engagement is counted: only the top 5 reach a prompt, the rest is room
#: to climb, and without a bound every version would carry every topic ever seen.
MAX_TRACKED_TOPICS = 50


def belief_confidence(evidence_count: int) -> float:
    """Logarithmic, so the first pieces of evidence count most."""
    if evidence_count <= 0:
        return 0.0
    return min(1.0, math.log2(evidence_count + 1) / math.log2(_CONFIDENCE_SATURATION))


class MoveSource(BaseModel):
    """The message behind one staged update, kept through netting so credit (and a
    forget-me) follows the cause, not whichever message closed the cooling period."""

    interaction_id: str = ""
    member: str = ""
    version: int = 0
    delta: float = 0.0


class BeliefMeta(BaseModel):
    confidence: float = 0.0
    evidence_count: int = 1
    last_reinforced: int = 0
    provenance: str = ""
    # The sources of the latest committed move, largest |delta| first.
    moved_by: list[MoveSource] = Field(default_factory=list)


class BehavioralSignature(BaseModel):
    disagreement_rate: float = 0.0
    topic_engagement: dict[str, int] = Field(default_factory=dict)


class Shift(BaseModel):
    interaction: int
    timestamp: str
    description: str
    magnitude: float


class StagedOpinionUpdate(BaseModel):
    topic: str
    signed_magnitude: float
    staged_at: int
    due_interaction: int
    provenance: str = ""
    interaction_id: str = ""
    member: str = ""
    version: int = 0

    def source(self) -> MoveSource:
        return MoveSource(
            interaction_id=self.interaction_id,
            member=self.member,
            version=self.version,
            delta=self.signed_magnitude,
        )


class HiddenMemories(BaseModel):
    """Memories a rollback put out of reach (see `sonality.store.HiddenRange`); kept,
    so undoing the rollback brings them back."""

    model_config = ConfigDict(frozen=True)

    after: int
    upto: int
    from_version: int


class SpongeState(BaseModel):
    version: int = 0
    interaction_count: int = 0
    snapshot: str = SEED_SNAPSHOT
    opinion_vectors: dict[str, float] = Field(default_factory=dict)
    belief_meta: dict[str, BeliefMeta] = Field(default_factory=dict)
    tone: str = "curious, direct, unpretentious"
    behavioral_signature: BehavioralSignature = Field(default_factory=BehavioralSignature)
    recent_shifts: list[Shift] = Field(default_factory=list)
    pending_insights: list[str] = Field(default_factory=list)
    staged_opinion_updates: list[StagedOpinionUpdate] = Field(default_factory=list)
    last_reflection_at: int = 0
    # Not in the seed: memories a rollback hid.
    hidden_memories: list[HiddenMemories] = Field(default_factory=list)

    @property
    def hidden_ranges(self) -> list[tuple[int, int, int]]:
        return [(h.after, h.upto, h.from_version) for h in self.hidden_memories]

    # --- beliefs ------------------------------------------------------------------------

    def update_opinion(
        self,
        topic: str,
        direction: float,
        magnitude: float,
        provenance: str = "",
        evidence_increment: int = 1,
        moved_by: list[MoveSource] | None = None,
    ) -> None:
        """Apply exactly this step (clamped to [-1, 1]; resistance is the caller's) and
        count `evidence_increment` pieces of evidence (a netted batch is several)."""
        old = self.opinion_vectors.get(topic, 0.0)
        self.opinion_vectors[topic] = max(-1.0, min(1.0, old + direction * magnitude))

        meta = self.belief_meta.setdefault(topic, BeliefMeta(evidence_count=0))
        meta.evidence_count += evidence_increment
        meta.confidence = belief_confidence(meta.evidence_count)
        meta.last_reinforced = self.interaction_count
        meta.provenance = provenance
        meta.moved_by = list(moved_by or [])

    def stage_opinion_update(
        self,
        topic: str,
        direction: float,
        magnitude: float,
        cooling_period: int,
        provenance: str = "",
        *,
        interaction_id: str = "",
        member: str = "",
        version: int = 0,
    ) -> int:
        """Queue a change due after `cooling_period` interactions, so a burst of pressure
        is netted against what follows; returns the due interaction count."""
        due = self.interaction_count + cooling_period
        self.staged_opinion_updates.append(
            StagedOpinionUpdate(
                topic=topic,
                signed_magnitude=direction * magnitude,
                staged_at=self.interaction_count,
                due_interaction=due,
                provenance=provenance,
                interaction_id=interaction_id,
                member=member,
                version=version,
            )
        )
        return due

    def apply_due_staged_updates(self) -> list[str]:
        """Commit the due updates, netted per topic so opposite arguments cancel.

        A zero net leaves the stance but still counts the evidence (both sides were
        heard) and so reinforces the belief. Returns e.g. "nuclear_energy +0.020
        (2 updates)" per topic.
        """
        now = self.interaction_count
        due = [u for u in self.staged_opinion_updates if u.due_interaction <= now]
        if not due:
            return []
        self.staged_opinion_updates = [
            u for u in self.staged_opinion_updates if u.due_interaction > now
        ]

        by_topic: dict[str, list[StagedOpinionUpdate]] = {}
        for update in due:
            by_topic.setdefault(update.topic, []).append(update)

        summaries: list[str] = []
        for topic, updates in by_topic.items():
            net = math.fsum(u.signed_magnitude for u in updates)
            if abs(net) <= _NET_ZERO_TOLERANCE:
                net = 0.0
            provenance = next((u.provenance for u in reversed(updates) if u.provenance), "")
            direction = 0.0 if net == 0.0 else math.copysign(1.0, net)
            sources = sorted((u.source() for u in updates), key=lambda m: -abs(m.delta))
            self.update_opinion(topic, direction, abs(net), provenance, len(updates), sources)
            noun = "update" if len(updates) == 1 else "updates"
            summaries.append(f"{topic} {net:+.3f} ({len(updates)} {noun})")
        return summaries

    def decay_beliefs(
        self, decay_rate: float = BELIEF_DECAY_RATE, min_confidence: float = 0.05
    ) -> list[str]:
        """Power-law decay of unreinforced beliefs, floored by their evidence.

        Recomputed from the evidence count, so decaying twice at one interaction count
        is the same as once. Beliefs below `min_confidence` are removed; returns them.
        """
        dropped: list[str] = []
        for topic, meta in list(self.belief_meta.items()):
            gap = self.interaction_count - meta.last_reinforced
            if gap < _DECAY_GRACE_INTERACTIONS:
                continue
            retention = (1 + gap) ** (-decay_rate)
            floor = min(_DECAY_FLOOR_CAP, _DECAY_FLOOR_PER_EVIDENCE * meta.evidence_count)
            meta.confidence = belief_confidence(meta.evidence_count) * max(retention, floor)
            if meta.confidence < min_confidence:
                del self.belief_meta[topic]
                self.opinion_vectors.pop(topic, None)
                dropped.append(topic)
        return dropped

    def belief_summary(self, limit: int | None = None) -> str:
        """Beliefs as text lines for a prompt, strongest stance first."""
        topics = sorted(self.opinion_vectors, key=lambda t: (-abs(self.opinion_vectors[t]), t))
        lines = []
        for topic in topics[:limit]:
            line = f"{prompt_label(topic)}: {self.opinion_vectors[topic]:+.2f}"
            if (meta := self.belief_meta.get(topic)) is not None:
                line += f" (confidence {meta.confidence:.2f}, evidence {meta.evidence_count})"
            lines.append(line)
        return "\n".join(lines)

    # --- behaviour tracking --------------------------------------------------------------

    def record_shift(self, description: str, magnitude: float) -> None:
        """Remember a change of mind; only the newest MAX_RECENT_SHIFTS are kept."""
        self.recent_shifts.append(
            Shift(
                interaction=self.interaction_count,
                timestamp=datetime.now(UTC).isoformat(),
                description=description,
                magnitude=magnitude,
            )
        )
        del self.recent_shifts[:-MAX_RECENT_SHIFTS]

    def track_topic(self, topic: str) -> None:
        """Count `topic` once more, keeping the MAX_TRACKED_TOPICS most engaged."""
        engagement = self.behavioral_signature.topic_engagement
        engagement[topic] = engagement.get(topic, 0) + 1
        prune_engagement(engagement, MAX_TRACKED_TOPICS, keep=topic)

    def track_disagreement(self, disagreed: bool) -> None:
        """Running mean over `interaction_count` (the caller has already counted this
        interaction)."""
        n = max(self.interaction_count, 1)
        sig = self.behavioral_signature
        sig.disagreement_rate += ((1.0 if disagreed else 0.0) - sig.disagreement_rate) / n

    # --- persistence ---------------------------------------------------------------------

    def save(self, path: Path, history_dir: Path) -> None:
        """Write atomically to `path`, first archiving the old file as
        ``history_dir/sponge_v{N}.json`` with N read from that file."""
        path = Path(path)
        history_dir = Path(history_dir)
        if path.exists():
            history_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, history_dir / _archive_name(path))

        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(self.model_dump_json(indent=2))
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, path)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise

    @classmethod
    def load(cls, path: Path) -> SpongeState:
        """A missing file means a new personality."""
        path = Path(path)
        if not path.exists():
            return cls()
        return cls.from_json(path.read_bytes())

    @classmethod
    def from_json(cls, data: str | bytes) -> SpongeState:
        """Parse a stored state; known obsolete fields are dropped with a log line,
        unknown ones silently."""
        raw: Any = json.loads(data)
        if not isinstance(raw, Mapping):
            raise ValueError("a stored sponge state must be a JSON object")
        removed = [name for name in LEGACY_FIELDS if name in raw]
        fields = {key: value for key, value in raw.items() if key not in removed}
        if removed:
            log.info("sponge migration: dropped legacy fields %s", ", ".join(removed))
        return cls.model_validate(fields)


def prune_engagement(engagement: dict[str, int], limit: int, keep: str | None = None) -> list[str]:
    """Drop the least engaged topics, oldest first among equals (dict order), until
    `limit` remain; returns them. `keep`, the topic just counted, always stays."""
    excess = len(engagement) - limit
    if excess <= 0:
        return []
    order = {topic: index for index, topic in enumerate(engagement)}
    candidates = sorted(
        (t for t in engagement if t != keep), key=lambda t: (engagement[t], order[t])
    )
    dropped = candidates[:excess]
    for topic in dropped:
        del engagement[topic]
    return dropped


def _archive_name(path: Path) -> str:
    try:
        version = json.loads(path.read_bytes()).get("version", 0)
        return f"sponge_v{int(version)}.json"
    except (ValueError, TypeError, AttributeError, OSError):
        log.warning("sponge archive: %s has no readable version; archiving as unreadable", path)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S%fZ")
        return f"sponge_unreadable_{stamp}.json"
