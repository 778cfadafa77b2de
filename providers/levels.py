"""Which way of getting a JSON answer each model needed, kept across restarts.

Why a file and not the database: this is a fact about a server, not about a community.
It needs no backup, no forget-me and no migration, and the provider layer must not
depend on storage. Losing the file costs one wasted call per model, which is what
every start cost before. The file lives in the data directory, holds one small JSON
object keyed by endpoint and then model, and is replaced atomically, so a crash leaves
the old file or the new one, never half of one.

Why it matters: a local server that ignores the forced function call (llama.cpp with
a chat template without tools, for one) answers in prose, so each new process used to
spend its first structured call, a minute on a CPU, finding that out again.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

#: The file's name inside the data directory.
LEVELS_FILE = "llm_levels.json"


class LevelMemory:
    """The remembered level per model at one endpoint; without a path, this process only."""

    def __init__(self, endpoint: str, path: Path | None = None) -> None:
        self.endpoint = endpoint
        self.path = path
        self._levels: dict[str, int] = {}
        if path is not None:
            self._levels = dict(_read(path).get(endpoint, {}))

    def get(self, model: str) -> int | None:
        return self._levels.get(model)

    def put(self, model: str, level: int) -> None:
        """Remember `level` for `model`; a file that cannot be written only logs a
        WARNING (the level is still kept for this process)."""
        if self._levels.get(model) == level:
            return
        self._levels[model] = level
        if self.path is None:
            return
        try:
            everything = _read(self.path)
            everything[self.endpoint] = {**everything.get(self.endpoint, {}), model: level}
            _write(self.path, everything)
        except OSError as err:
            log.warning("could not remember the structured-answer level in %s: %s", self.path, err)


def _read(path: Path) -> dict[str, dict[str, int]]:
    """The file's levels; missing or damaged means none (re-learnt at one call each)."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as err:
        log.warning("ignoring %s (%s): structured-answer levels are learnt again", path, err)
        return {}
    if not isinstance(raw, dict):
        return {}
    return {
        str(endpoint): {
            str(model): level
            for model, level in models.items()
            if isinstance(level, int) and not isinstance(level, bool)
        }
        for endpoint, models in raw.items()
        if isinstance(models, dict)
    }


def _write(path: Path, levels: dict[str, dict[str, int]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump(levels, handle, indent=2, sort_keys=True)
            handle.write("\n")
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
