"""Registers the ``chaos`` marker (deselect with ``-m "not chaos"``)."""


def pytest_configure(config):
    config.addinivalue_line("markers", "chaos: a bounded chaos run (real cluster, fault schedule, checker)")
