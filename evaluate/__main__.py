"""`python -m evaluate` (also `python3 scripts/run.py evaluate`): how well the
configured models hold their views.

It runs the bot in its own process, so it starts once more under the bot's glibc
settings first, as `python -m app` does (sonality/memory/freed_memory.py).
"""

import sys

from sonality.memory.freed_memory import restart_scrubbed

if __name__ == "__main__":
    restart_scrubbed()
    from evaluate.command import main

    sys.exit(main())
