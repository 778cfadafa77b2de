"""A child of the preloaded Python behaves as `python -m module` would, where tests look.

tests/forked_bot.py starts most of the tests' bot processes that way; these checks
are what lets a test trust a forked bot's exit code, streams, place and settings.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

from tests.checkout import importing_this_checkout
from tests.forked_bot import ForkedProcess, start_module

PROBE = """
import json, os, sys
mode = sys.argv[1] if len(sys.argv) > 1 else ""
if mode == "wait":
    print("ready", flush=True)
    sys.stdin.read()
if mode == "fail":
    raise RuntimeError("the probe failed")
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("app", "bot", "sonality"))
umask = os.umask(0)
print(json.dumps({
    "argv": sys.argv, "cwd": os.getcwd(), "path0": sys.path[0],
    "setting": os.environ.get("PROBE_SETTING"), "project_loaded": loaded, "umask": umask,
    "stdin": sys.stdin.read(),
}))
print("to stderr", file=sys.stderr)
sys.exit(int(os.environ.get("PROBE_EXIT", "0")))
"""


def _env(**extra: str) -> dict[str, str]:
    return importing_this_checkout({**os.environ, **extra})


async def test_a_forked_child_takes_the_place_arguments_environment_and_streams(
    tmp_path: Path,
) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    proc = await start_module(
        "probe", "one", cwd=tmp_path, env=_env(PROBE_SETTING="x", PROBE_EXIT="3"), umask=0o027
    )
    assert isinstance(proc, ForkedProcess)  # this machine can fork: the spawn is the fallback
    out, err = await asyncio.wait_for(proc.communicate(b"typed in"), 60)
    assert proc.returncode == 3
    assert err.decode() == "to stderr\n"
    seen = json.loads(out)
    assert seen["argv"] == [str(tmp_path / "probe.py"), "one"]
    assert seen["cwd"] == seen["path0"] == str(tmp_path)
    assert seen["setting"] == "x"
    assert seen["stdin"] == "typed in"
    assert seen["umask"] == 0o027
    assert seen["project_loaded"] == []  # the project is imported by the child, not preloaded


async def test_an_uncaught_error_and_a_signal_end_it_as_they_end_an_interpreter(
    tmp_path: Path,
) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    failing = await start_module("probe", "fail", cwd=tmp_path, env=_env())
    _, err = await asyncio.wait_for(failing.communicate(b""), 60)
    assert failing.returncode == 1
    assert "RuntimeError: the probe failed" in err.decode()

    waiting = await start_module("probe", "wait", cwd=tmp_path, env=_env())
    assert waiting.stdout is not None
    await asyncio.wait_for(waiting.stdout.readline(), 60)  # running, reading its stdin
    waiting.send_signal(signal.SIGKILL)
    assert await asyncio.wait_for(waiting.wait(), 60) == -signal.SIGKILL


async def test_another_pythonpath_is_spawned_not_forked(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(PROBE)
    env = _env()
    env["PYTHONPATH"] = f"{env['PYTHONPATH']}{os.pathsep}{tmp_path}"
    proc = await start_module("probe", cwd=tmp_path, env=env)
    assert isinstance(proc, asyncio.subprocess.Process)
    await asyncio.wait_for(proc.communicate(b""), 60)
    assert proc.returncode == 0
