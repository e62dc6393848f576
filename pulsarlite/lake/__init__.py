"""[lakehouse] ``pulsarlite.lake.scan``: the public name of the fresh view of a topic as one Arrow
table (docs/lakehouse.md). The code lives in the faces package, ``faces/lake.py``: it reads
through the Spark source, the offload format and the broker's typed columns, which the base
package may not import (docs/architecture.md#floors).

This module is the base package's second shim (the first is ``pulsarlite/__main__.py``): it holds
no code of its own and loads ``faces.lake`` on the first use of one of its names (a module
``__getattr__``, PEP 562), so ``import pulsarlite.lake`` alone loads no face and no component.
tests/unit/test_layout_faces.py names the two shims as the only modules of the base that import
a face, and only inside a function. It is a package (``pulsarlite/lake/__init__.py``) rather than
``pulsarlite/lake.py`` so that git sees the old ``pulsarlite/lake.py`` renamed to ``faces/lake.py``
and carries edits made to it on other branches there when they are merged.
"""

PUBLIC_NAMES = frozenset({"scan", "scan_batches", "ScanReport", "LakeScanError", "Source", "plan_sources"})


def __getattr__(name: str):
    if name in PUBLIC_NAMES:
        from faces import lake
        value = getattr(lake, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'pulsarlite.lake' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | PUBLIC_NAMES)
