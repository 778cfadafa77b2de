"""The community runtime and its features: commands, spending limits, forget-me, the
timeline, the scheduler. It sits below the adapters, which hand it neutral messages."""
