"""Seeds: ``random_state`` as a ``numpy.random.SeedSequence``, from which every restart, pass and
chunk takes a child, and the generator state the kernels are handed (``kernels.rng``).

A result then depends on the seed and the chunking alone, not on the number of workers, and a
resumed run draws what an uninterrupted one would have drawn.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray

#: the salts of a store's prior sample (and ``Schema.choose_structure``'s rows), of the rows a
#: MAP-DP restart is judged on (``MAPDP``'s ``n_restarts``) and of the folds of subjects the
#: mixed-effects model's ``shrink="auto"`` is judged on
SAMPLE_SALT, RESTART_SALT, FOLD_SALT = 0x5EED_0002, 0x40F, 0xF01D


def seed_state(seq: np.random.SeedSequence) -> NDArray[np.uint64]:
    """A kernel RNG state (uint64 array of shape (1,)) from a SeedSequence."""
    return np.asarray(seq.generate_state(1, dtype=np.uint64), dtype=np.uint64)


def as_seed_sequence(random_state: Any) -> np.random.SeedSequence:
    """``random_state`` (None, int, SeedSequence or Generator) as a SeedSequence."""
    if isinstance(random_state, np.random.SeedSequence):
        return random_state
    if isinstance(random_state, np.random.Generator):
        return np.random.SeedSequence(int(random_state.integers(2**63)))
    if isinstance(random_state, np.random.RandomState):
        return np.random.SeedSequence(int(random_state.randint(2**31)))
    return np.random.SeedSequence(random_state)


def seed_entropy(random_state: Any) -> int:
    """One integer of entropy from ``random_state`` (None draws a fresh one)."""
    seq = as_seed_sequence(random_state)
    return int(seq.generate_state(2, dtype=np.uint64).view(np.uint64)[0])


def row_uniform(rows: NDArray[np.int64], salt: int) -> NDArray[np.float64]:
    """A uniform number in [0, 1) per row index, splitmix64 of (row, salt): chunking-free."""
    offset = (int(salt) * 0xD1B54A32D192ED03 + 0x9E3779B97F4A7C15) % 2**64
    z = np.asarray(rows, dtype=np.uint64) + np.uint64(offset)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)
