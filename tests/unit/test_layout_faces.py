"""[layout] The base package imports no component and no face (docs/architecture.md#floors).

``pulsarlite/`` is floor 1: it may import the standard library and third-party libraries only.
The components (``bookie``, ``broker``, ``offload``, ``spark_source``) and the faces (``faces``:
the CLI, the launchers, the lake scan) sit above it. Two modules of the base are entry shims and
may import ``faces`` -- only inside a function, never at module level, and nothing else above the
base: ``pulsarlite/__main__.py`` (``python -m pulsarlite``) and ``pulsarlite/lake/__init__.py``
(the public name ``pulsarlite.lake.scan``).

Checked twice: statically (an AST walk of every module of the base: ``import``/``from`` at any
depth, in functions and ``if`` blocks too, and ``importlib.import_module``/``__import__`` with a
literal name), and at run time (a fresh interpreter imports every module of the base and must not
have loaded any component or face).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "pulsarlite"
ABOVE_THE_BASE = ("bookie", "broker", "faces", "offload", "spark_source")
# module of the base -> the packages above the base it may import, inside a function only
ENTRY_SHIMS = {"pulsarlite/__main__.py": ("faces",), "pulsarlite/lake/__init__.py": ("faces",)}


def imports_above_the_base(source: str) -> list[tuple[int, str, bool]]:
    """(line, imported module, at module level?) of every import in ``source`` whose top-level
    package is above the base; relative imports stay inside their package and are not listed."""
    tree = ast.parse(source)
    nested = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            nested.update(id(child) for child in ast.walk(node) if child is not node)
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if called in ("import_module", "__import__"):
                names = [node.args[0].value]
        for name in names:
            if name.split(".")[0] in ABOVE_THE_BASE:
                found.append((node.lineno, name, id(node) not in nested))
    return sorted(found)


def base_modules() -> list[Path]:
    return sorted(BASE.rglob("*.py"))


def test_the_detector_finds_every_form_of_import():
    source = textwrap.dedent("""\
        import json
        import broker.config
        from bookie.client import reader
        from . import errors
        from .wire import entry
        if True:
            import offload.format as fmt
        def f():
            from spark_source.options import parse_options
            import importlib
            importlib.import_module("faces.cli")
            return __import__("broker")
        class C:
            def m(self):
                from faces import lake
        g = lambda: __import__("offload")
        """)
    assert imports_above_the_base(source) == [
        (2, "broker.config", True),
        (3, "bookie.client", True),
        (7, "offload.format", True),
        (9, "spark_source.options", False),
        (11, "faces.cli", False),
        (12, "broker", False),
        (15, "faces", False),
        (16, "offload", False),
    ]


def test_no_module_of_the_base_imports_a_component_or_a_face():
    offenders = []
    for path in base_modules():
        rel = path.relative_to(REPO).as_posix()
        allowed = ENTRY_SHIMS.get(rel, ())
        for line, name, top_level in imports_above_the_base(path.read_text(encoding="utf-8")):
            if name.split(".")[0] in allowed and not top_level:
                continue
            offenders.append(f"{rel}:{line}: {name}" + (" (module level)" if top_level else ""))
    assert offenders == [], ("the base package (pulsarlite/) may not import "
                             f"{', '.join(ABOVE_THE_BASE)}; move the code to the faces package "
                             "or below the base:\n" + "\n".join(offenders))


def test_the_entry_shims_exist_and_import_only_the_faces():
    for rel, allowed in ENTRY_SHIMS.items():
        found = imports_above_the_base((REPO / rel).read_text(encoding="utf-8"))
        assert found, f"{rel} is named as an entry shim but imports no face: drop it from ENTRY_SHIMS"
        assert {name.split(".")[0] for _, name, _ in found} <= set(allowed)


def test_importing_every_module_of_the_base_loads_no_component_or_face():
    modules = []
    for path in base_modules():
        rel = path.relative_to(REPO).with_suffix("")
        if rel.name == "__main__":
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        modules.append(".".join(parts))
    program = textwrap.dedent(f"""\
        import importlib, json, sys
        for name in {modules!r}:
            importlib.import_module(name)
        print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {ABOVE_THE_BASE!r})))
        """)
    out = subprocess.run([sys.executable, "-c", program], cwd=REPO, capture_output=True, text=True,
                         check=True)
    assert {"pulsarlite.lake", "pulsarlite.metadata", "pulsarlite.client"} <= set(modules)
    assert json.loads(out.stdout) == []


def test_the_public_lake_name_is_the_faces_scan():
    import faces.lake
    import pulsarlite.lake

    for name in pulsarlite.lake.PUBLIC_NAMES:
        assert getattr(pulsarlite.lake, name) is getattr(faces.lake, name)
    from pulsarlite.lake import LakeScanError, scan
    assert scan is faces.lake.scan and issubclass(LakeScanError, Exception)


def test_python_dash_m_pulsarlite_runs_the_command():
    out = subprocess.run([sys.executable, "-m", "pulsarlite", "--help"], cwd=REPO,
                         capture_output=True, text=True, check=True)
    assert out.stdout.startswith("usage: pulsarlite")
    assert "standalone" in out.stdout and "bookkeeper" in out.stdout
