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


def layer_violations(
    graph: dict[str, set[str]], external: dict[str, set[str]]
) -> list[str]:
    """Each broken rule, as the import path that breaks it."""
    broken = []

    def under(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    for module in sorted(graph):
        if under(module, "minivllm.engine.sched"):
            parents = reach(graph, module)
            for target in sorted(parents):
                for banned in ("runner", "executor"):
                    if under(target, f"minivllm.engine.{banned}"):
                        broken.append(_path(parents, module, target))
                if under(target, "minivllm.kernels"):
                    broken.append(_path(parents, module, target))
            for target in sorted([module, *parents]):
                for lib in ("torch", "triton") if target in external else ():
                    if lib in external[target]:
                        broken.append(f"{_path({**parents}, module, target)} -> {lib}")
        if under(module, "minivllm.kernels"):
            broken += [
                f"{module} -> {t}" for t in sorted(graph[module]) if not under(t, "minivllm.kernels")
            ]
        if under(module, "minivllm.structured_output") or under(module, "minivllm.spec_decode"):
            broken += [
                f"{module} -> {t}" for t in sorted(graph[module]) if under(t, "minivllm.engine")
            ]
        if under(module, "minivllm.engine"):
            broken += [
                f"{module} -> {t}"
                for t in sorted(graph[module])
                if under(t, "minivllm.entrypoints")
            ]
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
    assert "minivllm.engine.sched.a -> minivllm.engine.sched.b -> minivllm.engine.runner.c" in broken
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
