"""The GPU engines: MAP-DP and Bayes K-means passes on NVIDIA GPUs (``device="gpu"``).

``mapdp-gpu`` and ``kmeans-gpu`` are the CPU engines (``pipeline.engines.mapdp``,
``pipeline.engines.kmeans``) with another chunk step; starts, reduce, stop rule and write-out are
theirs. A chunk's step is optimistic concurrency control (Pan et al. 2013):

1. every record takes the argmin of the MAP-DP (or Bayes K-means) cost over the clusters frozen at
   the start of the pass and a new cluster, one thread per record (``kernels.cuda_mapdp.assign``);
2. the statistics of records that moved are summed on the card (``label_deltas``);
3. records that proposed a new cluster are resolved on the host, in the chunk's visiting order, by
   the CPU engine's sequential step, so that they gather in one new cluster instead of one each;
4. the chunk's change is kept only if it does not raise eq. 3.3 (Raykov et al. 2016) from the
   frozen clusters; otherwise the CPU step redoes the chunk (``ChunkResult.fallback``). The guard
   applies once every record of the chunk was in a cluster before the step.

Records are read once per chunk as float32 and kept on the card (``resident``, bounded by
``DPMM_GPU_RESIDENT_BYTES``, least recently used first out); later passes move only labels and
the packed clusters. The step is deterministic (no atomic adds), so a re-executed task gives the
same result bit for bit. Only continuous columns of one ``GaussianNW`` group are accepted.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from kernels import bayes_kmeans as kbk
from kernels import cuda_device
from kernels import mapdp as kmapdp
from kernels.obs import gaussian_nw, product
from kernels.rng import shuffle
from pipeline.core.errors import InputError
from pipeline.core.seeds import seed_state
from pipeline.engines.base import Chunk, RunContext
from pipeline.engines.kmeans import KmeansEngine
from pipeline.engines.mapdp import MapdpEngine
from pipeline.engines.mixture import ChunkResult, MixtureEngine, PassInput, pass_labels
from pipeline.engines.mixture_state import PassState, chunk_seed
from pipeline.families import FloatArray, ProductFamily
from pipeline.families.stats import Stats

#: the bytes of resident chunks a worker keeps on its card (default: half the card's memory)
RESIDENT_ENV = "DPMM_GPU_RESIDENT_BYTES"
#: under numba's simulator, which reports no memory
SIMULATED_RESIDENT = 1 << 30


class DeviceError(InputError):
    """``device="gpu"`` where the machine lacks a GPU, numba-cuda or a driver."""


def missing_device() -> str | None:
    """What a GPU run lacks here, as one line; None (the CUDA simulator counts as a device)."""
    # numba itself still ships a deprecated numba.cuda of its own: ask for the package
    if importlib.util.find_spec("numba_cuda") is None:
        return "numba-cuda is not installed; install the GPU extra: pip install -e '.[gpu]'"
    try:
        ok = cuda_device.available()
    except ImportError as e:
        return f"numba.cuda cannot be imported: {e}"
    except Exception as e:  # a driver that cannot be loaded raises instead of answering
        return f"no usable CUDA driver ({type(e).__name__}: {e})"
    if not ok:
        return "no CUDA GPU found (numba.cuda.is_available() is False: no NVIDIA driver or card)"
    return None


def require_device() -> None:
    """Raise ``DeviceError`` naming what is missing; never falls back to the CPU."""
    why = missing_device()
    if why is not None:
        raise DeviceError(f"device 'gpu': {why}")


def check_family(family: ProductFamily) -> None:
    """The kernels score one continuous Normal-Wishart group."""
    spec = np.asarray(family.spec)
    if spec.shape[0] != 1 or int(spec[0, 0]) != product.GAUSSIAN_NW:
        raise InputError(
            f"device 'gpu' clusters continuous records (family GaussianNW) only, got {family!r}"
        )


@dataclass
class Resident:
    """A chunk on the card: records (n, d) float32, training mask (n,) uint8."""

    X: Any
    train: Any
    hold: np.ndarray
    nbytes: int


_RESIDENT: OrderedDict[tuple[str, int, int, int], Resident] = OrderedDict()
# worker threads of one process share the resident chunks
_LOCK = threading.Lock()
# numba's simulator swaps a kernel module's ``cuda`` while it runs a kernel, so there one thread
# of a process at a time touches the device; a card takes calls from any thread
_SIM_LOCK = threading.Lock()


def launching() -> Any:
    """The context the kernels of a chunk step run in."""
    return _SIM_LOCK if cuda_device.simulated() else contextlib.nullcontext()


def resident_budget() -> int:
    """Bytes of resident chunks a worker keeps (``RESIDENT_ENV``)."""
    if RESIDENT_ENV in os.environ:
        return int(os.environ[RESIDENT_ENV])
    _free, total = cuda_device.memory()
    return total // 2 if total else SIMULATED_RESIDENT


def resident(chunk: Chunk) -> tuple[Resident, FloatArray | None]:
    """The chunk's records on the card, and, when they were read now, on the host too (float32
    values as float64); chunks beyond the budget are evicted least recently used first."""
    from kernels import cuda_mapdp

    key = (chunk.data, chunk.c, chunk.a, chunk.b)
    with _LOCK:
        got = _RESIDENT.get(key)
        if got is not None:
            _RESIDENT.move_to_end(key)
            return got, None
    X32 = np.ascontiguousarray(chunk.X, dtype=np.float32)
    hold = np.asarray(chunk.holdout, dtype=np.bool_)
    cuda_mapdp.check_width(X32.shape[1])
    with launching():
        r = Resident(
            cuda_mapdp.to_device(X32),
            cuda_mapdp.to_device((~hold).astype(np.uint8)),
            hold,
            X32.nbytes + hold.shape[0],
        )
    budget = resident_budget()
    with _LOCK:
        while _RESIDENT and sum(v.nbytes for v in _RESIDENT.values()) + r.nbytes > budget:
            _RESIDENT.popitem(last=False)
        if r.nbytes <= budget:
            _RESIDENT[key] = r
    return r, X32.astype(np.float64)


def host_records(chunk: Chunk) -> FloatArray:
    """The chunk's records as the card holds them (float32), in float64."""
    return np.asarray(chunk.X, dtype=np.float32).astype(np.float64)


