"""The client's modules import each other in one direction (issue 25, [layout]): the pure parts
(protocol core, chunk assembler, types, errors, auth) import nothing of the asyncio shell; the
shell's modules import only those before them in ``SHELL`` (connection, then the reconnect base,
then the receiver queues, producers, consumers, the multi-topic consumer); the faces (argument
handling, the blocking API, ``pulsarlite.aio``) come last. Read from the source with ``ast``
(module-level imports; those under ``if TYPE_CHECKING:`` are for annotations only and left out)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PURE = ["errors", "types", "auth", "chunking", "core"]
SHELL = ["connection", "handler", "sink", "producer", "consumer", "multi_consumer"]
FACES = ["common", "blocking"]


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return ((isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
            or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def client_imports(path: Path) -> set[str]:
    """The ``pulsarlite.client`` modules ``path`` imports at module level (short names)."""
    out: set[str] = set()
    tree = ast.parse(path.read_text(), str(path))
    body = list(tree.body)
    while body:
        node = body.pop(0)
        if isinstance(node, ast.If) and not _is_type_checking(node):
            body[:0] = node.body + node.orelse
        elif isinstance(node, ast.Try):
            body[:0] = node.body + node.finalbody + [n for h in node.handlers for n in h.body]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "pulsarlite.client":
                out.update(alias.name for alias in node.names)
            elif node.module.startswith("pulsarlite.client."):
                out.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pulsarlite.client."):
                    out.add(alias.name.split(".")[2])
    return out


def test_every_client_module_has_a_place_in_the_order():
    present = {p.stem for p in (ROOT / "pulsarlite" / "client").glob("*.py")} - {"__init__"}
    assert present == set(PURE + SHELL + FACES), \
        "a client module was added or removed: give it its place in PURE, SHELL or FACES"


def test_the_pure_parts_import_nothing_of_the_shell_or_the_faces():
    for name in PURE:
        imported = client_imports(ROOT / "pulsarlite" / "client" / f"{name}.py")
        assert imported <= set(PURE), f"client/{name}.py imports {sorted(imported - set(PURE))}"


def test_the_shell_imports_only_what_comes_before_it():
    for i, name in enumerate(SHELL):
        allowed = set(PURE) | set(SHELL[:i])
        imported = client_imports(ROOT / "pulsarlite" / "client" / f"{name}.py")
        assert imported <= allowed, f"client/{name}.py imports {sorted(imported - allowed)}"


def test_the_faces_come_last_and_nothing_imports_a_module_that_is_gone():
    order = PURE + SHELL + FACES
    for i, name in enumerate(FACES):
        allowed = set(order[:len(PURE) + len(SHELL) + i])
        imported = client_imports(ROOT / "pulsarlite" / "client" / f"{name}.py")
        assert imported <= allowed, f"client/{name}.py imports {sorted(imported - allowed)}"
    imported = client_imports(ROOT / "pulsarlite" / "aio.py")
    assert imported <= set(order) - {"blocking"}, f"pulsarlite/aio.py imports {sorted(imported)}"


def test_the_reader_sees_imports_where_they_are(tmp_path):
    """The guard itself can fail: an import of a later module is seen, under an if or a try
    too; one under ``if TYPE_CHECKING:`` is not."""
    path = tmp_path / "m.py"
    path.write_text("from typing import TYPE_CHECKING\n"
                    "from pulsarlite.client import core as k\n"
                    "import pulsarlite.client.sink\n"
                    "try:\n    from pulsarlite.client.producer import ProducerImpl\nexcept ImportError:\n    pass\n"
                    "if True:\n    from pulsarlite.client.multi_consumer import subscribe\n"
                    "if TYPE_CHECKING:\n    from pulsarlite.client.consumer import ConsumerImpl\n")
    assert client_imports(path) == {"core", "sink", "producer", "multi_consumer"}
