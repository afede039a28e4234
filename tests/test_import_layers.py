"""The floor plan as a rule: what each layer may reach through its imports (module level and
function-local, all but `if TYPE_CHECKING:` ones), read over the same graph as the cycle test.

- `engine/sched/` reaches no torch, triton, runner, executor or kernels (it is host policy);
- `kernels/` imports nothing of ours but other kernels;
- `structured_output/` and `spec_decode/` never import `engine/` (features below the engine);
- `engine/` never imports `entrypoints/` (the frontends sit above it).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.test_import_graph import PACKAGE, _module_name, _type_checking_imports, import_graph


def external_imports() -> dict[str, set[str]]:
    """module -> the top-level names of the third-party packages it imports."""
    out: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        tree = ast.parse(path.read_text())
        skip = _type_checking_imports(tree)
        names = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
        out[_module_name(path)] = names - {"minivllm"}
    return out


def reach(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module start reaches -> the module that imports it on one path from start."""
    seen: dict[str, str] = {}
    stack = [start]
    while stack:
        node = stack.pop()
        for nxt in graph[node]:
            if nxt not in seen and nxt != start:
                seen[nxt] = node
                stack.append(nxt)
    return seen


def _path(parents: dict[str, str], start: str, end: str) -> str:
    hops = [end]
    while hops[-1] != start:
        hops.append(parents[hops[-1]])
    return " -> ".join(reversed(hops))


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


# (package, packages of ours it must not import directly) for the one-hop rules.
_NO_DIRECT = [
    ("minivllm.structured_output", ("minivllm.engine",)),
    ("minivllm.spec_decode", ("minivllm.engine",)),
    ("minivllm.engine", ("minivllm.entrypoints",)),
]
_SCHED = "minivllm.engine.sched"
_SCHED_NEVER_REACHES = ("minivllm.engine.runner", "minivllm.engine.executor", "minivllm.kernels")


def layer_violations(graph: dict[str, set[str]], external: dict[str, set[str]]) -> list[str]:
    """Each broken rule, as the import path that breaks it."""
    broken = []
    for module in sorted(graph):
        if _under(module, _SCHED):  # what it reaches, through any number of imports
            parents = reach(graph, module)
            for target in sorted(parents):
                if any(_under(target, banned) for banned in _SCHED_NEVER_REACHES):
                    broken.append(_path(parents, module, target))
            for target in [module, *sorted(parents)]:
                for lib in sorted(external.get(target, set()) & {"torch", "triton"}):
                    broken.append(f"{_path(parents, module, target)} -> {lib}")
        if _under(module, "minivllm.kernels"):
            broken += [f"{module} -> {t}" for t in sorted(graph[module])
                       if not _under(t, "minivllm.kernels")]  # fmt: skip
        for package, banned in _NO_DIRECT:
            if _under(module, package):
                broken += [f"{module} -> {t}" for t in sorted(graph[module])
                           if any(_under(t, b) for b in banned)]  # fmt: skip
    return broken


def test_layers_hold() -> None:
    graph = import_graph()
    assert "minivllm.engine.sched.scheduler" in graph
    broken = layer_violations(graph, external_imports())
    assert not broken, "\n".join(broken)


def test_layer_violations_are_seen() -> None:
    graph = {
        "minivllm.engine.sched.a": {"minivllm.engine.sched.b"},
        "minivllm.engine.sched.b": {"minivllm.engine.runner.c"},
        "minivllm.engine.runner.c": set(),
        "minivllm.kernels.k": {"minivllm.layers.x"},
        "minivllm.layers.x": set(),
        "minivllm.spec_decode.s": {"minivllm.engine.types"},
        "minivllm.engine.types": set(),
        "minivllm.engine.core": {"minivllm.entrypoints.llm"},
        "minivllm.entrypoints.llm": set(),
    }
    external = {name: set() for name in graph} | {"minivllm.engine.runner.c": {"torch"}}
    broken = layer_violations(graph, external)
    assert (
        "minivllm.engine.sched.a -> minivllm.engine.sched.b -> minivllm.engine.runner.c" in broken
    )
    assert (
        "minivllm.engine.sched.a -> minivllm.engine.sched.b -> minivllm.engine.runner.c -> torch"
        in broken
    )
    assert "minivllm.kernels.k -> minivllm.layers.x" in broken
    assert "minivllm.spec_decode.s -> minivllm.engine.types" in broken
    assert "minivllm.engine.core -> minivllm.entrypoints.llm" in broken
    assert layer_violations({"minivllm.engine.sched.a": set()}, {}) == []


def test_reading_a_real_file() -> None:
    assert "torch" in external_imports()["minivllm.layers.sampler"]
    assert Path(PACKAGE / "engine" / "sched").is_dir()
