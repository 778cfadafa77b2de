"""`python -m app evaluate` (or `python -m evaluate`): measure how well the configured
models hold the bot's views.

Why a package above `app`: it reads the bot's settings and runs the bot's whole runtime
(in throwaway communities in a temporary data directory), so it must move in step with
them, yet the bot never imports it (`python -m app evaluate` hands over as a process).
The suites are package data in `suites/`.
"""
