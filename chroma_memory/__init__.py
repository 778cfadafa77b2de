"""The bot's fast episode memory: an `EpisodeMemory` for thousands of communities.

The engine (`sonality`) never imports this package; `bot` builds its stores here and
hands them to the agent. What is in it, and why each piece exists, is in
docs/performance.md.
"""
