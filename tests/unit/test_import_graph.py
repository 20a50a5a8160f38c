"""The packages' import graph, read with ``ast``: no module imports another that
(directly or through others) imports it back, and the layers import only down
the floors -- ``rlpost.algos`` <- ``rlpost.runtime`` <- ``rlpost.trainers`` and
``rlpost.rollout`` side by side <- the rest of ``rlpost`` -- never up into the
package that drives them, and never across between the two siblings."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LAYERS = ("algos", "runtime", "trainers", "rollout")  # bottom floor first
# trainers and rollout are siblings on one floor: neither imports the other
FLOOR = {"rlpost.algos": 0, "rlpost.runtime": 1, "rlpost.trainers": 2, "rlpost.rollout": 2}


def module_files() -> dict[str, Path]:
    """Every module's dotted name (as installed) and its file."""
    out = {}
    for folder, prefix in [("rlpost", "rlpost"), *((lay, f"rlpost.{lay}") for lay in LAYERS)]:
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join((prefix, *parts))] = path
    return out


def _type_checking_only(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports(name: str, path: Path, modules: set[str]) -> set[str]:
    """The modules ``name`` imports at run time (module level or inside functions;
    imports only for type checking left out)."""
    tree = ast.parse(path.read_text())
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if _type_checking_only(node, parents):
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in modules else base)
    return {m for m in found if m in modules and m != name}


def graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports(name, path, set(files)) for name, path in files.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def floor(module: str) -> int:
    """0-2 for the layers, 3 for the rest of rlpost."""
    for prefix, level in FLOOR.items():
        if module == prefix or module.startswith(prefix + "."):
            return level
    return 3


def test_the_checker_finds_a_circle_and_an_upward_import():
    # a -> b -> c -> a is one circle; d -> a is not part of it.
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c"]]
    assert floor("rlpost.runtime.hf_format") == 1 and floor("rlpost.loop.controller") == 3
    assert floor("rlpost.trainers.fsdp") == floor("rlpost.rollout.vllm") == 2
    source = "from rlpost.result import RunError\nif TYPE_CHECKING:\n    import rlpost.plan\n"
    path = REPO / "tests" / "unit" / "_graph_probe.py"
    path.write_text(source)
    try:
        assert imports("x", path, {"rlpost.result", "rlpost.plan"}) == {"rlpost.result"}
    finally:
        path.unlink()


def test_no_import_circles():
    assert circles(graph()) == []


def test_layers_import_only_down_the_floors():
    upward = [
        f"{src} -> {dst}"
        for src, dsts in graph().items()
        for dst in dsts
        if floor(src) < 3 and floor(dst) > floor(src)
    ]
    assert upward == []


def test_the_trainers_and_the_rollout_are_siblings():
    across = [
        f"{src} -> {dst}"
        for src, dsts in graph().items()
        for dst in dsts
        if floor(src) == floor(dst) == 2 and package_of(src) != package_of(dst)
    ]
    assert across == []


def test_every_package_says_what_it_owns():
    missing = [
        name
        for name, path in module_files().items()
        if path.name == "__init__.py"
        and name.count(".") == 1
        and not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert missing == []


def package_of(module: str) -> str:
    """``rlpost.loop.controller`` -> ``rlpost.loop``; the layers count as one each."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_rlpost_packages_import_one_way():
    # Package by package (rlpost.config, rlpost.loop, ..., the top modules each on
    # their own): no two import each other, directly or round a longer circle.
    packages: dict[str, set[str]] = {}
    for src, dsts in graph().items():
        targets = {package_of(d) for d in dsts} - {package_of(src)}
        packages.setdefault(package_of(src), set()).update(targets)
    for dsts in list(packages.values()):
        for d in dsts:
            packages.setdefault(d, set())
    packages.pop("rlpost", None)  # the notebook API's re-exports sit above everything
    for dsts in packages.values():
        dsts.discard("rlpost")
    assert circles(packages) == []
