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


# import name -> distribution name, where they differ
DIST = {"yaml": "pyyaml", "web_agent_site": None}  # None: WebShop's own package, not on any index (docs/envs.md)


def test_every_package_imported_is_declared():
    """Every third-party module the package imports, at module level or inside a function, is a
    requirement in setup.cfg: ``install_requires`` or an extra (the optional backends and envs)."""
    import configparser
    import re
    import sys

    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))

    def names(text):
        return {re.split(r"[\[<>=!~ ;]", line.strip())[0].lower() for line in text.splitlines() if line.strip()}

    required = names(cfg["options"]["install_requires"])
    extras = set().union(*(names(v) for v in cfg["options.extras_require"].values()))
    imported = set()
    for path in _modules().values():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Import):
                imported.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported.add(node.module.split(".")[0])
    third_party = {m for m in imported if m not in sys.stdlib_module_names and m != "rspo_lightning"}
    assert {"torch", "lightning", "yaml", "safetensors", "packaging"} <= third_party  # the scan saw them
    missing = []
    for module in sorted(third_party):
        dist = DIST.get(module, module)
        if dist is not None and dist.replace("_", "-") not in required | extras and f"{dist}-cpu" not in extras:
            missing.append(module)
    assert not missing, f"imported but not declared in setup.cfg: {missing}"
    assert "ruff" not in required and "ruff" in names(cfg["options.extras_require"]["dev"])  # a developer tool
