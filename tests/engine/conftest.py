"""Opt this folder into the fake Anthropic server fixtures (`anthropic_server`, `llm`)."""

from tests.fakes.anthropic_fixtures import anthropic_server, llm  # noqa: F401
