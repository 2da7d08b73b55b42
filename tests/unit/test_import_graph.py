"""No import circle among the project's modules (issue 17: cluster/app.py → router/gateway.py →
router/routing/build.py → cluster/app.py was one, held together by an import inside a function).

The graph is read from the source with ast, so nothing is imported: every `import` counts,
also those inside functions (an import moved into a function hides a circle, it does not
break it) and those under `if TYPE_CHECKING:` (they never run, but a circle of types is still
two modules that each need the other to be read: router/disagg.py ↔ router/samples.py was one,
issue 30). A package's implicit import of its parents is not an edge: a facade `__init__`
re-exporting its modules (cluster/config/) is how Python packages work.

And the floors (issue 30): what runs in every process (the engine package, the protocol, the
types, the config, the block hash) imports nothing above it, replicas never import the
gateway's code, and the gateway never imports the deployments or the launcher. A rule names
module prefixes; it holds when no module under `source` reaches one under `never`, directly
or through others."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("cluster", "router", "prefill_workers", "decode_workers", "kv_transfer", "loadtest", "deploy")


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[str]:
    """Names of the modules `module` imports, as written (resolved against `modules` later)."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def import_graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        written = _imports(ast.parse(path.read_text(), str(path)), name, path.name == "__init__.py")
        graph[name] = {w for w in written if w in modules and w != name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (iterative DFS, white/grey/black)."""
    state: dict[str, int] = {}
    for root in sorted(graph):
        if state.get(root):
            continue
        stack = [(root, iter(sorted(graph[root])))]
        path = [root]
        state[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif not state.get(child):
                state[child] = 1
                stack.append((child, iter(sorted(graph[child]))))
                path.append(child)
    return None


def test_the_graph_sees_the_project():
    graph = import_graph()
    assert "router.routing.build" in graph["router.gateway"]
    assert "cluster.types" in graph["router.routing.build"]
    assert "router.gateway" in graph["cluster.app"]  # an import inside build_app counts


def test_find_cycle_finds_one_through_a_function_level_or_type_only_import():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    tree = ast.parse("def f():\n    from x import y\nif TYPE_CHECKING:\n    import z\n")
    assert _imports(tree, "m", False) == {"x", "x.y", "z"}


def test_no_import_circle_among_the_projects_modules():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import circle: " + " → ".join(cycle or [])


GROUND_FLOOR = ("cluster.engine", "cluster.protocol", "cluster.types", "cluster.config", "cluster.hashing",
                "cluster.metrics", "cluster.vllm_metrics")
LAUNCHER = ("cluster.app", "cluster.local", "cluster.cli", "cluster.console")
NEVER = [
    (GROUND_FLOOR, ("router", "loadtest", "deploy", "prefill_workers", "decode_workers", *LAUNCHER)),
    (("prefill_workers", "decode_workers", "kv_transfer"), ("router", "loadtest", "deploy", *LAUNCHER)),
    (("router",), ("prefill_workers", "decode_workers", "loadtest", "deploy", *LAUNCHER)),
]


def _under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def broken_rules(graph: dict[str, set[str]]) -> list[str]:
    """'a → b → c' for each module under a rule's source that reaches one under its `never`."""
    found = []
    for sources, never in NEVER:
        for root in sorted(m for m in graph if _under(m, sources)):
            parent = {root: None}
            todo = [root]
            while todo:
                node = todo.pop()
                for child in sorted(graph[node]):
                    if child in parent:
                        continue
                    parent[child] = node
                    if _under(child, never):
                        chain = [child]
                        while parent[chain[-1]] is not None:
                            chain.append(parent[chain[-1]])
                        found.append(" → ".join(reversed(chain)))
                    else:
                        todo.append(child)
    return found


def test_broken_rules_names_the_chain():
    graph = {"cluster.engine.fake": {"cluster.util"}, "cluster.util": {"router.hashing"}, "router.hashing": set()}
    assert broken_rules(graph) == ["cluster.engine.fake → cluster.util → router.hashing"]


def test_each_floor_imports_nothing_above_it():
    broken = broken_rules(import_graph())
    assert not broken, "imports that cross a floor (tests/unit/test_import_graph.py NEVER):\n" + "\n".join(broken)
