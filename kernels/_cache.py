"""numba's cache of the kernels, stamped with every kernel source a compiled kernel can hold.

numba stamps a function cached with ``cache=True`` with a hash of its own source file only, but
what it caches is the function compiled together with every kernel it calls, from other files
too: after an edit of a callee's file numba would load its callers with the old callee.
``KernelsLocator`` stamps a kernel with a hash of its file and of every kernels module that file
imports, transitively (read from the files' import statements), so that an edit recompiles the
kernels that can hold the edited code, and every other kernel stays cached.
"""

import ast
import functools
import hashlib
import os
from pathlib import Path

from numba.core import config
from numba.core.caching import (
    CacheImpl,
    InTreeCacheLocator,
    UserProvidedCacheLocator,
    UserWideCacheLocator,
    _CacheLocator,
)

ROOT = Path(__file__).resolve().parent
# the kernels' cache directory: ``NUMBA_CACHE_DIR`` when ``install`` runs (the kernels' import),
# else numba's own setting; None: numba's default places
_where: str | None = None


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


class KernelsLocator(_CacheLocator):
    """numba's own locator for a kernel (``_where``, else ``__pycache__`` beside its file, else
    the user's cache) with ``source_stamp`` for its stamp; None off the kernels."""

    def __init__(self, inner, py_file):
        self._inner = inner
        self._py_file = py_file

    def ensure_cache_path(self):
        self._inner.ensure_cache_path()

    def get_cache_path(self):
        return self._inner.get_cache_path()

    def get_disambiguator(self):
        return self._inner.get_disambiguator()

    def get_source_stamp(self):
        return source_stamp(self._py_file)

    @classmethod
    def from_function(cls, py_func, py_file):
        if not Path(py_file).resolve().is_relative_to(ROOT):
            return None
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
    global _where
    _where = os.environ.get("NUMBA_CACHE_DIR") or config.CACHE_DIR or None
    if KernelsLocator not in CacheImpl._locator_classes:
        CacheImpl._locator_classes.insert(0, KernelsLocator)
