"""Sonality: an evolving, evidence-gated LLM personality, platform-neutral.

The host hands it an `LLMClient`, a `StateStore` and an `EpisodeMemory` (or `AgentMemory`).
"""
