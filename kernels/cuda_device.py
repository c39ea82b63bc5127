"""numba's CUDA target (the ``numba-cuda`` package) imported once, and what a GPU run lacks.

numba-cuda 0.30.4 registers an overload of ``np.row_stack`` when it is imported, and numpy 2.5
removed that function, so ``import numba.cuda`` raises AttributeError there. ``import_cuda``
lends numpy the alias (``np.vstack``, which ``row_stack`` always was) for the import only and
takes it back afterwards, so that no user code has to patch numpy and no other module sees the
alias.

Under numba's CUDA simulator (``NUMBA_ENABLE_CUDASIM=1`` in the environment before numba is
imported) the simulated card counts as a device: the GPU engines then run, slowly, on the CPU,
which is how the tests run them on machines without a GPU.
"""

import numpy as np

# the function numba-cuda 0.30.4 overloads and numpy 2.5 no longer has
ROW_STACK = "row_stack"


def import_cuda():
    """The ``numba.cuda`` module (raises ImportError when numba-cuda is missing)."""
    lent = ROW_STACK not in np.__dict__
    if lent:
        setattr(np, ROW_STACK, np.vstack)
    try:
        from numba import cuda
    finally:
        if lent and np.__dict__.get(ROW_STACK) is np.vstack:
            delattr(np, ROW_STACK)
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
