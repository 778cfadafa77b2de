"""Every command the README and docs/ show runs as written from a fresh clone.

Nothing activates `.venv` for a newcomer, so `python -m app …` copied from a page fails
with `ModuleNotFoundError`. The pages therefore start the bot, the tests and the
benchmarks through `scripts/` (which make the environment and hand their arguments on),
and name `.venv/bin/…` only for the few tools without a script. Each command is parsed
by the real command line it reaches (argparse of the bot, of `evaluate`, of the
benchmarks; pytest's options), so an unknown subcommand or option fails here; `--help`
and the Python one-liners are cheap and harmless, so those are run.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import io
import re
import runpy
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from tests.docs.pages import PAGES, ROOT, Command, commands, program_words

ALL_COMMANDS = [command for page in PAGES for command in commands(page)]
SCRIPTS = ("scripts/run.py", "scripts/test.py", "scripts/bench.py")
#: Programs that have a script: naming them through `.venv/bin/python -m` would hide it.
SCRIPTED_MODULES = {"app", "bench", "pytest"}
#: The image and the Compose service whose arguments go to the bot's command line.
BOT_IMAGE = "sonality-bot"


def _parse(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """None when argparse accepts `args` (or shows the help they ask for); else its error."""
    err = io.StringIO()
    with redirect_stderr(err), redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(args)
        except SystemExit as exit_:
            if exit_.code == 0 and {"-h", "--help"} & set(args):
                return None
            return err.getvalue().strip() or f"exit code {exit_.code}"
    return None


def bot_problem(args: list[str]) -> str | None:
    """What the bot's command line says about `args`, as `python -m app` would parse them."""
    if args[:1] == ["evaluate"]:  # a command line of its own (app/__main__.py)
        from evaluate.command import _suites, build_parser
        from evaluate.report import parse_bounds

        parser = build_parser()
        problem = _parse(parser, args[1:])
        if problem or {"-h", "--help"} & set(args):
            return problem
        parsed = parser.parse_args(args[1:])
        try:  # what `evaluate` checks right after parsing, before anything runs
            _suites(parsed.suite)
            for text in [*parsed.min, *parsed.max, *parsed.fail_under]:
                parse_bounds(text)
        except ValueError as exc:
            return str(exc)
        return None
    from app.cli import build_parser as bot_parser

    return _parse(bot_parser()[0], args)


def bench_problem(args: list[str]) -> str | None:
    from bench.catalog import build_parser

    return _parse(build_parser(), args)


@functools.cache
def pytest_help() -> str:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout


