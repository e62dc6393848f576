"""scripts/layout_report.py on a tiny synthetic code base: cycles, nested imports, exception
classes and sizes are found where they are, and not where they are not."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "layout_report.py"


@pytest.fixture(scope="module")
def layout_report():
    spec = importlib.util.spec_from_file_location("layout_report", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["layout_report"] = module          # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("layout_report", None)


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


FILES = {
    "alpha/__init__.py": "",
    "alpha/a.py": """\
        from typing import TYPE_CHECKING

        from beta import b                     # top level: alpha.a -> beta.b

        if TYPE_CHECKING:
            from alpha import d                # type only: no edge

        class AlphaError(ValueError):
            pass

        class Plain:
            pass

        class NotAnError(Plain):
            pass

        def outer():
            import json                        # nested import 1 (not ours: no edge)

            def inner():
                from alpha import c            # nested import 2: alpha.a -> alpha.c
                return c
            return inner, json
        """,
    "alpha/c.py": """\
        from .a import AlphaError              # top level, relative: alpha.c -> alpha.a
        """,
    "alpha/d.py": """\
        from alpha.a import Plain              # alpha.d -> alpha.a; nothing back at run time
        """,
    "beta/__init__.py": "",
    "beta/b.py": """\
        import alpha.a                         # top level: beta.b -> alpha.a (the cycle)

        class BetaError(alpha.a.AlphaError):   # an exception through our own class
            pass

        class Worker:
            def run(self):
                x = 1
                y = 2
                return x + y
        """,
    "beta/gen_pb2.py": "class Ignored(Exception):\n    pass\n",   # generated: left out
}


def test_cycles_nested_imports_and_exception_classes(layout_report, tmp_path):
    _write(tmp_path, FILES)
    report = layout_report.measure(tmp_path, ("alpha", "beta"), top=3)

    assert report.files == 6
    assert report.module_cycles_top_level == [["alpha.a", "beta.b"]]
    assert report.module_cycles_with_function_imports == [["alpha.a", "alpha.c", "beta.b"]]
    assert report.package_cycles_top_level == [["alpha", "beta"]]
    assert report.function_imports == 2
    assert report.function_imports_by_package == {"alpha": 2, "beta": 0}
    assert report.type_checking_imports == 1
    assert report.exception_classes_by_file == {"alpha/a.py": ["AlphaError"], "beta/b.py": ["BetaError"]}
    assert (report.exception_classes, report.exception_files) == (2, 2)
    assert report.biggest_files[0] == ("alpha/a.py", len(textwrap.dedent(FILES["alpha/a.py"]).splitlines()))
    functions = dict(report.biggest_functions)
    assert functions["alpha.a:outer"] == 7
    assert functions["beta.b:Worker.run"] == 4
    assert len(report.biggest_functions) == 3


def test_no_cycle_without_the_edge_back(layout_report, tmp_path):
    files = dict(FILES)
    files["beta/b.py"] = "import json\n"
    files["alpha/a.py"] = FILES["alpha/a.py"].replace("from beta import b ", "import os      ")
    _write(tmp_path, files)
    report = layout_report.measure(tmp_path, ("alpha", "beta"))
    assert report.module_cycles_top_level == []
    assert report.package_cycles_top_level == []
    assert report.module_cycles_with_function_imports == [["alpha.a", "alpha.c"]]
    assert report.exception_classes == 1


def test_strongly_connected_components(layout_report):
    scc = layout_report.strongly_connected
    assert scc({"a": {"b"}, "b": {"c"}, "c": set()}) == []
    assert scc({"a": {"b"}, "b": {"a", "c"}, "c": {"d"}, "d": {"c"}, "e": {"a"}}) == [["a", "b"], ["c", "d"]]
    long_chain = {str(i): {str(i + 1)} for i in range(5000)}
    long_chain["5000"] = {"0"}                    # iterative: no recursion limit
    assert scc(long_chain) == [sorted(str(i) for i in range(5001))]


def test_main_prints_text_and_json(layout_report, tmp_path, capsys):
    _write(tmp_path, FILES)
    assert layout_report.main(["--root", str(tmp_path), "--packages", "alpha", "beta"]) == 0
    text = capsys.readouterr().out
    assert "module cycles, top-level imports: 1" in text
    assert "exception classes: 2 in 2 files" in text
    assert layout_report.main(["--root", str(tmp_path), "--packages", "alpha", "beta", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["function_imports"] == 2
