"""Measure the code's layout, before and after a layout change (issue 25, [layout]).

    python scripts/layout_report.py            # the repository's packages, text
    python scripts/layout_report.py --json     # the same figures as JSON
    python scripts/layout_report.py --root DIR --packages a b --top 10

Reads the source only (stdlib ``ast``; nothing is imported or executed). Generated protobuf
modules (``*_pb2.py``) are left out. What it prints:

- the biggest files (lines) and functions (lines from ``def`` to the last line of the body,
  methods and nested functions included, named ``module:Class.method``), ``--top`` of each;
- the imports inside functions (``import``/``from`` under a ``def``), in total and per package;
- import cycles: the strongly connected components of size > 1 of the module import graph
  between our modules, once with the imports a module runs when it is loaded (top level,
  ``if TYPE_CHECKING:`` blocks left out) and once with the imports inside functions added;
  and the same for the graph collapsed to the top-level packages;
- the exception classes (classes deriving, directly or through our own classes, from a
  built-in exception) and the number of files that define them.

An import of ``a.b.c`` (or ``from a.b import c`` where ``a/b/c.py`` exists) is an edge to the
module ``a.b.c`` only (not to the ``__init__`` modules Python also loads on the way).
"""

from __future__ import annotations

import argparse
import ast
import builtins
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

PACKAGES_DEFAULT = ("bookie", "broker", "faces", "offload", "pulsarlite", "spark_source")
TOP_DEFAULT = 15
BUILTIN_EXCEPTIONS = frozenset(name for name in dir(builtins)
                               if isinstance(getattr(builtins, name), type)
                               and issubclass(getattr(builtins, name), BaseException))


@dataclass
class Report:
    files: int = 0
    lines: int = 0
    biggest_files: list[tuple[str, int]] = field(default_factory=list)          # (path, lines)
    biggest_functions: list[tuple[str, int]] = field(default_factory=list)      # (qualname, lines)
    function_imports: int = 0
    function_imports_by_package: dict[str, int] = field(default_factory=dict)
    type_checking_imports: int = 0
    module_cycles_top_level: list[list[str]] = field(default_factory=list)
    module_cycles_with_function_imports: list[list[str]] = field(default_factory=list)
    package_edges_top_level: list[tuple[str, str]] = field(default_factory=list)
    package_edges_function_only: list[tuple[str, str]] = field(default_factory=list)
    package_cycles_top_level: list[list[str]] = field(default_factory=list)
    package_cycles_with_function_imports: list[list[str]] = field(default_factory=list)
    exception_classes: int = 0
    exception_files: int = 0
    exception_classes_by_file: dict[str, list[str]] = field(default_factory=dict)


@dataclass
class _Module:
    name: str
    path: str                       # relative to the root, '/'-separated
    is_package: bool                # an __init__.py
    tree: ast.Module
    line_count: int


def module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def load_modules(root: Path, packages: tuple[str, ...]) -> dict[str, _Module]:
    modules: dict[str, _Module] = {}
    for package in packages:
        base = root / package
        if not base.is_dir():
            raise SystemExit(f"layout_report: no package directory {base}")
        for path in sorted(base.rglob("*.py")):
            if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                continue
            rel = path.relative_to(root)
            source = path.read_text(encoding="utf-8")
            tree = ast.parse(source, filename=str(path))
            modules[module_name(rel)] = _Module(module_name(rel), rel.as_posix(),
                                                path.name == "__init__.py", tree,
                                                len(source.splitlines()))
    return modules


# -- imports -------------------------------------------------------------------------------------
def _is_type_checking(test: ast.expr) -> bool:
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _walk_imports(node: ast.AST, in_function: bool, type_only: bool):
    """Yields (import node, in_function, type_only) for every import under ``node``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, in_function, type_only
        elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            yield from _walk_imports(child, True, type_only)
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _walk_imports(ast.Module(body=[stmt], type_ignores=[]), in_function, True)
            for stmt in child.orelse:
                yield from _walk_imports(ast.Module(body=[stmt], type_ignores=[]), in_function, type_only)
        else:
            yield from _walk_imports(child, in_function, type_only)


def _resolve(name: str, modules: dict[str, _Module]) -> str | None:
    """The longest prefix of the dotted ``name`` that is one of our modules."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def import_targets(node: ast.Import | ast.ImportFrom, module: _Module,
                   modules: dict[str, _Module]) -> set[str]:
    """Our modules that one import statement names."""
    targets: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            found = _resolve(alias.name, modules)
            if found:
                targets.add(found)
        return targets
    if node.level:
        package = module.name.split(".") if module.is_package else module.name.split(".")[:-1]
        if node.level > 1:
            package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    for alias in node.names:
        sub = f"{base}.{alias.name}" if base else alias.name
        found = sub if sub in modules else _resolve(base, modules)
        if found:
            targets.add(found)
    return targets


# -- graphs --------------------------------------------------------------------------------------
def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's algorithm (iterative); components of more than one node, each sorted, largest
    first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []
    counter = 0
    nodes = sorted(set(graph) | {t for targets in graph.values() for t in targets})
    for start in nodes:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
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
    return sorted(components, key=lambda c: (-len(c), c))


