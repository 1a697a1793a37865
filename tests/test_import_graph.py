"""The import graph of ``rspo_lightning`` (issue 45, docs/design.md §2), read from the source with
``ast``, every import counted, function-level ones included: no cycle, and the pure stages import
no config and no Lightning. (A test rather than import-linter: no extra dependency, and the same
check runs in the README's test line.)"""

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PURE = ("advantages", "losses", "batching", "logprobs", "types", "choices")


def _modules() -> dict[str, str]:
    out = {}
    for folder, _, files in os.walk(os.path.join(ROOT, "rspo_lightning")):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(folder, f)
                name = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


def _imports(path: str, name: str, modules) -> set[str]:
    """Every module ``path`` imports (``from pkg import mod`` is ``pkg.mod``), package-internal or not."""
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in modules]
            found.update(subs)
            if len(subs) < len(node.names):
                found.add(base)
    return found - {name}


def _graph():
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}, modules


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_the_package_has_no_import_cycle_function_level_imports_included():
    graph, modules = _graph()
    internal = {m: {d for d in deps if d in modules} for m, deps in graph.items()}
    assert len(internal) > 40 and sum(map(len, internal.values())) > 100  # the graph was read
    assert _cycles(internal) == []
    # the check can fail: a cycle made by hand is found
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_pure_stages_import_no_config_and_no_lightning():
    graph, _ = _graph()
    for stage in PURE:
        deps = graph[f"rspo_lightning.{stage}"]
        bad = sorted(d for d in deps if d.split(".")[0] == "lightning" or d == "rspo_lightning.config")
        assert not bad, f"rspo_lightning.{stage} imports {bad}"


def test_rspo_sits_below_the_module_and_the_cli():
    graph, _ = _graph()
    for name, deps in graph.items():
        if name.startswith("rspo_lightning.rspo"):
            above = sorted(
                d for d in deps if d in ("rspo_lightning.module", "rspo_lightning.cli") or ".datamodules" in d
            )
            assert not above, f"{name} imports {above}"


def test_the_config_classes_import_no_transformers():
    """``config.py`` (every config dataclass a module takes) loads without transformers: the tiny
    model's config lives there, not in the transformers-backed ``language_model``."""
    graph, _ = _graph()
    deps = graph["rspo_lightning.config"]
    assert not {d for d in deps if d.split(".")[0] == "transformers" or d == "rspo_lightning.language_model"}
