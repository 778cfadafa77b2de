"""Which reply models read images, for `SONALITY_VISION=auto`.

Why a list and no probe: asking the vendor would cost a call per start and still say
nothing about a model behind a proxy; a model sent an image it cannot read fails the
whole reply. So `auto` names the families the vendors document as taking images, and
any other model (a local one, a future one, a proxy's alias) counts as text-only until
the operator says `SONALITY_VISION=on`. Vendor prefixes such as OpenRouter's
`openai/` or `anthropic/` are ignored, and dots count as dashes (`claude-sonnet-4.5`).

Read from the vendors' model pages, 2026-11:
* Anthropic: every Claude 3 model except Claude 3.5 Haiku, which takes text only, and
  every Claude of generation 4 or later (`claude-opus-4-6`, `claude-haiku-4-5`, ...).
* OpenAI: GPT-4o, GPT-4.1, GPT-4.5 and GPT-5 or later with their mini and nano sizes,
  and the reasoning models o1, o3 and o4-mini; not o1-mini or o3-mini, and not the
  audio, realtime, search, transcription or speech variants.
"""

from __future__ import annotations

import re

#: Claude 3 models that take no images.
_CLAUDE_3_TEXT_ONLY = re.compile(r"claude-3-5-haiku")
_CLAUDE_3 = re.compile(r"claude-3-")
#: "claude-opus-4-6", "claude-haiku-4-5-20251001", "claude-sonnet-5"...
_CLAUDE_NAMED = re.compile(r"claude-(?:opus|sonnet|haiku)-(\d+)")

#: GPT variants that are about sound or search, not pictures.
_GPT_NOT_IMAGES = re.compile(r"-(?:audio|realtime|search|transcribe|tts)(?:-|$)")
_GPT_VISION = re.compile(r"(?:chatgpt-4o|gpt-4o|gpt-4-1|gpt-4-5)(?:-|$)")
_GPT_NUMBERED = re.compile(r"gpt-(\d+)(?:-|$)")
#: o1 and o3 (dated, pro) and o4-mini; o1-mini, o1-preview and o3-mini take no images.
_REASONING_VISION = re.compile(r"(?:o1|o3)(?:-pro)?(?:-\d{4}-\d{2}-\d{2})?$|o4-mini(?:-|$)")


def normalized(model: str) -> str:
    """The model id as the tables above read it: lower case, no vendor prefix, dashes."""
    name = model.strip().lower().rsplit("/", 1)[-1]
    return re.sub(r"(?<=\d)\.(?=\d)", "-", name)


def known_to_take_images(model: str) -> bool:
    """Whether `model` is a vendor model documented to read images (see the module)."""
    name = normalized(model)
    if name.startswith("claude-"):
        if _CLAUDE_3.match(name):
            return _CLAUDE_3_TEXT_ONLY.match(name) is None
        named = _CLAUDE_NAMED.match(name)
        return named is not None and int(named.group(1)) >= 4
    if _GPT_NOT_IMAGES.search(name):
        return False
    if _GPT_VISION.match(name):
        return True
    numbered = _GPT_NUMBERED.match(name)
    if numbered is not None:
        return int(numbered.group(1)) >= 5
    return _REASONING_VISION.match(name) is not None
