"""Names from every platform (`adapters.sanitize.clean_name`): no markdown link."""

from __future__ import annotations

import pytest

from adapters.sanitize import clean_name


@pytest.mark.parametrize(
    ("raw", "clean"),
    [
        ("[Vote here](https://evil.example)", "(Vote here)(https://evil.example)"),
        ("[Vote](<https://evil.example>)", "(Vote)(<https://evil.example>)"),
        ("[TAG] Player", "(TAG) Player"),
        # Ordinary names are kept as they are.
        ("snake_case.name-1", "snake_case.name-1"),
        ("Zoë 🏳️\u200d🌈", "Zoë 🏳️\u200d🌈"),
        ("(round) *stars*", "(round) *stars*"),
    ],
)
def test_a_name_cannot_form_a_markdown_link(raw: str, clean: str) -> None:
    assert clean_name(raw) == clean
    assert "[" not in clean_name(raw) and "]" not in clean_name(raw)
