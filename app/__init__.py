"""The program: command line, start-up checks, wiring, and the operator's commands."""
