"""`LLMClient` implementations, one per vendor SDK, chosen once at start from settings.

Why outside `sonality/`: the engine must not learn which vendor it talks to; it sees
only the `sonality.llm.LLMClient` protocol.
"""

from __future__ import annotations

from typing import Literal

Provider = Literal["anthropic", "openai"]

#: (reply model, evidence model) when SONALITY_MODEL / SONALITY_ESS_MODEL are unset.
#: The evidence work (ESS, insight, reflection) is a short classification or rewrite, so
#: it defaults to the vendor's small model; docs/models.md "Models and cost" has the measured
#: difference.
DEFAULT_MODELS: dict[str, tuple[str, str]] = {
    "anthropic": ("claude-sonnet-4-6", "claude-haiku-4-5"),
    "openai": ("gpt-4.1", "gpt-4.1-mini"),
}
