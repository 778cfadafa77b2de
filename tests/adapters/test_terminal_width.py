"""Command answers at an interactive terminal fit its width, broken between words."""

from __future__ import annotations

from rich.cells import cell_len

from adapters.terminal import WrappedStream, fit_status, fit_to_width

HISTORY = (
    "[History]\n"
    "v2  2026-11-28 04:42 UTC  [interaction] committed remote_work +0.020 (1 update), "
    "argued by you (v1, ESS 0.80) | during: ESS 0.02 no_argument\n"
    "  · an indented line that is long enough to need a second line at this width, too\n"
    "v0  2026-11-28 04:42 UTC  [seed] seed personality"
)


def test_long_lines_break_between_words_and_keep_every_word() -> None:
    shown = fit_to_width(HISTORY, 79)
    lines = shown.split("\n")
    assert all(len(line) <= 79 for line in lines), lines
    assert shown.split() == HISTORY.split(), "no word cut, lost or added"
    assert "remote_work" in shown.split()  # the topic the terminal used to cut in two
    assert lines[0] == "[History]" and lines[-1] == HISTORY.split("\n")[-1]  # short: as is


def test_a_continuation_is_indented_past_its_lines_own_indent() -> None:
    lines = fit_to_width(HISTORY, 60).split("\n")
    first = next(i for i, line in enumerate(lines) if line.startswith("v2"))
    assert lines[first + 1].startswith("  ") and not lines[first + 1].startswith("   ")
    bullet = next(i for i, line in enumerate(lines) if line.startswith("  · "))
    assert lines[bullet + 1].startswith("    ") and lines[bullet + 1][4] != " "


def test_a_text_that_fits_or_a_tiny_terminal_is_left_alone() -> None:
    assert fit_to_width(HISTORY, 500) == HISTORY
    assert fit_to_width(HISTORY, 10) == HISTORY


STATUS = "ESS 0.02, no argument, on small_talk · v1 · staged 0 · insights 0 · beliefs 0"


def test_the_status_line_breaks_between_its_fields_only() -> None:
    # 81 columns with its "  · ": broken between words, "beliefs" and its "0" parted.
    assert fit_status(STATUS, 80).split("\n") == [
        "  · ESS 0.02, no argument, on small_talk · v1 · staged 0 · insights 0",
        "    · beliefs 0",
    ]
    assert fit_status(STATUS, 81) == "  · " + STATUS
    lines = fit_status(STATUS, 30).split("\n")
    assert all(cell_len(line) <= 30 for line in lines), lines
    # The first field alone is wider than 30 columns: it is broken between words.
    assert lines == [
        "  · ESS 0.02, no argument, on",
        "    small_talk",
        "    · v1 · staged 0",
        "    · insights 0 · beliefs 0",
    ]
    assert fit_status(STATUS, 10) == "  · " + STATUS  # too narrow to wrap usefully


REPLY = (
    "sonality> Protected bike lanes are one of the better-studied safety measures, and "
    "the cohort studies you mention point the same way: fewer injuries per trip.\n"
    "Still, I would want to see how the counts were taken before I moved much."
)


def streamed(text: str, chunk: int, width: int | None) -> str:
    out: list[str] = []
    screen = WrappedStream(out.append, width)
    for start in range(0, len(text), chunk):
        screen.feed(text[start : start + chunk])  # chunks end inside words
    screen.close()
    return "".join(out)


def test_a_streamed_reply_breaks_between_words_however_the_chunks_fall() -> None:
    for chunk in (1, 3, 7, 50):
        shown = streamed(REPLY, chunk, 40)
        lines = shown.split("\n")
        assert all(len(line) <= 40 for line in lines), (chunk, lines)
        assert shown.split() == REPLY.split(), "no word cut, lost or added"
        assert len(lines) > REPLY.count("\n") + 1  # it did break lines
        assert "Still," in [line.split(" ")[0] for line in lines]  # the reply's own newline
        assert shown == streamed(REPLY, 1, 40)  # the same screen whatever the chunks


def test_off_a_terminal_or_too_narrow_the_stream_is_written_as_it_comes() -> None:
    assert streamed(REPLY, 7, None) == REPLY
    assert streamed(REPLY, 7, 10) == REPLY


WIDE = (
    "v3  2026-11-28 05:01 UTC  [interaction] committed 在宅勤務 +0.020, argued by 山田 "
    "(v2, ESS 0.80) 👍 | during: リモートワークの生産性についての長い議論が続いています"
)


def test_wide_characters_take_two_columns_and_a_long_run_breaks_between_them() -> None:
    shown = fit_to_width(WIDE, 30)
    lines = shown.split("\n")
    assert all(cell_len(line) <= 30 for line in lines), lines
    assert len(lines) > 3
    assert "".join(shown.split()) == "".join(WIDE.split()), "nothing lost or added"
    assert lines[0].startswith("v3  2026-11-28")  # the spaces between words as typed
    assert all(line.startswith("  ") for line in lines[1:])


def test_a_streamed_reply_in_wide_characters_fits_the_width() -> None:
    reply = "在宅勤務 は 通勤 の 時間 を 減らし、 集中 できる 時間 を 増やす 👍 " * 4
    for chunk in (1, 5, 13):
        shown = streamed(reply, chunk, 24)
        assert all(cell_len(line) <= 24 for line in shown.split("\n")), (chunk, shown)
        assert shown.split() == reply.split()
