"""Bookie placement: which bookies form a new ensemble or replace a failed one.

Pure: the caller passes the writable bookies and a ``random.Random``; the candidates are sorted
first, so the choice depends only on the set and the rng's state.

Racks (``racks``: bookie id -> rack, from /ledgers/racks; see bookie/autorecovery/racks.py):
an ensemble is spread over racks where possible. Each pick is made at random among the
candidates whose rack holds the fewest bookies chosen so far; a bookie with no rack is its own
unknown rack (never counted with another). With fewer racks than bookies, racks repeat as
evenly as the candidates allow. Without racks the choice is the plain random sample it was.
"""

from __future__ import annotations

import random
from typing import Iterable, Mapping, Sequence

from pulsarlite.errors import NotEnoughBookiesError


def _spread(candidates: list[str], count: int, used: Iterable[str], racks: Mapping[str, str],
            rng: random.Random) -> list[str]:
    """``count`` of ``candidates`` (sorted), each from a least-used rack (``used``: bookies
    already in the ensemble count for their racks). A bookie without a rack counts as an
    unused rack of its own."""
    per_rack: dict[str, int] = {}
    for b in used:
        if racks.get(b):
            per_rack[racks[b]] = per_rack.get(racks[b], 0) + 1
    left = list(candidates)
    chosen: list[str] = []
    while left and len(chosen) < count:
        load = {b: per_rack.get(racks[b], 0) if racks.get(b) else 0 for b in left}
        least = min(load.values())
        pick = rng.choice([b for b in left if load[b] == least])
        chosen.append(pick)
        left.remove(pick)
        if racks.get(pick):
            per_rack[racks[pick]] = per_rack.get(racks[pick], 0) + 1
    return chosen


def choose_ensemble(writable_bookies: Iterable[str], ensemble_size: int,
                    rng: random.Random, racks: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """``ensemble_size`` distinct bookies picked at random (spread over ``racks`` where
    possible); NotEnoughBookiesError if too few."""
    candidates = sorted(set(writable_bookies))
    if len(candidates) < ensemble_size:
        raise NotEnoughBookiesError(
            f"need {ensemble_size} writable bookies, have {len(candidates)}: {candidates}")
    if racks:
        return tuple(_spread(candidates, ensemble_size, (), racks, rng))
    return tuple(rng.sample(candidates, ensemble_size))


def choose_replacements(writable_bookies: Iterable[str], exclude: Iterable[str], count: int,
                        rng: random.Random, racks: Mapping[str, str] | None = None,
                        keep: Iterable[str] = ()) -> list[str]:
    """Up to ``count`` distinct writable bookies not in ``exclude`` (fewer if not enough);
    with ``racks``, from the racks least used by ``keep`` (the bookies staying in the
    ensemble) and the replacements already chosen."""
    excluded = set(exclude)
    candidates: Sequence[str] = sorted(set(writable_bookies) - excluded)
    if racks:
        return _spread(list(candidates), count, keep, racks, rng)
    return rng.sample(list(candidates), min(count, len(candidates)))
