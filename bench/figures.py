"""The benchmarks' command line: one line of help per figure, and an `--only` that
knows the figures' names.

Why a table of figures rather than one `if 3 in wanted:` per figure: the help and the
check of `--only` come from the same list the run goes through, so a figure (or a
sub-figure such as 3m) is documented and selectable the moment it is registered, and
a mistyped name is a usage error (exit 2) instead of a run that silently measures
nothing, or something else.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

#: How people start the benchmarks (`python -m bench`, bench/catalog.py, runs behind it).
PROG = "python3 scripts/bench.py"

#: What runs one figure: (scratch directory, options).
FigureRun = Callable[[Path, argparse.Namespace], None]


@dataclass(frozen=True)
class Figure:
    """One line of the benchmark report, runnable on its own."""

    name: str  # what --only takes: "1", "3m"
    title: str  # its line in --help: what is measured, and the target
    run: FigureRun


def figure_names(figures: Sequence[Figure]) -> Callable[[str], tuple[Figure, ...]]:
    """The `type` of --only: "1,3m,5" -> those figures, in report order, each once."""
    by_name = {figure.name: figure for figure in figures}
    known = ", ".join(by_name)

    def parse(text: str) -> tuple[Figure, ...]:
        names = [name.strip().lower() for name in text.split(",") if name.strip()]
        if not names:
            raise argparse.ArgumentTypeError(f"name at least one figure ({known})")
        unknown = [name for name in names if name not in by_name]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"no figure named {', '.join(unknown)} (the figures are {known})"
            )
        return tuple(figure for figure in figures if figure.name in names)

    return parse


def figures_help(figures: Sequence[Figure]) -> str:
    width = max(len(figure.name) for figure in figures)
    rows = [f"  {figure.name:<{width}}  {figure.title}" for figure in figures]
    return "figures (names for --only; all of them by default):\n" + "\n".join(rows)


def build_parser(description: str, figures: Sequence[Figure]) -> argparse.ArgumentParser:
    """The parser with --only; the caller adds the figures' own options."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=description,
        epilog=figures_help(figures),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--only",
        type=figure_names(figures),
        default=tuple(figures),
        metavar="NAMES",
        help="comma-separated figure names to run, e.g. 1,3m,5 (default: all)",
    )
    return parser
