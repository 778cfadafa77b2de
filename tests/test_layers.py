"""The whole import graph: every package imports only the layers below it.

The floors, bottom up (the folders say the same, see docs/architecture.md):

0. `sonality`: the engine, knows nothing of the bot around it;
1. `storage` (the only SQL), `providers` (the LLM SDKs), `chroma_memory` (episodes):
   each stands on the engine alone;
2. `bot`: the runtime and its features;
3. `adapters`: Discord, Slack and the terminal, in and out of the runtime's types;
4. `app`: the program (command line, start-up, wiring, the operator's commands);
5. `evaluate` and `bench`: programs that drive the whole bot.

`scripts/` only creates the environment and hands over, importing none of them; the
tests may import anything, and only the benchmarks may import the tests (their loopback
servers). Every module's syntax tree is walked, so an import inside a
function or behind `TYPE_CHECKING` counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLOORS: dict[str, int] = {
    "sonality": 0,
    "storage": 1,
    "providers": 1,
    "chroma_memory": 1,
    "bot": 2,
    "adapters": 3,
    "app": 4,
    "evaluate": 5,
    "bench": 5,
    "scripts": 6,
}


def imported_roots(tree: ast.AST) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def allowed(package: str, imported: str) -> bool:
    """Its own package, or one on a lower floor; scripts import no package at all."""
    if imported == package:
        return True
    if package == "scripts":
        return False
    return FLOORS[imported] < FLOORS[package]


MODULES = sorted(p for package in FLOORS for p in (ROOT / package).rglob("*.py"))


def test_every_package_is_walked() -> None:
    walked = {p.relative_to(ROOT).parts[0] for p in MODULES}
    assert walked == set(FLOORS)
    product = {p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file()}
    assert product - {"tests"} == set(FLOORS) - {"scripts"}, "a package without a floor"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_module_imports_only_the_floors_below(path: Path) -> None:
    package = path.relative_to(ROOT).parts[0]
    roots = imported_roots(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
    wrong = sorted(r for r in roots & set(FLOORS) if not allowed(package, r))
    assert not wrong, f"{package} (floor {FLOORS[package]}) imports {wrong}"
    if package != "bench":  # the benchmarks run the tests' loopback servers and stacks
        assert "tests" not in roots, f"{path.name} imports the tests"


def test_the_rule_refuses_upward_and_sideways_imports() -> None:
    assert allowed("adapters", "bot") and allowed("app", "adapters")
    assert not allowed("bot", "app")  # the wiring used to live in bot/ and import adapters
    assert not allowed("storage", "providers")  # same floor
    assert not allowed("app", "evaluate")  # evaluate is handed over as a process
    assert not allowed("scripts", "app")


def test_the_walker_sees_nested_and_aliased_imports() -> None:
    source = (
        "import os\n"
        "def f():\n"
        "    from storage.db import X\n"
        "    import chroma_memory.hosts as p\n"
        "from . import sibling\n"
    )
    assert imported_roots(ast.parse(source)) == {"os", "storage", "chroma_memory"}