@functools.cache
def pytest_options() -> frozenset[str]:
    return frozenset(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", pytest_help()))


@functools.cache
def pytest_options_with_a_value() -> frozenset[str]:
    """Options whose help shows a value after them (`-m MARKEXPR`, `--maxfail=num`)."""
    found: set[str] = set()
    for line in pytest_help().splitlines():
        entry = re.match(r"^\s+(-\S.*?)(?:\s{2,}|$)", line)
        for form in entry.group(1).split(", ") if entry else ():
            option, *value = re.split(r"[ =]", form, maxsplit=1)
            if value and re.fullmatch(r"--?[A-Za-z][\w-]*", option):
                found.add(option)
    return frozenset(found)


def pytest_args_problem(args: list[str]) -> str | None:
    """pytest's arguments: options pytest knows (with their values), paths that exist."""
    value_next = False
    for arg in args:
        if value_next:
            value_next = False
        elif arg.startswith("-"):
            if arg.split("=")[0] not in pytest_options():
                return f"pytest has no option {arg}"
            value_next = "=" not in arg and arg in pytest_options_with_a_value()
        elif not (ROOT / arg.split("::")[0]).exists():
            return f"no such test path: {arg}"
    return None


def problem(command: Command) -> str | None:
    """Why this command would not run as written from a fresh clone, or None."""
    words = list(program_words(command.words))
    if not words:
        return None
    program, args = words[0], words[1:]
    if program == "python":
        return "`python` is not on every machine, and the scripts need Python 3: use python3"
    if program == "python3":
        if args[:1] == ["-c"]:
            return None  # run by test_every_python_one_liner_runs_on_a_bare_python
        script = args[0] if args else ""
        if script == "scripts/run.py":
            return bot_problem(args[1:])
        if script == "scripts/bench.py":
            return bench_problem(args[1:])
        if script == "scripts/test.py":
            return pytest_args_problem(args[1:])
        return f"only {', '.join(SCRIPTS)} and `python3 -c` run without .venv; not {script!r}"
    if program == ".venv/bin/python":
        if not args:
            return None  # the interpreter named in prose
        if args[0] != "-m" or len(args) < 2:
            return "name a module: .venv/bin/python -m MODULE"
        if args[1] in SCRIPTED_MODULES:
            return f"{args[1]} has a script of its own: use {SCRIPTS}"
        if importlib.util.find_spec(args[1]) is None:
            return f"no module {args[1]}"
        return None
    if program.startswith(".venv/bin/"):
        tool = program.removeprefix(".venv/bin/")
        return None if (Path(sys.executable).parent / tool).exists() else f"no {program}"
    if program == "docker" and "run" in args and BOT_IMAGE in args:
        after = args[args.index(BOT_IMAGE) + 1 :]
        return bot_problem(after) if after else None
    return None  # another program (git, docker, systemctl, psql, …): not ours to parse


def test_the_pages_show_the_commands_a_newcomer_needs() -> None:
    """The extraction itself finds what the pages show (so the checks below check something)."""
    shown = {" ".join(program_words(c.words)[:3]) for c in ALL_COMMANDS}
    assert {
        "python3 scripts/run.py",
        "python3 scripts/test.py",
        "python3 scripts/run.py evaluate",
        "python3 scripts/run.py backup",
        "python3 scripts/run.py migrate",
        "python3 scripts/run.py healthcheck",
        "python3 scripts/bench.py --only",
    } <= shown
    assert len(ALL_COMMANDS) > 60
    readme = [c for c in ALL_COMMANDS if c.page.name == "README.md"]
    assert program_words(readme[0].words) == ("python3", "scripts/run.py"), "first command"
    assert program_words(readme[1].words) == ("python3", "scripts/test.py"), "second command"


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=lambda c: c.where[:90])
def test_every_command_shown_runs_as_written(command: Command) -> None:
    assert problem(command) is None, f"{command.where}\n  {problem(command)}"


@pytest.mark.parametrize(
    ("words", "complaint"),
    [
        (("python", "-m", "app"), "python3"),
        (("python3", "-m", "app", "backup", "DEST"), "without .venv"),
        (("python3", "scripts/run.py", "backup"), "DEST"),
        (("python3", "scripts/run.py", "bakup", "DEST"), "invalid choice"),
        (("python3", "scripts/run.py", "migrate", "--to-chroma", "http://h:1"), "--to-database"),
        (("python3", "scripts/run.py", "evaluate", "--suite", "vibes"), "unknown suite"),
        (("python3", "scripts/run.py", "evaluate", "--min", "charm=1"), "unknown metric"),
        (("python3", "scripts/run.py", "evaluate", "--verbose"), "--verbose"),
        (("python3", "scripts/bench.py", "--only", "3c"), "no figure named 3c"),
        (("python3", "scripts/test.py", "tests/nowhere"), "no such test path"),
        (("python3", "scripts/test.py", "--fast"), "no option --fast"),
        (
            ("python3", "scripts/test.py", "-m", "real_model", "tests/nowhere"),
            "path: tests/nowhere",
        ),
        (("python3", "scripts/test.py", "-x", "real_model"), "no such test path: real_model"),
        ((".venv/bin/python", "-m", "app"), "script of its own"),
        ((".venv/bin/python", "-m", "bench.nothing"), "no module"),
        (("docker", "compose", "run", "--rm", BOT_IMAGE, "restore"), "SOURCE"),
    ],
)
def test_a_command_that_would_not_run_is_caught(words: tuple[str, ...], complaint: str) -> None:
    found = problem(Command(ROOT / "README.md", 1, words))
    assert found is not None and complaint in found, found


