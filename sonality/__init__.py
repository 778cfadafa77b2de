"""Sonality: an evolving, evidence-gated LLM personality.

The engine is platform-neutral on purpose: it never imports `bot`, `storage` or
`adapters`. Whoever embeds it hands it an `LLMClient` and a `StateStore`.
"""
