"""What a kept message says about its pictures, and what the evidence rating sees.

Images are never kept: the record notes how many came ("[shared 2 images]"), so the
reply's memory says a picture was shared, and `member_words` takes the note off again
so the ESS judges the member's words alone.
"""

from __future__ import annotations

from sonality.llm import ChatTurn, ImagePart
from sonality.prompts import (
    build_messages,
    image_note,
    member_words,
    noted_images,
    with_image_note,
)


def test_the_note_counts_the_pictures_and_comes_off_again() -> None:
    assert image_note(1) == "[shared 1 image]" and image_note(3) == "[shared 3 images]"
    for words in ("look at this", "", "two\nlines"):
        for count in (1, 2, 4):
            kept = with_image_note(words, count)
            assert member_words(kept) == words
            assert noted_images(kept) == image_note(count)
    assert with_image_note("no pictures", 0) == "no pictures"
    assert noted_images("no pictures") == "" and member_words("no pictures") == "no pictures"


def test_only_a_trailing_note_is_taken_for_one() -> None:
    """The words may mention a note; only the one at the end is the bot's."""
    said = "I typed [shared 1 image] myself, and more"
    assert member_words(said) == said and noted_images(said) == ""


def test_pictures_go_in_the_newest_turn_only() -> None:
    image = ImagePart(media_type="image/png", data=b"\x89PNG")
    history = [ChatTurn(role="user", content="a"), ChatTurn(role="assistant", content="b")]
    turns = build_messages(history, "c", [image])
    assert [t.images for t in turns] == [(), (), (image,)]
    assert turns[1].cache and not turns[2].cache  # the cached prefix ends before them
