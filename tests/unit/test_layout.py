"""The package's shape (docs/explanation/architecture.md), beside the import-linter contracts in
pyproject.toml: no module imports itself back through others (imports inside
functions count), and no module uses another module's private names."""

from __future__ import annotations

import ast
from pathlib import Path

import grimp

PACKAGE = Path(__file__).resolve().parents[2] / "slawatch"


def test_no_module_is_part_of_an_import_cycle() -> None:
    graph = grimp.build_graph("slawatch")
    cycles = []
    for module in sorted(graph.modules):
        for imported in graph.find_modules_directly_imported_by(module):
            # An edge that the imported module can follow back is a cycle
            # (a package's __init__ importing its own children is not one).
            if imported.startswith(module + ".") or module.startswith(imported + "."):
                continue
            if graph.chain_exists(importer=imported, imported=module):
                cycles.append(f"{module} -> {imported} -> ... -> {module}")
    assert cycles == []


def _private_imports(path: Path) -> list[str]:
    found = []
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("slawatch"):
            for alias in node.names:
                if alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno}: {alias.name}")
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    paths = [*PACKAGE.rglob("*.py"), *(PACKAGE.parent / "tests").rglob("*.py")]
    found = [hit for path in sorted(paths) for hit in _private_imports(path)]
    assert found == []
