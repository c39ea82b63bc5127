"""numba's CUDA target (``numba-cuda``) imported once, and what a GPU run lacks.

numba-cuda 0.30.4 overloads ``np.row_stack``, which numpy 2.5 removed: ``import_cuda`` gives
numpy the alias back (``np.vstack``) where it lacks it, and leaves it for the first kernel
compile, which loads that module again. Under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``
before numba is imported) the simulated card counts as a device (the tests without a GPU).
"""

import numpy as np

# the function numba-cuda 0.30.4 overloads and numpy 2.5 no longer has
ROW_STACK = "row_stack"


def import_cuda():
    """The ``numba.cuda`` module (raises ImportError when numba-cuda is missing)."""
    if ROW_STACK not in np.__dict__:
        setattr(np, ROW_STACK, np.vstack)
    from numba import cuda

    return cuda


def simulated():
    """Whether numba runs CUDA kernels in its simulator (``NUMBA_ENABLE_CUDASIM``)."""
    from numba.core import config

    return bool(config.ENABLE_CUDASIM)


def available():
    """Whether numba sees a CUDA device (the simulator's counts); raises what a driver that
    cannot be loaded raises."""
    return simulated() or bool(import_cuda().is_available())


def memory():
    """(free, total) bytes of the current device; (0, 0) under the simulator."""
    if simulated():
        return 0, 0
    free, total = import_cuda().current_context().get_memory_info()
    return int(free), int(total)
