"""The faces of pulsarlite: what users run, on top of every other floor (docs/architecture.md#floors).

- ``faces.cli`` and ``faces.cli_*``: the ``pulsarlite`` command (also ``python -m pulsarlite``,
  through the base package's entry shim ``pulsarlite/__main__.py``), one module per family of
  subcommands;
- ``faces.cluster``: ``LocalCluster``, the local cluster launcher (tests, benchmarks,
  ``pulsarlite cluster``);
- ``faces.standalone``: ``pulsarlite standalone`` (ZooKeeper + bookies + broker + a tier in one
  command);
- ``faces.lake``: ``scan``, the fresh view of a topic as one Arrow table (users call it by its
  public name ``pulsarlite.lake.scan``: a lazy shim in the base package).

The faces may import any floor; the base package ``pulsarlite/`` imports no face and no
component (tests/unit/test_layout_faces.py; its two entry shims import ``faces`` inside a function
only). The Python client stays in the base package (``pulsarlite.client``, ``pulsarlite.aio``): it
imports only the base.
"""
