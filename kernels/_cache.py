"""numba's cache of the kernels, stamped with every kernel source a compiled kernel can hold.

numba stamps a function cached with ``cache=True`` with a hash of its own source file only, but
what it caches is the function compiled together with every kernel it calls, from other files
too: after an edit of a callee's file numba would load its callers with the old callee.
``KernelsLocator`` stamps a kernel with a hash of its file and of every kernels module that file
imports, transitively (read from the files' import statements), so that an edit recompiles the
kernels that can hold the edited code, and every other kernel stays cached.

A package built for others can ship its kernels compiled (``SHIPPED``, which ``dpmm warm
--portable`` fills): machine code for any CPU of the architecture (numba's ``generic`` CPU),
under the same stamps. A kernel missing from the user's cache is loaded from there before it is
compiled, so that a fresh install's first fit, and a fresh worker's first task, compile nothing.
"""

import ast
import functools
import hashlib
import os
from pathlib import Path

from numba.core import config
from numba.core.caching import (
    CacheImpl,
    FunctionCache,
    IndexDataCacheFile,
    InTreeCacheLocator,
    UserProvidedCacheLocator,
    UserWideCacheLocator,
    _CacheLocator,
)

ROOT = Path(__file__).resolve().parent
#: the shipped compiled kernels, one folder per kernels folder (``obs`` for ``kernels/obs``)
SHIPPED = ROOT / "_compiled"
#: the CPU name and features of the shipped code (numba's ``NUMBA_CPU_NAME`` and
#: ``NUMBA_CPU_FEATURES``): the architecture's baseline, which every CPU of it runs
PORTABLE_CPU = ("generic", "")
#: set to 1 in the processes that compile into ``SHIPPED`` (``dpmm warm --portable``); set to 0,
#: the shipped kernels are not read
SHIPPED_ENV = "DPMM_SHIPPED_KERNELS"
#: the environment of a process that compiles into ``SHIPPED``, set before numba is imported
PORTABLE_ENV = {
    SHIPPED_ENV: "1",
    "NUMBA_CPU_NAME": PORTABLE_CPU[0],
    "NUMBA_CPU_FEATURES": PORTABLE_CPU[1],
}
# the kernels' cache directory: ``NUMBA_CACHE_DIR`` when ``install`` runs (the kernels' import),
# else numba's own setting; None: numba's default places
_where: str | None = None
# whether this process compiles into ``SHIPPED`` (``SHIPPED_ENV`` 1), and whether it reads it
# (unless ``SHIPPED_ENV`` is 0)
building: bool = False
reading: bool = True


def _module_file(name, root):
    """The source file of the kernels module ``name`` (dotted) under ``root``, or None."""
    parts = name.split(".")
    if parts[0] != "kernels":
        return None
    base = root.joinpath(*parts[1:])
    # ``kernels`` itself is its ``__init__``; a submodule a file or a package
    for path in ([base.with_suffix(".py")] if parts[1:] else []) + [base / "__init__.py"]:
        if path.is_file():
            return path
    return None