@dataclass
class GpuChunkResult(ChunkResult):
    """A chunk's part of a pass, and whether the objective guard redid it on the host."""

    fallback: bool = False


class GpuPass(MixtureEngine):
    """The chunk step of the module docstring over a CPU engine's ``sweep`` (its host step)."""

    fused_write_out: ClassVar[bool] = False
    # step 3's statistics: the frozen ones, plus step 2's change for MAP-DP
    host_sees_moves: ClassVar[bool] = True

    def init_state(self, ctx: RunContext, client: Any) -> PassState:
        require_device()
        check_family(ctx.info.family)
        return super().init_state(ctx, client)

    def chunk_step(self, chunk: Chunk, msg: PassInput) -> GpuChunkResult:
        from kernels import cuda_mapdp

        require_device()
        t0 = time.perf_counter()
        fam = msg.family
        dev, X = resident(chunk)
        hold = dev.hold
        K = msg.stats.shape[0]
        z_old = pass_labels(chunk, msg, hold)
        order = np.flatnonzero(~hold).astype(np.int64)
        shuffle(seed_state(chunk_seed(msg.seed, msg.restart, msg.p, chunk.c)), order)
        host_msg = replace(msg, scores_into=None)
        if K > 0:
            cache = fam.cache_of(msg.stats)
            d = int(dev.X.shape[1])
            P = cuda_mapdp.pack(
                cache, np.ascontiguousarray(msg.stats[:, 0]), K, fam.empty_cache(), fam.prior, d
            )
            with launching():
                z_par, dz_old, dz_new = cuda_mapdp.assign(
                    dev.X,
                    dev.train,
                    z_old.astype(np.int32),
                    P,
                    K,
                    math.log(msg.alpha),
                    bool(gaussian_nw.has_cells(fam.prior, d)),
                )
                delta = cuda_mapdp.label_deltas(dev.X, dz_old, dz_new, K)
            z = z_par.astype(np.int64)
        else:
            # no cluster yet: every record proposes a new one
            z = z_old.copy()
            z[order] = K
            delta = np.zeros((0, fam.n_stats))
        proposers = order[z[order] >= K]
        z[proposers] = z_old[proposers]
        n_new = 0
        if proposers.size:
            X = host_records(chunk) if X is None else X
            base = msg.stats + delta if self.host_sees_moves else msg.stats.copy()
            # a cluster the moves emptied is a free slot: no rounding residue in its sums
            base[base[:, 0] == 0.0] = 0.0
            swept = self.sweep(chunk, replace(host_msg, stats=base), X, hold, proposers, z)
            z, n_new = swept.z, swept.n_new
            d2, new_stats = kbk.label_deltas(
                X, proposers, z_old, z, K, n_new, fam.spec, fam.n_stats
            )
            delta = delta + d2
        else:
            new_stats = np.zeros((0, fam.n_stats))
        fallback = False
        # records in no cluster before the step (pass 1) add their own terms to eq. 3.3: the
        # objective before the step is only comparable when every training record had a cluster
        if (z_old[order] >= 0).all() and self._rises(msg, delta, new_stats):
            fallback = True
            X = host_records(chunk) if X is None else X
            z = z_old.copy()
            swept = self.sweep(chunk, host_msg, X, hold, order, z)
            z = swept.z
            delta, new_stats = kbk.label_deltas(
                X, order, z_old, z, K, swept.n_new, fam.spec, fam.n_stats
            )
        n_changed = int(np.count_nonzero(z[order] != z_old[order]))
        z[hold] = -1
        chunk.write("z", z)
        return GpuChunkResult(
            chunk.c,
            Stats(delta, fam),
            Stats(new_stats, fam),
            n_changed,
            int(order.shape[0]),
            time.perf_counter() - t0,
            None,
            fallback,
        )

    @staticmethod
    def _rises(msg: PassInput, delta: FloatArray, new_stats: FloatArray) -> bool:
        """Whether the chunk's change raises eq. 3.3 of the frozen clusters (the guard)."""
        fam = msg.family
        before = msg.stats
        after = np.ascontiguousarray(np.vstack([msg.stats + delta, new_stats]))

        def e(s: FloatArray) -> float:
            nk = np.ascontiguousarray(s[:, 0])
            return float(kmapdp.objective(s, nk, s.shape[0], fam.spec, fam.prior, msg.alpha))

        return e(after) > e(before)

    def reduce(
        self, state: Any, results: list[Any], ctx: RunContext, scores_into: str | None
    ) -> tuple[PassState, dict[str, Any]]:
        new, record = super().reduce(state, results, ctx, scores_into)
        record["fallbacks"] = int(sum(bool(getattr(r, "fallback", False)) for r in results))
        record["device"] = "gpu"
        return new, record


class MapdpGpuEngine(GpuPass, MapdpEngine):
    name: ClassVar[str] = "mapdp-gpu"
    fused_write_out: ClassVar[bool] = False
    takes_missing: ClassVar[bool] = False  # the missing cells' fills are the CPU engine's


class KmeansGpuEngine(GpuPass, KmeansEngine):
    name: ClassVar[str] = "kmeans-gpu"
    host_sees_moves: ClassVar[bool] = False


ENGINES: dict[str, MixtureEngine] = {e.name: e for e in (MapdpGpuEngine(), KmeansGpuEngine())}
