"""The seed's plain `EpisodeStore` (sonality) and the bot's (chroma_memory) agree.

Both implement `EpisodeMemory`; the agent must recall the same memories whichever it
is given. Real Chroma, real MiniLM model.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from chroma_memory.community_store import CommunityEpisodeStore
from chroma_memory.embedding import FastMiniLML6V2
from chroma_memory.shared_chroma import ChromaHandle
from sonality.memory.episodes import SEMANTIC, Episode, EpisodeMemory, EpisodeStore
from sonality.store import HiddenRange

NUCLEAR = "Nuclear power plants are a safe, low-carbon source of electricity"
REACTORS = "Reactors are safer than their reputation"
SOURDOUGH = "Sourdough bread needs a long, cold fermentation for flavour"
TAX = "A progressive income tax with fewer loopholes is fairer"
ATOMIC = "Atomic energy has the lowest death rate per unit of electricity"
QUERY = "Is atomic energy dangerous?"


def _fill(store: EpisodeMemory) -> None:
    store.store_many(
        [
            Episode(id="e1", summary=NUCLEAR, ess_score=0.2, interaction=1, user_message="m1"),
            Episode(id="e2", summary=SOURDOUGH, ess_score=0.9, interaction=2, user_message="m2"),
            Episode(id="e3", summary=TAX, ess_score=0.5, interaction=3, user_message="m3"),
            Episode(id="e4", summary=ATOMIC, ess_score=0.8, interaction=4, user_message="m4"),
            Episode(id="s1", summary=REACTORS, ess_score=1, memory_type=SEMANTIC, user_message=""),
        ]
    )


@pytest.fixture
def both(
    tmp_path: Path, chroma: ChromaHandle, embedding_function: FastMiniLML6V2
) -> tuple[EpisodeStore, CommunityEpisodeStore]:
    """The seed's store, and the bot's on embedded Chroma, then on a Chroma server."""
    plain = EpisodeStore(tmp_path / "plain", embedding_function=embedding_function)
    fast = CommunityEpisodeStore(None, client=chroma, embedding_function=embedding_function)
    _fill(plain)
    _fill(fast)
    return plain, fast


def test_seed_signature_stores_and_recalls(
    tmp_path: Path, embedding_function: FastMiniLML6V2
) -> None:
    store = EpisodeStore(tmp_path / "seed", embedding_function=embedding_function)
    episode_id = store.store("user text", "bot text", 0.6, ["energy"], NUCLEAR, 5)
    assert store.count() == 1
    assert store.retrieve(QUERY) == [NUCLEAR]
    assert store.retrieve_typed(QUERY) == [NUCLEAR]
    (row,) = store.stored([episode_id])
    assert row["document"] == NUCLEAR
    assert "user text" not in str(row) and "bot text" not in str(row)


def test_both_stores_rank_and_type_alike(both: tuple[EpisodeStore, CommunityEpisodeStore]) -> None:
    plain, fast = both
    assert plain.count() == fast.count() == 5
    typed = plain.retrieve_typed(QUERY)
    assert typed[0] == REACTORS  # semantic memories first
    assert set(typed[1:]) == {NUCLEAR, ATOMIC}  # the unrelated ones fall below the floor
    assert typed == fast.retrieve_typed(QUERY)
    assert plain.retrieve(QUERY, n_results=3) == fast.retrieve(QUERY, n_results=3)
    assert plain.recent_summaries(2) == fast.recent_summaries(2) == [SOURDOUGH, TAX, ATOMIC]


def test_both_stores_hide_alike_and_the_bots_ranks_waiting_episodes(
    both: tuple[EpisodeStore, CommunityEpisodeStore], embedding_function: FastMiniLML6V2
) -> None:
    plain, fast = both
    hidden: list[HiddenRange] = [(3, 4, 1)]  # interaction 4 undone by a rollback
    waiting_text = "Nuclear reactors rarely hurt anyone"
    (vector,) = embedding_function([waiting_text])
    waiting = [
        Episode(
            id="w1",
            user_message="",
            summary=waiting_text,
            ess_score=0.5,
            interaction=9,
            embedding=tuple(float(x) for x in vector),
        )
    ]
    assert ATOMIC not in plain.retrieve_typed(QUERY, hidden=hidden)
    assert plain.retrieve_typed(QUERY, hidden=hidden) == fast.retrieve_typed(QUERY, hidden=hidden)
    # Only the bot's store is handed episodes still waiting for the write-behind writer.
    got = fast.retrieve_typed(QUERY, unwritten=waiting, hidden=hidden)
    assert ATOMIC not in got and waiting_text in got
    assert plain.recent_summaries(0, hidden=hidden) == [NUCLEAR, SOURDOUGH, TAX]
    assert fast.recent_summaries(0, hidden=hidden) == [NUCLEAR, SOURDOUGH, TAX]


def test_both_stores_find_insights_by_text_and_show_what_they_keep(
    both: tuple[EpisodeStore, CommunityEpisodeStore],
) -> None:
    """What a forget-me (`semantic_ids`) and a member's data export (`stored`) ask of
    any `EpisodeMemory`: the seed's store answered neither question before."""
    plain, fast = both
    wanted = [REACTORS, NUCLEAR, "never stored"]  # NUCLEAR is an episode, not an insight
    assert plain.semantic_ids(wanted) == fast.semantic_ids(wanted) == ["s1"]
    assert plain.semantic_ids([]) == fast.semantic_ids([]) == []
    for store in both:
        rows = store.stored(["e1", "s1", "absent"])
        assert sorted(r["document"] for r in rows) == sorted([NUCLEAR, REACTORS])
