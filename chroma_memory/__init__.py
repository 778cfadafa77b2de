"""The bot's fast episode memory: an `EpisodeMemory` for thousands of communities.

The engine (`sonality`) never imports this package; the program (`app/wiring.py`)
builds the stores here and hands them to the agents. What is in it, and why each
piece exists, is in docs/performance.md.
"""
