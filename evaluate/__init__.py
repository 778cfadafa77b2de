"""`python -m app evaluate`: measure how well the configured models hold the bot's views.

Why it lives in `bot/`: it is a command of the bot, reads the bot's settings and runs
the bot's runtime (in throwaway communities in a temporary data directory), so it
must move in step with them. The suites are package data in `suites/`.
"""
