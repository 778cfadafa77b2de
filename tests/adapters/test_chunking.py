"""split_message: size limit, preferred boundaries, balanced code fences, nothing lost.

The property checks run over many seeded random documents because the fence
bookkeeping has many edge positions (cut right after an opener, right before a
closer, inside a long code line) that hand-picked examples would miss.
"""

from __future__ import annotations

import random
import re

import pytest

from adapters.chunking import split_message

FENCE_TOKEN = re.compile(r"```[A-Za-z0-9_+#.\-]*")


def _content(text: str) -> str:
    """Non-whitespace characters with fence markers removed: what must survive."""
    return re.sub(r"\s+", "", FENCE_TOKEN.sub("", text))


def _random_document(rng: random.Random) -> str:
    words = ["alpha", "beta", "gamma", "delta", "x", "longerwordhere", "é", "🙂", "a_b"]
    parts: list[str] = []
    for _ in range(rng.randint(1, 14)):
        kind = rng.random()
        if kind < 0.55:
            n = rng.randint(1, 80)
            parts.append(" ".join(rng.choice(words) for _ in range(n)))
        elif kind < 0.85:
            lang = rng.choice(["", "py", "python", "c++", "js"])
            lines = [
                "    " * rng.randint(0, 2)
                + " ".join(rng.choice(words) for _ in range(rng.randint(0, 12)))
                for _ in range(rng.randint(1, 30))
            ]
            parts.append(f"```{lang}\n" + "\n".join(lines) + "\n```")
        else:
            parts.append(rng.choice(words) * rng.randint(20, 120))  # one over-long word
    seps = ["\n\n", "\n", " "]
    out = parts[0]
    for part in parts[1:]:
        sep = rng.choice(seps)
        if part.startswith("```") or out.endswith("```"):
            sep = "\n"
        out += sep + part
    return out


def test_short_text_is_one_chunk() -> None:
    assert split_message("hello world", 2000) == ["hello world"]


def test_blank_text_gives_no_chunks() -> None:
    assert split_message("", 2000) == []
    assert split_message(" \n\n ", 2000) == []


def test_prefers_paragraph_break() -> None:
    text = "a" * 30 + "\n\n" + "b " * 10 + "\n" + "c" * 10
    chunks = split_message(text, 50)
    assert chunks[0] == "a" * 30


def test_prefers_line_over_word() -> None:
    text = "one two three\nfour five six seven"
    assert split_message(text, 20) == ["one two three", "four five six seven"]


def test_word_boundary_then_hard_cut() -> None:
    assert split_message("aaa bbb ccc", 8) == ["aaa bbb", "ccc"]
    assert split_message("x" * 25, 10) == ["x" * 10, "x" * 10, "x" * 5]


def test_code_block_is_closed_and_reopened_with_language() -> None:
    code = "\n".join(f"print({i})" for i in range(40))
    text = f"Intro line.\n\n```python\n{code}\n```\n\nOutro."
    chunks = split_message(text, 120)
    assert len(chunks) > 2
    for chunk in chunks:
        assert len(chunk) <= 120
        assert chunk.count("```") % 2 == 0
    inner = [c for c in chunks if "print(" in c]
    assert all(c.startswith("```python\n") or c.startswith("Intro") for c in inner)
    assert all(c.endswith("```") for c in inner[:-1])
    assert inner[-1].endswith("```\n\nOutro.")
    assert _content("\n".join(chunks)) == _content(text)


def test_no_empty_block_when_cut_lands_on_closing_fence() -> None:
    # The blank line is a paragraph cut, so the next chunk would start at the closer.
    text = "```\n" + "y" * 40 + "\n\n```\n" + "tail " * 5
    chunks = split_message(text, 50)
    for chunk in chunks:
        assert chunk.replace("\n", "") != "``````"
        assert "```\n```" not in chunk, chunks


def test_unbalanced_input_gets_closed() -> None:
    text = "```py\n" + "z = 1\n" * 50
    chunks = split_message(text, 100)
    assert all(c.count("```") % 2 == 0 for c in chunks)


def test_four_thousand_five_hundred_chars_for_discord() -> None:
    text = "Here is the code:\n\n```py\n" + "x = 1  # comment\n" * 200 + "```\n\nDone. " * 3
    chunks = split_message(text, 2000)
    assert len(chunks) >= 2
    assert all(len(c) <= 2000 and c.count("```") % 2 == 0 for c in chunks)


@pytest.mark.parametrize("seed", range(300))
def test_properties_over_generated_documents(seed: int) -> None:
    rng = random.Random(seed)
    text = _random_document(rng)
    limit = rng.choice([16, 20, 40, 64, 100, 200, 500, 2000])
    chunks = split_message(text, limit)
    assert chunks, "non-blank text must produce chunks"
    for chunk in chunks:
        assert 0 < len(chunk) <= limit, (limit, chunk)
        assert chunk.count("```") % 2 == 0, chunk
        assert FENCE_TOKEN.sub("", chunk).strip(), "no empty code-block-only chunk"
    assert _content("\n".join(chunks)) == _content(text)
    # Words are only ever split when one alone exceeds the room in a chunk.
    if limit >= 200:
        text_words = [w for w in FENCE_TOKEN.sub(" ", text).split() if len(w) < 100]
        chunk_words = FENCE_TOKEN.sub(" ", "\n".join(chunks)).split()
        for word in set(text_words):
            assert word in chunk_words


@pytest.mark.parametrize("limit", [1, 2, 5, 15])
def test_tiny_limits_still_terminate_and_respect_limit(limit: int) -> None:
    text = "```py\nabc def\n```\nhello world"
    chunks = split_message(text, limit)
    assert all(len(c) <= limit for c in chunks)

    # Fences are off at such limits: the text is cut as plain characters.
    def strip(s: str) -> str:
        return re.sub(r"\s", "", s)

    assert strip("".join(chunks)) == strip(text)
