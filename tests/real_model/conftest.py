"""The real-model tier: llama.cpp's server with SmolLM2-135M, started once per run.

Why a tier of its own: the loopback fakes answer like a rule table; a real model, even
a tiny one, writes what a schema merely allows, loops, and takes its time, which is
how the faults of issue 24 were found. The 135M model is a fault finder for our code,
not a reference for quality: these tests check mechanics (structured answers, bounded
output, commits, a clean exit), never what the model thinks.

The tests are marked `real_model` and left out of the default run (pyproject's
`addopts`); `python3 scripts/test.py` runs them after the main suite with
`-m real_model`. When the wheels are missing, every test of the tier is skipped and the
run ends with one line saying why: skipped, never passed.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.real_model.llama_server import RunningServer, Unavailable, check_available, running

#: Lines for the end of the run: the figures the tier measured (or why it was skipped).
NOTES: list[str] = []


def _missing() -> str | None:
    try:
        check_available()
    except Unavailable as missing:
        return str(missing)
    return None


MISSING = _missing()


@pytest.fixture(scope="session")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """llama.cpp's server on a free loopback port, healthy, for the whole run."""
    if MISSING is not None:
        pytest.skip(f"real-model tier skipped: {MISSING}")
    with running(tmp_path_factory.mktemp("llama") / "server.log") as server:
        yield server


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    ran = any(
        report.nodeid.startswith("tests/real_model/")
        for kind in ("passed", "failed", "skipped", "error")
        for report in terminalreporter.stats.get(kind, [])
    )
    if not ran:
        return
    if MISSING is not None:
        terminalreporter.write_line(f"real-model tier skipped: {MISSING}", yellow=True)
        return
    for line in NOTES:
        terminalreporter.write_line(line)
