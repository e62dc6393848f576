"""The ZooKeeper layout (pulsarlite/metadata_layout.py): the paths it builds are the ones the
components used before it existed (same znodes), and no other module of the product spells a
root of the layout again."""

import ast
import pathlib

import pytest

from pulsarlite import metadata_layout as layout

REPO = pathlib.Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("bookie", "broker", "faces", "offload", "pulsarlite", "spark_source")

# every znode root and sub-root of the layout; HTTP routes (/admin/v2/...) are not znodes
ROOTS = ("/ledgers", "/managed-ledgers", "/admin/clusters", "/admin/policies", "/admin/partitioned-topics",
         "/admin/topic-policies", "/admin/terminated-topics", "/namespace", "/loadbalance", "/schemas",
         "/non-persistent", "/pulsarlite")


def test_roots_are_the_documented_layout():
    assert layout.PULSARLITE_ROOTS == ("/ledgers", "/managed-ledgers", "/admin", "/namespace", "/loadbalance",
                                       "/schemas", "/non-persistent", "/pulsarlite")
    assert (layout.AVAILABLE_PATH, layout.READONLY_PATH, layout.COOKIES_PATH, layout.IDGEN_PREFIX,
            layout.RACKS_ROOT, layout.UNDERREPLICATION_ROOT) == (
        "/ledgers/available", "/ledgers/available/readonly", "/ledgers/cookies", "/ledgers/idgen/ID-",
        "/ledgers/racks", "/ledgers/underreplication")
    assert (layout.BROKERS_ROOT, layout.DEDUP_ROOT) == ("/loadbalance/brokers", "/pulsarlite/dedup")


def test_every_top_level_root_is_secured():
    """PULSARLITE_ROOTS is what a process with a ZooKeeper credential creates and ACLs at connect
    and what ``secure-znodes`` closes: a top-level root of the layout missing from it is open to
    whoever creates it first (``/non-persistent`` was)."""
    top_level = {value for name, value in vars(layout).items()
                 if name.endswith("_ROOT") and isinstance(value, str) and value.count("/") == 1}
    assert top_level and top_level == set(layout.PULSARLITE_ROOTS)
    assert all(root.split("/")[1] and root.count("/") == 1 for root in layout.PULSARLITE_ROOTS)


def test_paths_are_the_znodes_the_components_wrote():
    ml = "t/ns/persistent/x"
    assert layout.ledger_path(1) == "/ledgers/000/0000/0000/0000/L0001"
    assert layout.ledger_path(1234567890123456789) == "/ledgers/123/4567/8901/2345/L6789"
    assert layout.managed_ledger_path(ml) == "/managed-ledgers/t/ns/persistent/x"
    assert layout.managed_ledgers_of_namespace_path("t", "ns") == "/managed-ledgers/t/ns/persistent"
    assert layout.cursor_path(ml, "a/b %.") == "/managed-ledgers/t/ns/persistent/x/a%2Fb%20%25."
    assert layout.cursor_path(ml, "..") == "/managed-ledgers/t/ns/persistent/x/%2E%2E"
    assert layout.bookie_registration_path("b:3181", read_only=False) == "/ledgers/available/b:3181"
    assert layout.bookie_registration_path("b:3181", read_only=True) == "/ledgers/available/readonly/b:3181"
    assert layout.cookie_path("b:3181") == "/ledgers/cookies/b:3181"
    assert layout.rack_path("b:3181") == "/ledgers/racks/b:3181"
    assert layout.partitioned_topic_path(ml) == "/admin/partitioned-topics/t/ns/persistent/x"
    assert layout.partitioned_topics_of_namespace_path("t/ns") == "/admin/partitioned-topics/t/ns/persistent"
    assert layout.topic_policies_path(ml) == "/admin/topic-policies/t/ns/persistent/x"
    assert layout.terminated_path(ml) == "/admin/terminated-topics/t/ns/persistent/x"
    assert layout.dedup_path(ml) == "/pulsarlite/dedup/t/ns/persistent/x"
    assert layout.schema_path("t", "ns", "x") == "/schemas/t/ns/x"
    assert layout.non_persistent_path("t", "ns", "x") == "/non-persistent/t/ns/x"
    assert layout.cluster_path("c") == "/admin/clusters/c"
    assert layout.tenant_path("t") == "/admin/policies/t"
    assert layout.namespace_policies_path("t", "ns") == "/admin/policies/t/ns"
    assert layout.bundle_path("t/ns/0x00000000_0xffffffff") == "/namespace/t/ns/0x00000000_0xffffffff"
    assert layout.broker_path("broker-a") == "/loadbalance/brokers/broker-a"


def test_split_and_refuse():
    for ledger_id in (0, 1, 99_999, 2 ** 63 - 1):
        assert layout.ledger_id_from_path(layout.ledger_path(ledger_id)) == ledger_id
    for bad in ("/ledgers/available/b", "/managed-ledgers/000/0000/0000/0000/L0001", "/ledgers/000/0000/0000/0000/X1"):
        with pytest.raises(ValueError):
            layout.ledger_id_from_path(bad)
    assert layout.decode_cursor_name(layout.encode_cursor_name("a/b %")) == "a/b %"
    with pytest.raises(ValueError):
        layout.ledger_path(-1)
    for bad in ("", "a/b", "..", " a"):
        with pytest.raises(ValueError):
            layout.broker_path(bad)
        with pytest.raises(ValueError):
            layout.cookie_path(bad)
    with pytest.raises(ValueError):
        layout.managed_ledger_path("t/ns/non-persistent/x")


# -- no second spelling of a root ---------------------------------------------------------------
def _docstrings(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.add(id(first.value))
    return ids


def spelled_roots(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every string literal in ``source`` that starts with a root of the layout
    (a plain string, or the head of an f-string); docstrings and suffixes appended to another
    string (``route + "/schemas"``, an HTTP route) are not paths of the layout."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and isinstance(node.right, ast.Constant):
            skip.add(id(node.right))
        if isinstance(node, ast.JoinedStr):
            skip.update(id(v) for v in node.values[1:])
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if any(node.value == r or node.value.startswith(r + "/") for r in ROOTS):
                found.append((node.lineno, node.value))
    return sorted(found)


def test_the_detector_finds_a_spelled_root():
    source = ('"""Docs may say /managed-ledgers/t/ns/persistent/x."""\n'
              'A = "/managed-ledgers"\n'
              'B = f"/loadbalance/brokers/{x}"\n'
              'C = ROUTE + "/schemas"\n'
              'D = "/admin/v2/schemas/{tenant}"\n'
              'E = f"{ROOT}/ledgers/{x}"\n')
    assert spelled_roots(source) == [(2, "/managed-ledgers"), (3, "/loadbalance/brokers/")]


def test_no_module_but_the_layout_spells_a_root():
    offenders = []
    for package in PRODUCT_PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            if path == REPO / "pulsarlite" / "metadata_layout.py":
                continue
            for line, literal in spelled_roots(path.read_text(encoding="utf-8")):
                offenders.append(f"{path.relative_to(REPO)}:{line}: {literal!r}")
    assert offenders == [], "znode roots belong in pulsarlite/metadata_layout.py:\n" + "\n".join(offenders)


def test_the_layout_imports_nothing_but_the_stdlib():
    tree = ast.parse((REPO / "pulsarlite" / "metadata_layout.py").read_text(encoding="utf-8"))
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "urllib"}, imported
