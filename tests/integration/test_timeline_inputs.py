"""What members type reaches the timeline and the credits as text, never as markup or
an error, and a member's platform id never shows.

- Names with `$...$` ("Tom$$", "$\\x$") are drawn as typed: matplotlib would read
  them as mathtext and fail every timeline of the community.
- A trailing number that is not a day count ("²", "--5", 5,000 digits) is answered
  with the usage, not the internal-error apology.
- A member whose only message was deleted has no name any more: `history` credits
  "a member" and the timeline groups them under a neutral legend entry, while a
  forgotten member keeps their pseudonym.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Text

from bot.messages import INTERNAL_ERROR, IncomingMessage, User
from bot.runtime import Runtime
from bot.timeline import (
    MAX_DAYS,
    MAX_MEMBERS,
    UNNAMED_MEMBER,
    BeliefPoint,
    BeliefSeries,
    CommittedMove,
    Member,
    Timeline,
    TimelineError,
    _legend_entries,
    _member_styles,
    build_timeline,
    parse_args,
    render_png,
)
from tests.fakes.anthropic_server import AnthropicFake
from tests.integration.conftest import command, say
from tests.integration.timeline_scenario import COMMUNITY, operator_sets, teach

MARIA = User(id="u-maria", name="Maria")
#: A Discord-like id: the thing that must never be shown.
TOM = User(id="987654321012345678", name="Tom")
ARGUMENT = "A remote work study found output rose by 13%."  # a rule of `teach`


def small_timeline(members: list[tuple[str, str, bool]], community: str = "Alpha") -> Timeline:
    """One belief, one move per member (id, name, named)."""
    moves = tuple(
        CommittedMove(
            version=2 + i,
            interaction=2 + i,
            topic="remote_work",
            stance=0.1 * (i + 1),
            member_id=member_id,
            updates=1,
            contributors=(member_id,),
        )
        for i, (member_id, _, _) in enumerate(members)
    )
    last = 2 + len(members)
    return Timeline(
        community=community,
        first_version=0,
        last_version=last,
        first_interaction=0,
        last_interaction=last,
        series=(
            BeliefSeries(
                topic="remote_work",
                points=(
                    BeliefPoint(version=0, interaction=0, stance=None),
                    BeliefPoint(version=2, interaction=2, stance=0.2, confidence=0.3),
                ),
                moves=moves,
            ),
        ),
        members=tuple(Member(id=i, name=name, moves=1, named=named) for i, name, named in members),
    )


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Figure]]:
    """The figures `render_png` saves in this process, to read every text they drew."""
    figures: list[Figure] = []
    save = Figure.savefig

    def keep(self: Figure, *args: Any, **kwargs: Any) -> Any:
        result = save(self, *args, **kwargs)
        figures.append(self)
        return result

    monkeypatch.setattr(Figure, "savefig", keep)
    yield figures


def texts(figure: Figure) -> list[Text]:
    return [t for t in figure.findobj(Text) if isinstance(t, Text) and t.get_text()]


# ---------------------------------------------------------------------- mathtext


@pytest.mark.parametrize("name", ["$\\x$", "$a^{$", "Bob$$", "$5 and $6", "a$\\sqrt{x}$b"])
def test_a_member_name_with_dollars_is_drawn_as_typed(name: str, drawn: list[Figure]) -> None:
    png = render_png(small_timeline([("u1", name, True)]))
    assert png.startswith(b"\x89PNG")
    [figure] = drawn
    shown = texts(figure)
    assert name in {t.get_text() for t in shown}  # the legend entry, verbatim
    assert not [t.get_text() for t in shown if t.get_parse_math()]


@pytest.mark.parametrize("community", ["$\\x$", "Fund $5 or $6", "$a^{$"])
def test_a_community_name_with_dollars_is_drawn_as_typed(
    community: str, drawn: list[Figure]
) -> None:
    png = render_png(small_timeline([("u1", "Alice", True)], community))
    assert png.startswith(b"\x89PNG")
    [figure] = drawn
    shown = texts(figure)
    assert any(t.get_text().startswith(f"Opinion timeline of {community}\n") for t in shown)
    assert not [t.get_text() for t in shown if t.get_parse_math()]


async def test_a_member_called_tom_dollars_does_not_break_the_timeline(
    runtime: Runtime, anthropic_server: AnthropicFake
) -> None:
    teach(anthropic_server.brain)
    await operator_sets(runtime, COMMUNITY, opinion_cooling_period=1)
    await say(runtime, ARGUMENT, community=COMMUNITY, user=User(id="u-tom", name="Tom$$"))
    await say(runtime, "hello", community=COMMUNITY)
    await say(runtime, "hello again", community=COMMUNITY)
    timeline = await build_timeline(runtime.db, COMMUNITY.id, COMMUNITY.name)
    assert "Tom$$" in {m.name for m in timeline.members}
    result = await command(runtime, "timeline", community=COMMUNITY, moderator=False)
    assert result.ok and result.text != INTERNAL_ERROR
    [picture] = result.files
    assert picture.data.startswith(b"\x89PNG")


# ---------------------------------------------------------------------- days


@pytest.mark.parametrize("bad", ["²", "--5", "-3", "+-1", "\u22125", "0", "366", "9" * 5000])
def test_days_that_are_no_day_count_get_the_usage(bad: str) -> None:
    with pytest.raises(TimelineError) as refused:
        parse_args(("nuclear energy", bad))
    assert not refused.value.ok
    assert f"1 to {MAX_DAYS}" in refused.value.text
    assert "Usage: `/sonality timeline [topic] [days]`." in refused.value.text
    assert len(refused.value.text) < 200  # a wall of digits is not repeated


def test_days_in_any_script_of_decimal_digits_are_read() -> None:
    assert parse_args(("\u0663",)) == (None, 3)  # Arabic-Indic 3
    assert parse_args(("nuclear energy", "\uff13\uff10")) == ("nuclear_energy", 30)  # full width
    assert parse_args(("+7",)) == (None, 7)
    assert parse_args(("covid", "19", "5")) == ("covid_19", 5)


async def test_the_command_answers_a_bad_day_count_with_the_usage(
    runtime: Runtime, anthropic_server: AnthropicFake
) -> None:
    await say(runtime, "hello")
    for arg in ("²", "--5", "9" * 5000):
        result = await command(runtime, "timeline", arg, moderator=False)
        assert result.text != INTERNAL_ERROR, arg[:5]
        assert not result.ok and result.private
        assert "Usage: `/sonality timeline" in result.text


# ---------------------------------------------------------------------- unnamed members


def test_members_without_a_name_share_one_neutral_legend_entry(drawn: list[Figure]) -> None:
    alone = small_timeline([(TOM.id, UNNAMED_MEMBER, False)])
    _, labels = _legend_entries(alone, _member_styles(alone.members), Line2D)
    assert labels == [UNNAMED_MEMBER]

    named = [(f"u{i}", f"Named {i}", True) for i in range(MAX_MEMBERS + 1)]
    crowded = small_timeline([*named, (TOM.id, UNNAMED_MEMBER, False), ("u-x", "a member", False)])
    styles = _member_styles(crowded.members)
    _, labels = _legend_entries(crowded, styles, Line2D)
    assert labels == [f"Named {i}" for i in range(MAX_MEMBERS)] + ["3 other members"]
    # The overflow and the unnamed are drawn alike, in the grouped entry's style.
    assert styles[TOM.id] == styles["u-x"] == styles[f"u{MAX_MEMBERS}"]
    assert len(set(styles.values())) == MAX_MEMBERS + 1

    render_png(crowded)
    [figure] = drawn
    assert not [t.get_text() for t in texts(figure) if TOM.id in t.get_text()]


async def tom_argues(runtime: Runtime, anthropic_server: AnthropicFake) -> None:
    """Maria argues, Tom argues once (message 555), and both commit."""
    teach(anthropic_server.brain)
    await operator_sets(runtime, COMMUNITY, opinion_cooling_period=1)
    await say(runtime, "Morning all", community=COMMUNITY)
    await say(
        runtime, "I think office collaboration sparks ideas.", community=COMMUNITY, user=MARIA
    )
    await runtime.handle(
        IncomingMessage(
            community=COMMUNITY, channel_id="c1", message_id="555", user=TOM, text=ARGUMENT
        )
    )
    await runtime.drain()
    for n in range(3):
        await say(runtime, f"chat {n}", community=COMMUNITY)
    history = await command(runtime, "history", "all", community=COMMUNITY)
    assert "argued by Tom (v3, ESS 0.80)" in history.text


async def test_a_member_whose_only_message_was_deleted_shows_as_a_member(
    runtime: Runtime, anthropic_server: AnthropicFake, drawn: list[Figure]
) -> None:
    await tom_argues(runtime, anthropic_server)
    assert await runtime.message_deleted("test", "555") == 1

    history = await command(runtime, "history", "all", community=COMMUNITY)
    assert f"argued by {UNNAMED_MEMBER} (v3, ESS 0.80)" in history.text
    assert "argued by Maria (v2, ESS 0.60)" in history.text
    beliefs = await command(runtime, "beliefs", community=COMMUNITY)
    for view in (history.text, beliefs.text):
        assert TOM.id not in view and "Tom" not in view

    timeline = await build_timeline(runtime.db, COMMUNITY.id, COMMUNITY.name)
    # His move stays on the picture (history is append-only), credited to no name.
    assert TOM.id in {m.member_id for s in timeline.series for m in s.moves}
    assert [(m.name, m.named) for m in timeline.members] == [
        ("Maria", True),
        (UNNAMED_MEMBER, False),
    ]
    _, labels = _legend_entries(timeline, _member_styles(timeline.members), Line2D)
    assert labels[:2] == ["Maria", "1 other member"]
    render_png(timeline)
    [figure] = drawn
    assert not [t.get_text() for t in texts(figure) if TOM.id in t.get_text()]


async def test_a_forgotten_member_keeps_their_pseudonym_in_the_credits(
    runtime: Runtime, anthropic_server: AnthropicFake
) -> None:
    await tom_argues(runtime, anthropic_server)
    await command(runtime, "forget-me", "confirm", community=COMMUNITY, user=TOM, moderator=False)

    timeline = await build_timeline(runtime.db, COMMUNITY.id, COMMUNITY.name)
    [forgotten] = [m for m in timeline.members if m.name != "Maria"]
    assert forgotten.named and forgotten.name.startswith("member-")
    assert forgotten.id == forgotten.name  # as before: the pseudonym is id and name
    history = await command(runtime, "history", "all", community=COMMUNITY)
    assert f"argued by {forgotten.name} (v3" in history.text
    assert TOM.id not in history.text and "Tom" not in history.text
