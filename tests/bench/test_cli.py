"""The benchmarks' command line: what `--help` shows and what `--only` accepts.

The figures themselves take minutes and are not run here; the command line is run as
people run it (a process; `scripts/bench.py` hands its arguments to `python -m bench`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.catalog import FIGURES, build_parser
from bench.figures import PROG

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_help_names_the_script_and_gives_one_line_per_figure() -> None:
    proc = bench("--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: {PROG} "), proc.stdout[:80]
    lines = proc.stdout.splitlines()
    for figure in FIGURES:
        [line] = [ln for ln in lines if ln.split()[:1] == [figure.name]]
        assert figure.title in line
    assert "# Sonality Bot benchmarks" not in proc.stdout  # nothing was run


@pytest.mark.parametrize(
    ("only", "unknown"),
    [("1,99", "99"), ("1,,3d", "3d"), (",", "")],
)
def test_an_unknown_figure_is_a_usage_error(only: str, unknown: str) -> None:
    proc = bench("--only", only)
    assert proc.returncode == 2
    assert f"usage: {PROG}" in proc.stderr and "Traceback" not in proc.stderr
    [error] = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert "argument --only" in error
    assert (f"no figure named {unknown} " if unknown else "name at least one figure") in error
    assert ", ".join(f.name for f in FIGURES) in error  # what would have been right
    assert proc.stdout == ""  # nothing was run


def test_every_figure_is_selectable_by_its_name() -> None:
    parser = build_parser()
    names = [figure.name for figure in FIGURES]
    assert len(set(names)) == len(names) and {"1", "3", "3m", "3s", "5"} <= set(names)
    for figure in FIGURES:
        assert parser.parse_args(["--only", figure.name]).only == (figure,)
    assert parser.parse_args([]).only == tuple(FIGURES)
    chosen = parser.parse_args(["--only", " 5, 3M,1,3m "]).only
    assert [f.name for f in chosen] == ["1", "3m", "5"]  # report order, each once


def test_a_chroma_url_is_refused_only_for_figures_that_cannot_use_it() -> None:
    """1s, 3s and 4b start their own servers and so ignore --chroma-url; any other
    figure but 1 would silently run embedded, which is a usage error."""
    proc = bench("--chroma-url", "http://127.0.0.1:9", "--only", "1s,2,3s,4b")
    assert proc.returncode == 2
    [error] = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert error.endswith("only figure 1 runs on a Chroma server so far, not 2"), error
    assert proc.stdout == ""  # nothing was run
