"""One bot process per data directory.

Why: two processes on one data directory would both replay the same unfinished
interactions, write the same personality versions and open the same Chroma files, and
nothing in SQLite or Chroma would stop them. An exclusive `flock` on a file in the data
directory, held for the life of the process, does: the kernel drops it when the process
ends however it ends (even SIGKILL), so a stale lock file never blocks a restart. The
file records the holder's pid so the refusal can say who is in the way.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from bot.interface import StartupError

LOCK_FILE = "sonality.lock"


class LockFileError(StartupError):
    """The lock file cannot be made (a directory not writable)."""


class DataDirLock:
    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    @classmethod
    def acquire(
        cls, data_dir: Path, *, file: str = LOCK_FILE, setting: str = "SONALITY_DATA_DIR"
    ) -> Self:
        """Take the lock or raise `StartupError` naming the process that holds it.
        `file` and `setting`: a lock beside a path set apart from the data directory
        (`installation_locks`)."""
        path = data_dir / file
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise LockFileError(f"cannot create the lock file {path} ({exc.strerror})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            who = f"another Sonality Bot (pid {holder})" if holder else "another Sonality Bot"
            where = data_dir if file == LOCK_FILE else data_dir / file.removesuffix(".lock")
            raise StartupError(
                f"{who} is already running with {setting}={where}; "
                "stop it first or give this one another data directory"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        return cls(path, fd)

    def release(self) -> None:
        """Let the next process in; the file stays (removing it would race a newcomer)."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the descriptor drops the flock
        self._fd = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        return int(os.pread(fd, 32, 0).decode().strip())
    return None


def installation_locks(
    data_dir: Path, elsewhere: Sequence[tuple[Path, str]]
) -> contextlib.ExitStack:
    """The data directory's lock, and one beside each of `elsewhere` (a path and its
    setting: the SQLite file or Chroma's directory set apart from the data directory),
    all released together: two bots with different data directories must not share a
    database or a Chroma directory any more than one. Raises `StartupError` as
    `DataDirLock.acquire` does, holding none."""
    held = contextlib.ExitStack()
    try:
        held.enter_context(DataDirLock.acquire(data_dir))
        for path, setting in elsewhere:
            if path.parent.resolve() == data_dir.resolve():
                continue
            try:  # made as the database and Chroma would make it
                path.parent.mkdir(parents=True, exist_ok=True)
                lock = DataDirLock.acquire(path.parent, file=f"{path.name}.lock", setting=setting)
            except (OSError, LockFileError):
                # A directory the bot cannot write in: the storage check that follows
                # says so, in its own words, for the file the bot would write there.
                continue
            held.enter_context(lock)
    except BaseException:
        held.close()
        raise
    return held
