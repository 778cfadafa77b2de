"""`python -m evaluate` (also `python3 scripts/run.py evaluate`): how well the
configured models hold their views."""

import sys

from evaluate.command import main

if __name__ == "__main__":
    sys.exit(main())
