"""``python -m pulsarlite``: the base package's entry shim. The command lives in the faces
package (``faces/cli.py``, also the ``pulsarlite`` console script); it is imported here, inside a
function, only when this module runs, so nothing that imports the base package loads a face or a
component (tests/unit/test_layout_faces.py names this module and ``pulsarlite/lake/__init__.py`` as the
only exceptions)."""

import sys


def _main() -> int:
    from faces.cli import main
    return main()


if __name__ == "__main__":
    sys.exit(_main())
