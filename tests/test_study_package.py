"""The study (study/) is a package: read from the source of every module (ast, nothing imported), no module edits
sys.path (it runs as `python -m study.<module>` from the repository root and imports its siblings as `study.<name>`)
and the imports among its modules, at the top or inside functions, absolute or relative, form no cycle."""

import ast
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "study"


def package_modules(root: Path = REPO_ROOT / PACKAGE, package: str = PACKAGE) -> dict[str, Path]:
    """Every module of the package under `root`: its dotted name and its file."""
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join((package, *parts))] = path
    return modules


def is_sys_path(node: ast.AST) -> bool:
    """`sys.path`."""
    return (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
            and node.value.id == "sys")


def sys_path_edits(source: str, filename: str) -> list[str]:
    """Where `source` edits the import path: a call of a method of sys.path (insert, append, extend, ...), an
    assignment or augmented assignment to it or to an item or slice of it, a `del` of one, `site.addsitedir`, or
    sys.path imported by name (`from sys import path`). Each as `file:line: what`."""
    tree = ast.parse(source, filename)
    edits = []
    for node in ast.walk(tree):
        where = f"{filename}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if is_sys_path(node.func.value):
                edits.append(f"{where}: sys.path.{node.func.attr}(...)")
            elif node.func.attr == "addsitedir":
                edits.append(f"{where}: addsitedir(...)")
        elif isinstance(node, ast.Name) and node.id == "addsitedir":
            edits.append(f"{where}: addsitedir")
        elif isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
            targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            for target in targets:
                if is_sys_path(target) or (isinstance(target, ast.Subscript) and is_sys_path(target.value)):
                    edits.append(f"{where}: sys.path assigned or deleted")
        elif isinstance(node, ast.ImportFrom) and node.module == "sys" and any(
                alias.name == "path" for alias in node.names):
            edits.append(f"{where}: from sys import path")
    return edits


def imported_modules(source: str, filename: str, module: str, is_package: bool, known: set[str]) -> set[str]:
    """The modules of `known` that the module `module` imports anywhere in `source` (at the top, inside functions,
    `import a.b`, `from a import b` of a submodule, relative imports)."""
    tree = ast.parse(source, filename)
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module
            names = [origin, *(f"{origin}.{alias.name}" for alias in node.names)]
        else:
            continue
        for name in names:
            # `import study.a.b` imports study, study.a and study.a.b: the deepest module of the package it names
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def bare_sibling_imports(source: str, filename: str, siblings: set[str]) -> list[str]:
    """Where `source` imports a module of the package by its bare name (`import bench_backbone`, `from
    multi30k_ledger import ...`): that only works with the package's folder on sys.path. Each as `file:line: name`."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names = [node.module]
        else:
            continue
        found += [f"{filename}:{node.lineno}: {name}" for name in names if name.split(".")[0] in siblings]
    return found


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    known = set(modules)
    return {name: imported_modules(path.read_text(encoding="utf-8"), str(path), name,
                                   path.name == "__init__.py", known)
            for name, path in modules.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph`: one per strongly connected component of more than one module (Tarjan's
    algorithm), each as the component's modules in order."""
    index, low, on_stack, stack, components = {}, {}, set(), [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_no_module_of_the_study_edits_sys_path():
    edits = [edit for path in package_modules().values()
             for edit in sys_path_edits(path.read_text(encoding="utf-8"), str(path.relative_to(REPO_ROOT)))]
    assert edits == [], "the study's modules import each other as `study.<name>`, without sys.path edits:\n" + \
        "\n".join(edits)


def test_no_module_imports_another_by_its_bare_name():
    modules = package_modules()
    # a module named like a standard library one (study.queue: `import queue` is the standard library's) is not
    # reachable by its bare name
    siblings = {name.rpartition(".")[2] for name in modules} - set(sys.stdlib_module_names) - {"__main__", PACKAGE}
    found = [line for path in modules.values() for line in bare_sibling_imports(
        path.read_text(encoding="utf-8"), str(path.relative_to(REPO_ROOT)), siblings)]
    assert found == [], "import the study's modules as `study.<name>`:\n" + "\n".join(found)


def test_the_study_modules_import_each_other_without_cycles():
    modules = package_modules()
    assert {"study", "study.__main__", "study.common", "study.queue", "study.bench_multi30k",
            "study.multi30k_ledger", "study.report"} <= set(modules)
    found = cycles(import_graph(modules))
    assert found == [], f"import cycles among the study's modules (move what both sides need lower down): {found}"


@pytest.mark.parametrize("source, count", [
    ("import sys\nsys.path.insert(0, 'x')\n", 1),
    ("import sys\nsys.path.append('x')\n", 1),
    ("import sys\nsys.path = ['x']\n", 1),
    ("import sys\nsys.path[:0] = ['x']\n", 1),
    ("import sys\nsys.path += ['x']\n", 1),
    ("import site\nsite.addsitedir('x')\n", 1),
    ("from site import addsitedir\naddsitedir('x')\n", 1),
    ("from sys import path\npath.insert(0, 'x')\n", 1),
    ("import sys\nprint(sys.path)\nimport os.path\nos.path.join('a', 'b')\n", 0),
])
def test_the_sys_path_check_sees_every_kind_of_edit(source, count):
    assert len(sys_path_edits(source, "planted.py")) == count


def test_the_cycle_check_sees_cycles_through_function_level_and_relative_imports(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("X = 1\n")
    (package / "a.py").write_text("from pkg import low\n\ndef f():\n    from . import b\n")
    (package / "b.py").write_text("import pkg.c\n")
    (package / "c.py").write_text("from .a import f\nfrom pkg.low import X\n")
    modules = package_modules(package, "pkg")
    assert cycles(import_graph(modules)) == [["pkg.a", "pkg.b", "pkg.c"]]
    (package / "a.py").write_text("from pkg import low\n")
    assert cycles(import_graph(modules)) == []
