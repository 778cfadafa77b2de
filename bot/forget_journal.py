"""A copy of the forget-me journal outside the database: `forget-journal.json` in the
data directory.

Why outside: the journal in the database (`forget_requests`) travels with the
database. Restore a backup made before a forget-me and the journal is restored too,
from before it: the member would come back, silently. This file stays in the data
directory, which a restore writes into, and lists every forget-me; a restore
(`python -m app restore`) and every start journal again, from it, those the database
lacks, and the start finishes them before anything is learned
(`bot.forget_me.reapply_journal`).

What it holds, per forget-me: the pseudonym (random), the time, and a salted key of
community and member (`storage.forgotten.forget_key`), never an id or a name. Per
message taken back because its author deleted or edited it (`bot.deletion`): the
journal row's label, the time, the cause and a salted key of community and message, so
a restore takes those back again too (`DeletionStore.rejournal_deletions`). The key
is what lets the restore find the member among the restored rows; by the same token
whoever holds the file and a member's id can tell that this member was forgotten. The
file is private to the bot's user (mode 0600).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError

from storage.deletion import DeletionEntry
from storage.forget import JournalEntry

FILE_NAME = "forget-journal.json"
FORMAT = 1
ABOUT = (
    "Sonality Bot's forget-me journal: one entry per forget-me and per message taken "
    "back (deleted or edited by its author), re-applied when a backup from before it is "
    "restored. Keep this file with the data directory."
)


class ForgetJournalError(RuntimeError):
    """The file exists but cannot be read or written (the message says which and why)."""


class ForgetJournal:
    """The journal file of one data directory."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    @classmethod
    def in_data_dir(cls, data_dir: Path) -> ForgetJournal:
        return cls(Path(data_dir) / FILE_NAME)

    def exists(self) -> bool:
        return self.path.is_file()

    def ensure(self) -> None:
        """Create the file (empty) if missing, so a data directory a bot has run in
        always has one (a restore into it then knows no forget-me was lost)."""
        with self._lock:
            if not self.path.exists():
                self._write([], [])

    def entries(self) -> list[JournalEntry]:
        """Every forget-me in the file (none if there is no file)."""
        with self._lock:
            return self._read()[0]

    def deletions(self) -> list[DeletionEntry]:
        """Every message taken back, as the file lists them (none if there is no file)."""
        with self._lock:
            return self._read()[1]

    def add(self, entry: JournalEntry) -> None:
        """Add one forget-me (again is a no-op: the pseudonym is its identity)."""
        with self._lock:
            entries, deleted = self._read()
            if all(e.pseudonym != entry.pseudonym for e in entries):
                self._write([*entries, entry], deleted)

    def add_deletions(self, new: Sequence[DeletionEntry]) -> None:
        """Add messages taken back (again is a no-op: the label is the identity)."""
        with self._lock:
            entries, deleted = self._read()
            known = {d.label for d in deleted}
            fresh = [d for d in new if d.label not in known]
            if fresh:
                self._write(entries, [*deleted, *fresh])

    def copy_to(self, other: ForgetJournal) -> None:
        """Write these entries (merged with `other`'s own) into `other`."""
        mine, my_deleted = self._read_locked()
        with other._lock:
            theirs, their_deleted = other._read()
            known = {e.pseudonym for e in theirs}
            labels = {d.label for d in their_deleted}
            other._write(
                [*theirs, *(e for e in mine if e.pseudonym not in known)],
                [*their_deleted, *(d for d in my_deleted if d.label not in labels)],
            )

    def _read_locked(self) -> tuple[list[JournalEntry], list[DeletionEntry]]:
        with self._lock:
            return self._read()

    # ------------------------------------------------------------------ the file

    def _read(self) -> tuple[list[JournalEntry], list[DeletionEntry]]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return [], []
        except (OSError, ValueError) as exc:
            raise ForgetJournalError(
                f"cannot read the forget journal {self.path} ({exc})"
            ) from None
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ForgetJournalError(f"{self.path} is not a forget journal this release can read")
        try:
            # A file from before deleted messages were journaled has no "deleted" list.
            return (
                [JournalEntry.model_validate(e) for e in data.get("forgotten") or []],
                [DeletionEntry.model_validate(e) for e in data.get("deleted") or []],
            )
        except ValidationError as exc:
            raise ForgetJournalError(
                f"the forget journal {self.path} is damaged ({exc.error_count()} bad entries)"
            ) from None

    def _write(self, entries: list[JournalEntry], deleted: list[DeletionEntry]) -> None:
        """Atomically (a temporary file renamed over it), private, and on disk."""
        data = {
            "format": FORMAT,
            "about": ABOUT,
            "forgotten": [e.model_dump(mode="json") for e in entries],
            "deleted": [d.model_dump(mode="json") for d in deleted],
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(json.dumps(data, indent=1) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