def _collapse(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for source, targets in graph.items():
        top = source.split(".")[0]
        out.setdefault(top, set()).update(t.split(".")[0] for t in targets if t.split(".")[0] != top)
    return out


# -- exceptions ----------------------------------------------------------------------------------
def _base_name(base: ast.expr) -> str | None:
    if isinstance(base, ast.Name):
        return base.id
    if isinstance(base, ast.Attribute):
        return base.attr
    return None


def exception_classes(modules: dict[str, _Module]) -> dict[str, list[str]]:
    """path -> names of the exception classes it defines (bases resolved by name, to a fixpoint)."""
    classes: list[tuple[str, str, set[str]]] = []
    for module in modules.values():
        for node in ast.walk(module.tree):
            if isinstance(node, ast.ClassDef):
                bases = {b for b in map(_base_name, node.bases) if b}
                classes.append((module.path, node.name, bases))
    known = set(BUILTIN_EXCEPTIONS)
    changed = True
    while changed:
        changed = False
        for _, name, bases in classes:
            if name not in known and bases & known:
                known.add(name)
                changed = True
    found: dict[str, list[str]] = {}
    for path, name, bases in classes:
        if bases & known:
            found.setdefault(path, []).append(name)
    return dict(sorted(found.items()))


# -- functions -----------------------------------------------------------------------------------
def function_sizes(module: _Module) -> list[tuple[str, int]]:
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                qualname = f"{prefix}{child.name}"
                out.append((f"{module.name}:{qualname}", child.end_lineno - child.lineno + 1))
                visit(child, f"{qualname}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(module.tree, "")
    return out


# -- the report ----------------------------------------------------------------------------------
def measure(root: Path, packages: tuple[str, ...] = PACKAGES_DEFAULT, top: int = TOP_DEFAULT) -> Report:
    modules = load_modules(root, packages)
    report = Report(files=len(modules), lines=sum(m.line_count for m in modules.values()))
    report.biggest_files = sorted(((m.path, m.line_count) for m in modules.values()),
                                  key=lambda x: (-x[1], x[0]))[:top]
    functions = [f for m in modules.values() for f in function_sizes(m)]
    report.biggest_functions = sorted(functions, key=lambda x: (-x[1], x[0]))[:top]
    top_level: dict[str, set[str]] = {name: set() for name in modules}
    with_functions: dict[str, set[str]] = {name: set() for name in modules}
    by_package: dict[str, int] = {p: 0 for p in packages}
    for module in modules.values():
        for node, in_function, type_only in _walk_imports(module.tree, False, False):
            if in_function:
                report.function_imports += 1
                by_package[module.name.split(".")[0]] += 1
            if type_only:
                report.type_checking_imports += 1
                continue
            targets = import_targets(node, module, modules) - {module.name}
            with_functions[module.name] |= targets
            if not in_function:
                top_level[module.name] |= targets
    report.function_imports_by_package = by_package
    report.module_cycles_top_level = strongly_connected(top_level)
    report.module_cycles_with_function_imports = strongly_connected(with_functions)
    packages_top = _collapse(top_level)
    report.package_edges_top_level = sorted((s, t) for s, ts in packages_top.items() for t in ts)
    packages_all = _collapse(with_functions)
    report.package_edges_function_only = sorted((s, t) for s, ts in packages_all.items() for t in ts
                                                if t not in packages_top.get(s, ()))
    report.package_cycles_top_level = strongly_connected(packages_top)
    report.package_cycles_with_function_imports = strongly_connected(packages_all)
    found = exception_classes(modules)
    report.exception_classes_by_file = found
    report.exception_classes = sum(len(v) for v in found.values())
    report.exception_files = len(found)
    return report


def format_report(report: Report) -> str:
    out = [f"files {report.files}  lines {report.lines}", "",
           f"biggest files (lines), top {len(report.biggest_files)}:"]
    out += [f"  {lines:6d}  {path}" for path, lines in report.biggest_files]
    out += ["", f"biggest functions (lines), top {len(report.biggest_functions)}:"]
    out += [f"  {lines:6d}  {name}" for name, lines in report.biggest_functions]
    out += ["", f"imports inside functions: {report.function_imports}  ("
            + ", ".join(f"{p} {n}" for p, n in report.function_imports_by_package.items()) + ")",
            f"imports under 'if TYPE_CHECKING:' (left out of the graphs): {report.type_checking_imports}",
            "", "package imports at top level: "
            + (", ".join(f"{s}->{t}" for s, t in report.package_edges_top_level) or "none"),
            "package imports only inside functions: "
            + (", ".join(f"{s}->{t}" for s, t in report.package_edges_function_only) or "none"), ""]
    for title, cycles in (("package cycles, top-level imports", report.package_cycles_top_level),
                          ("package cycles, with imports inside functions",
                           report.package_cycles_with_function_imports),
                          ("module cycles, top-level imports", report.module_cycles_top_level),
                          ("module cycles, with imports inside functions",
                           report.module_cycles_with_function_imports)):
        out.append(f"{title}: {len(cycles)}")
        out += [f"  ({len(c)}) " + " ".join(c) for c in cycles]
    out += ["", f"exception classes: {report.exception_classes} in {report.exception_files} files"]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--packages", nargs="+", default=list(PACKAGES_DEFAULT))
    parser.add_argument("--top", type=int, default=TOP_DEFAULT)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error("--top must be at least 1")
    report = measure(args.root, tuple(args.packages), args.top)
    print(json.dumps(asdict(report), indent=1) if args.json else format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
