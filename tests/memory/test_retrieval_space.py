"""Which text an episode's vector is computed from, decided by a small recall evaluation.

An episode can be embedded from the member's raw message or from the neutral summary the
evidence classifier wrote of it. Whichever it is, every episode must use the same one:
all are ranked under one `min_relevance`, and insights have only their text.

`data/retrieval_space.json` holds 31 episodes (a message as members write them, and its
one-sentence summary) and questions asked later in other words, each naming what it
should recall; five are small talk that should recall nothing. Each candidate space is
stored in a real Chroma collection with the real MiniLM model and queried through
`CommunityEpisodeStore.retrieve`, so the similarity floor and the ESS weighting apply as in
production. Figures print with ``pytest -s``.

Measured when the choice was made (recall@3 / MRR over 49 questions, small talk silent):

* from the summary: 0.952 / 0.929, 5 of 5 small-talk questions silent
* from the message: 0.942 / 0.939, 5 of 5 silent
* mixed (every other episode from its summary, as live and replayed episodes were):
  0.935 / 0.949

A tie within one or two questions, so the summary was chosen for what else it gives:
insights can only be embedded from their text, and a vector of the raw message would
outlive the message once retention deletes it (see `Episode`).

The same evaluation decides whether the bot may run the int8 copy of the model
(`SONALITY_EMBEDDING_INT8`, the default): its summaries and questions both embedded by
it, and its questions over memories the float model embedded (a bot upgraded with
memories already stored). Measured when it was made the default (2026-11-27), float
model 0.952 / 0.929: int8 0.952 / 0.929, int8 questions over float memories 0.952 /
0.929, small talk silent in both.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from chromadb.api.types import Embeddings

from chroma_memory.community_store import CommunityEpisodeStore
from chroma_memory.embedding import FastMiniLML6V2, close_chroma_client
from sonality import config
from sonality.memory.episodes import Episode, with_vectors

DATA = Path(__file__).parent / "data" / "retrieval_space.json"
TOP_K = 3
# Measured 0.952 and 0.929 for the chosen space; the floors leave room for a few
# questions to be added or reworded without the test failing for that alone.
RECALL_FLOOR = 0.90
MRR_FLOOR = 0.85


@dataclass(frozen=True)
class Question:
    text: str
    expect: frozenset[str]


@dataclass(frozen=True)
class Score:
    recall: float  # mean over answerable questions of hits in the top 3 / min(3, expected)
    mrr: float  # mean reciprocal rank of the first expected episode (0 when not recalled)
    silent: int  # small-talk questions that recalled nothing
    small_talk: int

    def line(self, name: str) -> str:
        return (
            f"{name:<10} recall@{TOP_K} {self.recall:.3f}  MRR {self.mrr:.3f}  "
            f"small talk silent {self.silent}/{self.small_talk}"
        )


@dataclass(frozen=True)
class Evaluation:
    production: Score  # vectors as `CommunityEpisodeStore` computes them for an episode without one
    summary: Score
    message: Score
    mixed: Score
    production_is_summary: bool
    int8: Score  # summaries and questions embedded by the int8 model
    int8_over_float: Score  # int8 questions, memories the float model embedded


def _load() -> tuple[list[Episode], list[Question]]:
    raw = json.loads(DATA.read_text(encoding="utf-8"))
    episodes = [
        Episode(
            id=e["id"],
            user_message=e["message"],
            summary=e["summary"],
            ess_score=e["ess"],
            interaction=n,
        )
        for n, e in enumerate(raw["episodes"], start=1)
    ]
    questions = [Question(q["text"], frozenset(q["expect"])) for q in raw["queries"]]
    return episodes, questions


def _score(
    store: CommunityEpisodeStore,
    episodes: Sequence[Episode],
    questions: Sequence[Question],
    query_vectors: Embeddings,
) -> Score:
    """Rank every stored episode for every question, as the bot would recall them."""
    by_summary = {e.summary: e.id for e in episodes}
    recalls: list[float] = []
    reciprocal: list[float] = []
    silent = 0
    for question, vector in zip(questions, query_vectors, strict=True):
        found = store.retrieve(
            question.text,
            n_results=len(episodes),
            min_relevance=config.MIN_EPISODE_RELEVANCE,
            query_embedding=[vector],
        )
        ranked = [by_summary[s] for s in found]
        if not question.expect:
            silent += not ranked
            continue
        hits = question.expect & set(ranked[:TOP_K])
        recalls.append(len(hits) / min(TOP_K, len(question.expect)))
        first = next((i for i, id_ in enumerate(ranked) if id_ in question.expect), None)
        reciprocal.append(0.0 if first is None else 1.0 / (first + 1))
    return Score(
        recall=sum(recalls) / len(recalls),
        mrr=sum(reciprocal) / len(reciprocal),
        silent=silent,
        small_talk=sum(1 for q in questions if not q.expect),
    )


@pytest.fixture(scope="module")
def evaluation(
    tmp_path_factory: pytest.TempPathFactory,
    embedding_function: FastMiniLML6V2,
    int8_embedding_function: FastMiniLML6V2,
) -> Iterator[Evaluation]:
    episodes, questions = _load()
    summaries = embedding_function([e.summary for e in episodes])
    messages = embedding_function([e.user_message for e in episodes])
    query_vectors = embedding_function([q.text for q in questions])
    int8_summaries = int8_embedding_function([e.summary for e in episodes])
    int8_queries = int8_embedding_function([q.text for q in questions])

    def vectors(source: Embeddings) -> list[Episode]:
        return [
            e.model_copy(update={"embedding": tuple(np.asarray(v, dtype=float).tolist())})
            for e, v in zip(episodes, source, strict=True)
        ]

    spaces: dict[str, list[Episode]] = {
        # What the store does with an episode that comes without a vector; the agent
        # embeds the same text ahead of time (see `WriteBehindMemory.prepare`).
        "production": with_vectors(episodes, embedding_function),
        "summary": vectors(summaries),
        "message": vectors(messages),
        "mixed": [
            s if i % 2 == 0 else m
            for i, (s, m) in enumerate(zip(vectors(summaries), vectors(messages), strict=True))
        ],
        "int8": vectors(int8_summaries),
        "int8_over_float": vectors(summaries),
    }
    asked = {"int8": int8_queries, "int8_over_float": int8_queries}
    persist_dir = tmp_path_factory.mktemp("retrieval-space")
    scores: dict[str, Score] = {}
    try:
        for name, stored in spaces.items():
            store = CommunityEpisodeStore(
                persist_dir, collection=f"space-{name}", embedding_function=embedding_function
            )
            store.store_many(stored)
            scores[name] = _score(store, episodes, questions, asked.get(name, query_vectors))
    finally:
        close_chroma_client(persist_dir)
    production = np.asarray([e.embedding for e in spaces["production"]])
    yield Evaluation(
        production=scores["production"],
        summary=scores["summary"],
        message=scores["message"],
        mixed=scores["mixed"],
        production_is_summary=bool(np.allclose(production, np.asarray(summaries), atol=1e-5)),
        int8=scores["int8"],
        int8_over_float=scores["int8_over_float"],
    )


def test_episodes_are_embedded_in_the_space_that_recalls_best(evaluation: Evaluation) -> None:
    """Fails if the store's vectors move to a space that recalls fewer of the episodes
    members ask about, or if recall falls below what was measured."""
    for name in ("summary", "message", "mixed", "production", "int8", "int8_over_float"):
        print(getattr(evaluation, name).line(name))  # shown with `pytest -s`
    chosen = evaluation.production
    other = evaluation.message if evaluation.production_is_summary else evaluation.summary
    assert chosen.recall >= RECALL_FLOOR
    assert chosen.mrr >= MRR_FLOOR
    assert chosen.recall >= other.recall


def test_the_store_embeds_the_summary(evaluation: Evaluation) -> None:
    assert evaluation.production_is_summary
    assert evaluation.production == evaluation.summary


def test_small_talk_recalls_nothing_in_the_chosen_space(evaluation: Evaluation) -> None:
    """Questions unrelated to every memory stay below `min_relevance`."""
    assert evaluation.production.small_talk == 5
    assert evaluation.production.silent == evaluation.production.small_talk


@pytest.mark.parametrize("space", ["int8", "int8_over_float"])
def test_the_int8_model_recalls_as_the_float_model_does(evaluation: Evaluation, space: str) -> None:
    """Fails if the bot's default int8 model recalls fewer of the memories members ask
    about than the float model it was quantized from (one question's slack, about 0.02),
    alone or asking over memories the float model stored, or lets small talk recall."""
    got: Score = getattr(evaluation, space)
    assert got.recall >= RECALL_FLOOR and got.mrr >= MRR_FLOOR
    assert got.recall >= evaluation.summary.recall - 0.025
    assert got.mrr >= evaluation.summary.mrr - 0.025
    assert got.silent == got.small_talk == 5
