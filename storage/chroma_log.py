"""An index on the embedded Chroma's write log, so opening one community's memories does
not read every community's unsaved writes.

Why (chromadb 1.5.9, measured on the bot's 2-core machine, docs/performance.md):
Chroma keeps every write in a log table (`embeddings_queue`, vector and document
included) until the collection's index is saved, and the log is one table for all
collections, keyed by sequence number only. Each time an index is loaded (every recall
of a community whose index is closed, see chroma_memory.shared_chroma) Chroma reads that
collection's unsaved writes with a filter on the collection's topic, and after each
write it deletes the saved part the same way. Without an index on the topic both scan
the table from the collection's last save onwards: with 100 communities of 20 memories
each, about 1,000 pages of 4 KiB per load, 3 ms of the 10.7 ms a closed community's
recall cost. The table keeps up to `SYNC_THRESHOLD - 1` writes of every community, so
the scan grows with the number of communities, not with the one being read.

The index is the file's own (its name says whose); Chroma's migrations neither need nor
touch it, VACUUM and backups keep it, and creating it again is a no-op. A Chroma server's
file is its operator's (docs/scaling.md).
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from pathlib import Path

log = logging.getLogger(__name__)

#: The index's name in Chroma's file, prefixed so it can never clash with one of Chroma's.
LOG_INDEX = "sonality_embeddings_queue_topic_seq"
_CREATE = f"CREATE INDEX IF NOT EXISTS {LOG_INDEX} ON embeddings_queue (topic, seq_id)"


def index_chroma_log(chroma_dir: Path, *, timeout_seconds: float = 30.0) -> bool:
    """Add the log index to the embedded Chroma's file in `chroma_dir` if it is not there.

    Call it once Chroma has created its file (after its client opened). Returns whether
    the index is there. A file that cannot take it (read-only, locked past the timeout,
    not Chroma's) is left as it is with one warning: the bot still works, only each load
    of an index reads more.
    """
    path = Path(chroma_dir) / "chroma.sqlite3"
    if not path.is_file():
        return False
    try:
        with contextlib.closing(sqlite3.connect(path, timeout=timeout_seconds)) as conn, conn:
            conn.execute(_CREATE)
    except sqlite3.Error as err:
        log.warning("could not index Chroma's write log in %s (%s): recalls read more", path, err)
        return False
    return True
