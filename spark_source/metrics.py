"""Metrics files (what tests and operators look at): one JSON file per event in a directory."""

from __future__ import annotations

import json
import os
import uuid


def record(metrics_dir: str | None, kind: str, payload: dict) -> None:
    """One JSON file per event in ``metrics_dir`` (written whole, then renamed: readers never
    see half a file)."""
    if not metrics_dir:
        return
    os.makedirs(metrics_dir, exist_ok=True)
    name = f"{kind}-{uuid.uuid4().hex}.json"
    tmp = os.path.join(metrics_dir, "." + name)
    with open(tmp, "w") as f:
        json.dump(payload, f)
    os.replace(tmp, os.path.join(metrics_dir, name))


__all__ = ["record"]
