"""The community runtime and its features: commands, spending limits, forget-me, the timeline, the scheduler; below the adapters, which hand it neutral messages."""