@functools.cache
def _imports_of(path, root, mtime_ns, size):
    """The kernels modules' files the file at ``path`` imports, with their packages' (memoised
    on the file's state, as numba's own stamp)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                found = _module_file(".".join(parts[:i]), root)
                if found is not None:
                    out.add(found)
    return frozenset(out)


@functools.cache
def _digest(path, mtime_ns, size):
    return hashlib.sha256(path.read_bytes()).digest()


def source_stamp(py_file, root=ROOT):
    """Hex SHA-256 of the kernel file ``py_file`` and of every kernels module under ``root`` it
    imports, directly or through others."""
    root = Path(root).resolve()
    seen, todo = {}, [Path(py_file).resolve()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        st = seen[path] = os.stat(path)
        todo.extend(_imports_of(path, root, st.st_mtime_ns, st.st_size) - seen.keys())
    h = hashlib.sha256()
    for path, st in sorted(seen.items()):
        h.update(path.relative_to(root).as_posix().encode() + b"\0")
        h.update(_digest(path, st.st_mtime_ns, st.st_size))
    return h.hexdigest()


class _DirLocator(UserProvidedCacheLocator):
    """numba's locator of a user's cache directory, for ``_where`` instead of the directory
    numba read when it was imported."""

    def __init__(self, py_func, py_file):
        super().__init__(py_func, py_file)
        self._cache_path = os.path.join(_where, self.get_suitable_cache_subpath(py_file))

    @classmethod
    def from_function(cls, py_func, py_file):
        if not _where:
            return None
        # the source-backed mixin's: the directory made, None where it cannot be written
        return super(UserProvidedCacheLocator, cls).from_function(py_func, py_file)


class _ShippedLocator(InTreeCacheLocator):
    """The shipped kernels' folder of a kernel's file, for the processes that fill it."""

    def __init__(self, py_func, py_file):
        super().__init__(py_func, py_file)
        self._cache_path = str(_shipped_dir(py_file))


def _shipped_dir(py_file):
    return SHIPPED.joinpath(*Path(py_file).resolve().parent.relative_to(ROOT).parts)


class KernelsLocator(_CacheLocator):
    """numba's own locator for a kernel (``_where``, else ``__pycache__`` beside its file, else
    the user's cache) with ``source_stamp`` for its stamp; None off the kernels."""

    def __init__(self, inner, py_file):
        self._inner = inner
        self._py_file = py_file
        self._shipped = _shipped_dir(py_file)

    def ensure_cache_path(self):
        self._inner.ensure_cache_path()

    def get_cache_path(self):
        return self._inner.get_cache_path()

    def get_disambiguator(self):
        return self._inner.get_disambiguator()

    def get_source_stamp(self):
        return source_stamp(self._py_file)

    def load_shipped(self, cache, sig, target_context):
        """The compile result of ``cache``'s kernel for ``sig`` from the shipped kernels, or None
        (none shipped, another version of the kernels, another architecture)."""
        if not self._shipped.is_dir():
            return None
        sig_, magic, code = cache._index_key(sig, target_context.codegen())
        shipped = IndexDataCacheFile(
            str(self._shipped), cache._impl.filename_base, self.get_source_stamp()
        )
        data = shipped.load((sig_, (magic[0], *PORTABLE_CPU), code))
        return None if data is None else cache._impl.rebuild(target_context, data)

    @classmethod
    def from_function(cls, py_func, py_file):
        if not Path(py_file).resolve().is_relative_to(ROOT):
            return None
        if building:
            inner = _ShippedLocator.from_function(py_func, py_file)
            if inner is None:
                raise OSError(f"{_shipped_dir(py_file)}: cannot write the shipped kernels there")
            return cls(inner, py_file)
        for base in (_DirLocator, InTreeCacheLocator, UserWideCacheLocator):
            inner = base.from_function(py_func, py_file)
            if inner is not None:
                return cls(inner, py_file)
        return None


def install():
    """Put ``KernelsLocator`` first among numba's locators (the others serve every function
    outside the kernels, a user's own included), for the cache directory ``NUMBA_CACHE_DIR``
    names now. numba reads the variable once, when it is imported: a program that imported
    numba (or a library using it) before ``import pipeline`` set the variable would otherwise
    miss the cache ``dpmm warm`` filled and compile every kernel again."""
    global _where, building, reading
    _where = os.environ.get("NUMBA_CACHE_DIR") or config.CACHE_DIR or None
    shipped = os.environ.get(SHIPPED_ENV, "")
    building, reading = shipped == "1", shipped != "0"
    if building and (config.CPU_NAME, config.CPU_FEATURES) != PORTABLE_CPU:
        raise RuntimeError(
            f"{SHIPPED_ENV}=1 compiles the shipped kernels: it needs NUMBA_CPU_NAME=generic "
            "and NUMBA_CPU_FEATURES empty, set before numba is imported"
        )
    if KernelsLocator not in CacheImpl._locator_classes:
        CacheImpl._locator_classes.insert(0, KernelsLocator)
    if FunctionCache.load_overload is not _load_overload:
        global _numba_load_overload
        _numba_load_overload = FunctionCache.load_overload
        FunctionCache.load_overload = _load_overload


_numba_load_overload = FunctionCache.load_overload


def _load_overload(self, sig, target_context):
    """numba's ``FunctionCache.load_overload``, then, for a kernel missing from the user's
    cache, the shipped kernels'."""
    data = _numba_load_overload(self, sig, target_context)
    locator = self._impl.locator
    if data is None and reading and self._enabled and isinstance(locator, KernelsLocator):
        data = locator.load_shipped(self, sig, target_context)
    return data
