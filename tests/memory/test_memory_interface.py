"""Features reach memories only through the memory interface.

Why: forget-me found a member's insights with `getattr(agent.episodes, "semantic_ids")`
and the data export asked `isinstance(memory, InspectableMemory)`, so a store without
those methods was passed over in silence (the seed's store kept a forgotten member's
insights). Both are now methods of `EpisodeMemory`, which every store implements and
mypy checks; this test keeps code outside the memory packages from probing memory
objects for what they might have again.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The packages that implement memories (and the tests): they may look at their own.
IMPLEMENTING = frozenset({"sonality", "chroma_memory", "tests"})
PROBES = frozenset({"getattr", "hasattr", "isinstance"})
#: An expression naming a memory object: `memory`, `agent.episodes`, `runtime.memory`.
MEMORY_OBJECT = re.compile(r"(?:^|\.)(?:episodes|memory)$")
#: A class of memory, as the second argument of `isinstance`.
MEMORY_CLASS = re.compile(r"(?:Memory|Store)$")


def product_files() -> list[Path]:
    packages = [
        p
        for p in sorted(ROOT.iterdir())
        if (p / "__init__.py").is_file() and p.name not in IMPLEMENTING
    ]
    return [f for package in packages for f in sorted(package.rglob("*.py"))]


def probes(source: str) -> list[str]:
    """Every getattr/hasattr/isinstance call on a memory object or for a memory class."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in PROBES
            and node.args
        ):
            continue
        target = ast.unparse(node.args[0])
        kind = ast.unparse(node.args[1]) if len(node.args) > 1 else ""
        if MEMORY_OBJECT.search(target) or (
            node.func.id == "isinstance" and MEMORY_CLASS.search(kind)
        ):
            found.append(ast.unparse(node))
    return found


def test_the_scan_sees_the_product_and_finds_what_it_looks_for() -> None:
    names = {f.relative_to(ROOT).as_posix() for f in product_files()}
    assert {"bot/forget_me.py", "bot/mydata.py", "adapters/slack.py"} <= names
    assert not any(n.startswith(("sonality/", "chroma_memory/")) for n in names)
    source = (
        "find = getattr(agent.episodes, 'semantic_ids', None)\n"
        "if isinstance(memory, InspectableMemory): pass\n"
        "ok = hasattr(self.runtime.memory, 'reopens')\n"
        "fine = isinstance(value, int) and getattr(settings, 'x')\n"
    )
    assert probes(source) == [
        "getattr(agent.episodes, 'semantic_ids', None)",
        "isinstance(memory, InspectableMemory)",
        "hasattr(self.runtime.memory, 'reopens')",
    ]


@pytest.mark.parametrize("path", product_files(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_feature_probes_a_memory_object(path: Path) -> None:
    assert probes(path.read_text(encoding="utf-8")) == []
