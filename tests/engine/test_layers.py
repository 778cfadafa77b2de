"""The engine's import graph: `sonality` knows nothing of the bot around it.

Walks the syntax tree of every module, so an import inside a function or behind
`TYPE_CHECKING` counts too. A platform, storage, provider or performance package
reaching the engine would tie the seed's pipeline to one deployment.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ENGINE = Path(__file__).resolve().parents[2] / "sonality"
FORBIDDEN = {"bot", "adapters", "storage", "providers", "chroma_memory", "bench", "tests"}


def imported_roots(tree: ast.AST) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


MODULES = sorted(ENGINE.rglob("*.py"))


def test_every_engine_module_is_checked() -> None:
    names = {p.relative_to(ENGINE).as_posix() for p in MODULES}
    assert {"agent.py", "memory/episodes.py", "memory/sponge.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(ENGINE).as_posix())
def test_engine_module_imports_nothing_outside_the_engine(path: Path) -> None:
    roots = imported_roots(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    assert not roots & FORBIDDEN, f"{path.name} imports {sorted(roots & FORBIDDEN)}"


def test_the_walker_sees_nested_and_aliased_imports() -> None:
    source = (
        "import os\n"
        "def f():\n"
        "    from storage.db import X\n"
        "    import chroma_memory.hosts as p\n"
        "from . import sibling\n"
    )
    assert imported_roots(ast.parse(source)) == {"os", "storage", "chroma_memory"}