HELP_COMMANDS = sorted(
    {
        program_words(c.words)[1:]
        for c in ALL_COMMANDS
        if program_words(c.words)[-1:] == ("--help",)
        and program_words(c.words)[1] in ("scripts/run.py", "scripts/bench.py")
    }
)


@pytest.mark.parametrize("words", HELP_COMMANDS, ids=" ".join)
def test_every_help_command_shown_runs_and_names_the_runnable_form(
    words: tuple[str, ...],
) -> None:
    """Run what the script would run (its arguments to `-m bot` or `-m bench`)."""
    script, *args = words
    module, form = {
        "scripts/run.py": ("app", "python3 scripts/run.py"),
        "scripts/bench.py": ("bench", "python3 scripts/bench.py"),
    }[script]
    done = subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert f"usage: {form}" in done.stdout
    assert "python -m" not in done.stdout  # its examples are runnable too


def test_the_pages_cover_each_help() -> None:
    assert {("scripts/run.py", "--help"), ("scripts/bench.py", "--help")} <= set(HELP_COMMANDS)
    assert ("scripts/run.py", "evaluate", "--help") in HELP_COMMANDS


ONE_LINERS = [
    c for c in ALL_COMMANDS if program_words(c.words)[:2] in (("python3", "-c"), ("python", "-c"))
]


@pytest.mark.parametrize("command", ONE_LINERS, ids=lambda c: c.where[:90])
def test_every_python_one_liner_runs_on_a_bare_python(command: Command) -> None:
    """`-S`: no site-packages, as on a machine where only the clone and Python exist."""
    code = program_words(command.words)[2]
    done = subprocess.run(
        [sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, f"{command.where}\n{done.stderr}"
    assert done.stdout.strip()


def test_the_one_liners_include_the_secret_key_recipe() -> None:
    assert any("urlsafe_b64encode" in c.words[-1] for c in ONE_LINERS)
    assert any("token_urlsafe" in c.words[-1] for c in ONE_LINERS)


def test_no_page_names_a_module_form_that_needs_an_activated_venv() -> None:
    """Prose counts too: a `python -m app` anywhere gets copied."""
    bare = re.compile(r"(?<![/\w])python3? -m (bot|bench|tests)\b")
    found = [
        f"{page.relative_to(ROOT)}:{n}"
        for page in PAGES
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
        if bare.search(line)
    ]
    assert not found


def _run_script(monkeypatch: pytest.MonkeyPatch, script: str, argv: list[str]) -> list[list[str]]:
    """Run scripts/<script> with the environment step and the hand-over recorded."""
    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    import _bootstrap

    calls: list[list[str]] = []

    class HandedOver(Exception):
        pass

    def execv(path: str, args: list[str]) -> None:
        calls.append(list(args))
        raise HandedOver

    def run(args: list[str], **_: object) -> subprocess.CompletedProcess[bytes]:
        calls.append(list(args))
        return subprocess.CompletedProcess(args, 0)

    monkeypatch.setattr(_bootstrap, "ensure_venv", lambda **_: Path("/venv/bin/python"))
    monkeypatch.setattr(_bootstrap, "scrubbed_environment", lambda _: {})
    monkeypatch.setattr("os.execv", execv)
    monkeypatch.setattr("os.execve", lambda path, args, env: execv(path, args))
    monkeypatch.setattr("os.chdir", lambda _: None)
    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(sys, "argv", [script, *argv])
    with pytest.raises((HandedOver, SystemExit)):
        runpy.run_path(str(ROOT / "scripts" / script), run_name="__main__")
    return calls


def test_the_scripts_hand_every_argument_on_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Why parsing a page's `python3 scripts/run.py ARGS` with the bot's parser is right."""
    args = ["evaluate", "--label", "a b", "--yes"]
    assert _run_script(monkeypatch, "run.py", args) == [["/venv/bin/python", "-m", "app", *args]]
    assert _run_script(monkeypatch, "bench.py", ["--only", "1"]) == [
        ["/venv/bin/python", "-m", "bench", "--only", "1"]
    ]
    assert _run_script(monkeypatch, "test.py", ["tests/docs", "-x"]) == [
        ["/venv/bin/python", "-m", "pytest", "tests/docs", "-x"]
    ]
