"""Sonality: an evolving, evidence-gated LLM personality.

The engine is platform-neutral on purpose: it never imports `bot`, `storage`,
`adapters`, `providers` or `chroma_memory` (tests/engine/test_layers.py). Whoever embeds
it hands it an `LLMClient`, a `StateStore` and an `EpisodeMemory` (or an `AgentMemory`
that decides itself when episodes are written, see `sonality.memory.access`).
"""
