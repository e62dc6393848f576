"""Bookie placement: which bookies form a new ensemble or replace a failed one.

Pure: the caller passes the writable bookies and a ``random.Random``; the candidates are sorted
first, so the choice depends only on the set and the rng's state.
"""

from __future__ import annotations

import random
from typing import Iterable, Sequence

from pulsarlite.errors import NotEnoughBookiesError


def choose_ensemble(writable_bookies: Iterable[str], ensemble_size: int,
                    rng: random.Random) -> tuple[str, ...]:
    """``ensemble_size`` distinct bookies picked at random; NotEnoughBookiesError if too few."""
    candidates = sorted(set(writable_bookies))
    if len(candidates) < ensemble_size:
        raise NotEnoughBookiesError(
            f"need {ensemble_size} writable bookies, have {len(candidates)}: {candidates}")
    return tuple(rng.sample(candidates, ensemble_size))


def choose_replacements(writable_bookies: Iterable[str], exclude: Iterable[str], count: int,
                        rng: random.Random) -> list[str]:
    """Up to ``count`` distinct writable bookies not in ``exclude`` (fewer if not enough)."""
    excluded = set(exclude)
    candidates: Sequence[str] = sorted(set(writable_bookies) - excluded)
    return rng.sample(list(candidates), min(count, len(candidates)))
