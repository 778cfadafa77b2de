"""`SONALITY_VISION`: which reply models get members' images.

`auto` must name the vendors' image-reading models and nothing else: a model sent an
image it cannot read fails the whole reply, so an unknown model counts as text-only.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from bot.settings import Settings
from providers.vision import known_to_take_images

READS_IMAGES = [
    "claude-sonnet-4-6",
    "claude-opus-4-5",
    "claude-haiku-4-5-20251001",
    "claude-opus-4.1",  # OpenRouter writes versions with dots
    "anthropic/claude-sonnet-4.5",
    "claude-3-7-sonnet-latest",
    "claude-3-5-sonnet-20241022",
    "claude-3-haiku-20240307",
    "claude-3-opus-20240229",
    "gpt-4o",
    "gpt-4o-mini",
    "chatgpt-4o-latest",
    "gpt-4.1",
    "gpt-4.1-nano",
    "openai/gpt-4.1-mini",
    "gpt-4.5-preview",
    "gpt-5",
    "gpt-5-mini",
    "gpt-5.1",
    "o1",
    "o1-2024-12-17",
    "o3",
    "o3-pro",
    "o4-mini",
]
TEXT_ONLY = [
    "claude-3-5-haiku-20241022",  # the one Claude 3 without vision
    "anthropic/claude-3.5-haiku",
    "claude-2.1",
    "claude-instant-1.2",
    "gpt-3.5-turbo",
    "gpt-4",
    "gpt-4o-audio-preview",
    "gpt-4o-realtime-preview",
    "gpt-4o-mini-search-preview",
    "gpt-4o-mini-tts",
    "o1-mini",
    "o3-mini",
    "llama3.1:8b",  # local models: the operator says SONALITY_VISION=on
    "llava:13b",
    "qwen2.5vl:7b",
    "",
]


@pytest.mark.parametrize("model", READS_IMAGES)
def test_auto_knows_the_vendors_vision_models(model: str) -> None:
    assert known_to_take_images(model)


@pytest.mark.parametrize("model", TEXT_ONLY)
def test_auto_counts_every_other_model_as_text_only(model: str) -> None:
    assert not known_to_take_images(model)


def settings(**values: Any) -> Settings:
    return Settings(_env_file=None, **values)  # type: ignore[call-arg]


def test_the_setting_decides_with_the_reply_model() -> None:
    assert settings().reads_images  # the default model, claude-sonnet-4-6
    assert settings(SONALITY_LLM_PROVIDER="openai").reads_images  # gpt-4.1
    assert not settings(SONALITY_MODEL="claude-3-5-haiku-latest").reads_images
    assert not settings(SONALITY_VISION="off").reads_images
    assert settings(SONALITY_VISION="on", SONALITY_MODEL="llava:13b").reads_images
    with pytest.raises(ValidationError, match="SONALITY_VISION"):
        settings(SONALITY_VISION="sometimes")
