"""Run a snippet of seed-shaped code in a fresh Python process, offline.

Why a process: `sonality.config` reads the environment once at import, and Chroma
decides where its model would be downloaded from `$HOME` at import, so only a fresh
interpreter with a clean environment shows what a newcomer's script gets. The process
is offline: any connection or name lookup beyond loopback raises, as on a machine
without network access.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from tests.checkout import importing_this_checkout

#: Installed first in the child: the network is loopback only.
OFFLINE = """\
import socket

_LOOPBACK = {"127.0.0.1", "::1", "localhost"}
_connect, _getaddrinfo = socket.socket.connect, socket.getaddrinfo


def _connect_loopback_only(self, address):
    host = address[0] if isinstance(address, tuple) else None
    if host is not None and host not in _LOOPBACK:
        raise OSError(f"offline: no route to {address}")
    return _connect(self, address)


def _resolve_loopback_only(host, *args, **kwargs):
    if host not in _LOOPBACK and host is not None:
        raise socket.gaierror(f"offline: cannot resolve {host}")
    return _getaddrinfo(host, *args, **kwargs)


socket.socket.connect = _connect_loopback_only
socket.getaddrinfo = _resolve_loopback_only
"""


def run_seed_code(cwd: Path, code: str, **env: str) -> Any:
    """Run `code` in `cwd` (also $HOME) with no SONALITY_ settings but `env`; the
    JSON the code prints as its last line."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SONALITY_", "ANTHROPIC_", "DISCORD_", "SLACK_", "DATABASE_URL"))
    }
    clean.update(HOME=str(cwd), **env)
    proc = subprocess.run(
        [sys.executable, "-c", OFFLINE + "\n" + textwrap.dedent(code)],
        cwd=cwd,
        env=importing_this_checkout(clean),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
