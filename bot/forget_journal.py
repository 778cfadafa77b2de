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

import asyncio
import json
import logging
import os
import tempfile
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from storage.deletion import DeletionEntry
from storage.forget import JournalEntry

FILE_NAME = "forget-journal.json"
#: Format 2: JSON Lines, a header line then one entry a line, added by appending.
#: Format 1 (one JSON object, rewritten whole at each entry) is still read, and turned
#: into format 2 by the first entry added.
FORMAT = 2
WHOLE_FILE_FORMAT = 1
ABOUT = (
    "Sonality Bot's forget-me journal: one entry per forget-me and per message taken "
    "back (deleted or edited by its author), re-applied when a backup from before it is "
    "restored. Keep this file with the data directory."
)
#: An entry line is well under 1 KiB; the tail read to find the last whole line.
TAIL_BYTES = 65536

log = logging.getLogger(__name__)


class ForgetJournalError(RuntimeError):
    """The file exists but cannot be read or written (the message says which and why)."""


class ForgetJournal:
    """The journal file of one data directory.

    Entries are appended, one line each, and a file read collapses repeats (a
    forget-me's pseudonym and a deletion's label are their identity, the first line
    wins). Why not rewritten whole: the file gains a line for every message taken back,
    in every community, for good; rewritten at each, it cost 1.2 s of CPU per deletion
    at 100,000 of them and held the event loop for 139 ms while it was parsed. A line
    a crash cut short is the file's last; it is dropped (with a warning) on read and
    cut off before the next append.
    """

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
        always has one (a restore into it then knows no forget-me was lost), and give
        a file from before journals had ids one."""
        with self._lock:
            if not self.path.exists() or self._header_id() is None:
                self._write(*self._read())

    def journal_id(self) -> str | None:
        """The file's own random id, written when it was made: a backup records it, so
        a restore can tell this data directory's journal from another's (None: no file,
        or one from before ids)."""
        with self._lock:
            return self._header_id()

    def entries(self) -> list[JournalEntry]:
        """Every forget-me in the file (none if there is no file)."""
        with self._lock:
            return self._read()[0]

    def deletions(self) -> list[DeletionEntry]:
        """Every message taken back, as the file lists them (none if there is no file)."""
        with self._lock:
            return self._read()[1]

    def add_all(self, entries: Sequence[JournalEntry | DeletionEntry]) -> None:
        """Add forget-mes and messages taken back (again adds lines that read as nothing
        new)."""
        with self._lock:
            self._append([_item(e) for e in entries])

    async def record(self, entries: Sequence[JournalEntry | DeletionEntry], lost: str) -> None:
        """Add `entries` from the event loop. A file that cannot be written does not
        stop the forget-me or the deletion (the database's journal has it), but is
        logged with `lost`: what a backup restored later would then get wrong."""
        try:
            await asyncio.to_thread(self.add_all, entries)
        except (OSError, ForgetJournalError) as exc:
            log.error(
                "could not add %s to the forget journal %s (%s): a backup restored later %s",
                ", ".join(e.pseudonym if isinstance(e, JournalEntry) else e.label for e in entries),
                self.path,
                exc,
                lost,
            )

    def copy_to(self, other: ForgetJournal) -> None:
        """Add to `other` the entries of this file it lacks."""
        mine, my_deleted = self.read()
        with other._lock:
            if not other.path.exists():  # a copy of this journal: it keeps its id
                other._write([], [], journal_id=self.journal_id())
            theirs, their_deleted = other._read()
            known = {e.pseudonym for e in theirs}
            labels = {d.label for d in their_deleted}
            other._append(
                [_item(e) for e in mine if e.pseudonym not in known]
                + [_item(d) for d in my_deleted if d.label not in labels]
            )

    def read(self) -> tuple[list[JournalEntry], list[DeletionEntry]]:
        """The forget-mes and the messages taken back, in one read of the file."""
        with self._lock:
            return self._read()

    # ------------------------------------------------------------------ the file

    def _read(self) -> tuple[list[JournalEntry], list[DeletionEntry]]:
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return [], []
        except (OSError, ValueError) as exc:
            raise ForgetJournalError(
                f"cannot read the forget journal {self.path} ({exc})"
            ) from None
        header, _, rest = text.partition("\n")
        if _is_header(header):
            return self._entries(self._lines(rest))
        try:
            whole = json.loads(text)
        except ValueError as exc:
            raise ForgetJournalError(
                f"cannot read the forget journal {self.path} ({exc})"
            ) from None
        if not isinstance(whole, dict) or whole.get("format") != WHOLE_FILE_FORMAT:
            raise ForgetJournalError(f"{self.path} is not a forget journal this release can read")
        # A format-1 file from before deleted messages were journaled has no "deleted".
        return self._entries(
            [{"forgotten": e} for e in whole.get("forgotten") or []]
            + [{"deleted": d} for d in whole.get("deleted") or []]
        )

    def _lines(self, rest: str) -> list[Any]:
        """The entry lines after the header, parsed; a last line cut short is dropped."""
        lines = rest.split("\n")
        torn = lines.pop()  # "" when the file ends with its newline
        if torn:
            log.warning(
                "the forget journal %s ends in an entry cut short (a crash while it was "
                "added); that entry is left out",
                self.path,
            )
        try:
            return [json.loads(line) for line in lines if line]
        except ValueError:
            raise ForgetJournalError(
                f"the forget journal {self.path} is damaged (a line is not JSON)"
            ) from None

    def _entries(self, items: list[Any]) -> tuple[list[JournalEntry], list[DeletionEntry]]:
        """Forget-mes and deletions of `items`, each once (the first line wins)."""
        entries: dict[str, JournalEntry] = {}
        deleted: dict[str, DeletionEntry] = {}
        bad = 0
        for item in items:
            try:
                if isinstance(item, dict) and "forgotten" in item:
                    entry = JournalEntry.model_validate(item["forgotten"])
                    entries.setdefault(entry.pseudonym, entry)
                elif isinstance(item, dict) and "deleted" in item:
                    deletion = DeletionEntry.model_validate(item["deleted"])
                    deleted.setdefault(deletion.label, deletion)
                else:
                    bad += 1
            except ValidationError:
                bad += 1
        if bad:
            raise ForgetJournalError(
                f"the forget journal {self.path} is damaged ({bad} bad entries)"
            )
        return list(entries.values()), list(deleted.values())

    def _append(self, items: list[dict[str, Any]]) -> None:
        """Add entry lines, on disk before it returns. A missing or format-1 file is
        first written whole in format 2 (atomically); a line cut short at the end of
        the file is cut off first."""
        if not items:
            return
        if not self._in_lines():
            entries, deleted = self._read()
            self._write(entries, deleted)
        try:
            with open(self.path, "r+b") as fh:
                end = fh.seek(0, os.SEEK_END)
                start = max(0, end - TAIL_BYTES)
                fh.seek(start)
                tail = fh.read()
                if not tail.endswith(b"\n"):
                    cut = tail.rfind(b"\n")
                    if cut < 0:
                        raise ForgetJournalError(
                            f"the forget journal {self.path} is damaged (no whole line at its end)"
                        )
                    fh.truncate(start + cut + 1)
                    fh.seek(start + cut + 1)
                fh.write(b"".join(_line(item) for item in items))
                fh.flush()
                os.fsync(fh.fileno())
        except OSError as exc:
            raise ForgetJournalError(
                f"cannot add to the forget journal {self.path} ({exc})"
            ) from None

    def _in_lines(self) -> bool:
        """Whether the file exists in format 2 (only its header line is read)."""
        try:
            with open(self.path, encoding="utf-8") as fh:
                return _is_header(fh.readline())
        except FileNotFoundError:
            return False
        except (OSError, ValueError) as exc:
            raise ForgetJournalError(
                f"cannot read the forget journal {self.path} ({exc})"
            ) from None

    def _header_id(self) -> str | None:
        try:
            with open(self.path, encoding="utf-8") as fh:
                head = json.loads(fh.readline())
        except (OSError, ValueError):
            return None
        found = head.get("journal_id") if isinstance(head, dict) else None
        return found if isinstance(found, str) and found else None

    def _write(
        self,
        entries: list[JournalEntry],
        deleted: list[DeletionEntry],
        *,
        journal_id: str | None = None,
    ) -> None:
        """The whole file in format 2: atomically (a temporary file renamed over it),
        private, and on disk; with `journal_id`, else the file's own, else a new one."""
        journal_id = journal_id or self._header_id() or uuid.uuid4().hex
        lines = [_line({"format": FORMAT, "about": ABOUT, "journal_id": journal_id})]
        lines += [_line(_item(e)) for e in entries]
        lines += [_line(_item(d)) for d in deleted]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb") as fh:
                fh.write(b"".join(lines))
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def _is_header(line: str) -> bool:
    """Whether `line` is the first line of a format-2 file."""
    try:
        head = json.loads(line)
    except ValueError:
        return False
    return isinstance(head, dict) and head.get("format") == FORMAT


def _item(entry: JournalEntry | DeletionEntry) -> dict[str, Any]:
    """An entry as its line holds it: under "forgotten" or "deleted"."""
    kind = "forgotten" if isinstance(entry, JournalEntry) else "deleted"
    return {kind: entry.model_dump(mode="json")}


def _line(item: dict[str, Any]) -> bytes:
    return (json.dumps(item, ensure_ascii=False) + "\n").encode("utf-8")
