"""Seeds: ``random_state`` as a ``numpy.random.SeedSequence``, from which every restart, pass and
chunk takes a child, and the generator state the kernels are handed (``kernels.rng``).

A result then depends on the seed and the chunking alone, not on the number of workers, and a
resumed run draws what an uninterrupted one would have drawn.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import NDArray


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
