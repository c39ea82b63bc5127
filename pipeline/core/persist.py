"""Records on disk without pickle: a JSON type tree plus a ``.npz`` of its arrays.

A record ``name`` in a directory is two files:

``name.npz``
    Every numpy array and numpy scalar of the object (``np.savez``; members ``a0``, ``a1``, ...),
    read back with ``np.load(..., allow_pickle=False)``: numbers only, never Python objects.
``name.json``
    The format and its version, the SHA-256 of ``name.npz``, and the object as a type tree:
    JSON null / true / false / integers / finite floats / strings stand for themselves, every
    other value is a JSON object with a ``"type"``:

    ============  ==============================================================================
    ``float``     a non-finite float, ``"value"``: ``"nan"``, ``"inf"`` or ``"-inf"``
    ``list``      ``"items"``: the nodes of a list
    ``tuple``     ``"items"``: the nodes of a tuple
    ``dict``      ``"items"``: {str key: node} (only str keys are stored)
    ``path``      ``"value"``: a ``pathlib.Path`` as a string
    ``ndarray``   ``"key"``, ``"dtype"`` (``dtype.str``), ``"shape"``: a member of the npz
    ``numpy``     ``"key"``, ``"dtype"``: a numpy scalar, stored as a 0-d member of the npz
    ``object``    ``"class"`` (module and qualified name of a registered class) and either
                  ``"fields"`` {name: node} (a dataclass) or ``"state"`` (a node:
                  ``to_state()``)
    ============  ==============================================================================

Loading rebuilds only what the type tree names: the scalar types above and the classes on the
allowlist (``register``), through their constructors, so a crafted file can make a loaded
object wrong but can never run code. The JSON is written last (each file atomically), so its
presence means the record is complete, and the npz's SHA-256 in it tells a record from an
arrays file that a later, interrupted write replaced.

A dataclass is stored by its ``init`` fields and rebuilt by calling the class with them
(``__post_init__`` validates them again and derives the ``init=False`` fields, which are not
stored). A registered class that is not a dataclass provides ``to_state(self) -> dict`` (of
storable values) and the classmethod ``from_state(cls, state) -> instance``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import math
import re
import threading
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar, overload

import numpy as np

from pipeline.core import storage

FORMAT_VERSION: int = 1
FORMAT = "dpmm-pipeline record"

# np.load parses each array's header with ast.literal_eval, and CPython 3.11's AST constructor
# keeps one recursion counter per interpreter: two threads parsing at once (a Dask worker's tasks
# reading a store's info together) can fail with "SystemError: AST constructor recursion depth
# mismatch" (python/cpython#106905). Reads of a record's arrays take turns.
_NPY_HEADER_LOCK = threading.Lock()

# numbers, booleans, datetimes and durations: np.load(allow_pickle=False) reads these dtypes
# without constructing any Python object
_ARRAY_KINDS = "biufcmM"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")
_STORABLE = (
    "None, bool, int, float, str, pathlib.Path, list, tuple, dict with str keys, numpy arrays "
    "and scalars of numbers / bools / datetimes, and registered classes "
    "(pipeline.core.persist.register)"
)

_REGISTRY: dict[str, type] = {}

#: the modules that held registered classes before ``pipeline/`` was laid out by role, and where
#: those classes live now: records written then (checkpoints, models) load unchanged
MOVED_MODULES = {
    "pipeline.config": "pipeline.core.config",
    "pipeline.stats": "pipeline.families.stats",
    "pipeline.schema": "pipeline.families.schema",
    "pipeline.families.product": "pipeline.families.base",
    "pipeline.ihmm_core": "pipeline.models.ihmm",
    "pipeline.mixed_effects": "pipeline.models.mixed_effects",
    "pipeline.asugs": "pipeline.models.asugs",
    "pipeline.dist.writeout": "pipeline.data.labels",
}

C = TypeVar("C", bound=type)
T = TypeVar("T")


class PersistError(ValueError):
    """A record that cannot be written or read back; the message names the file and the
    problem."""


def type_name(cls: type) -> str:
    """The name a class is registered and stored under: ``module.QualifiedName``."""
    return f"{cls.__module__}.{cls.__qualname__}"


def current_name(name: str) -> str:
    """The registered name of a class stored as ``name``, which may be its name before the move
    of its module (``MOVED_MODULES``)."""
    module, _, qualname = name.rpartition(".")
    return f"{MOVED_MODULES[module]}.{qualname}" if module in MOVED_MODULES else name


def _has_state(cls: type) -> bool:
    return callable(getattr(cls, "to_state", None)) and callable(getattr(cls, "from_state", None))


def register(cls: C) -> C:
    """Put a class on the allowlist of what ``load`` may construct (usable as a decorator).

    Parameters
    ----------
    cls : type
        A dataclass (stored field by field), or a class with ``to_state(self) -> dict`` and
        the classmethod ``from_state(cls, state)``.

    Returns
    -------
    cls, unchanged.
    """
    if not isinstance(cls, type):
        raise TypeError(f"register expects a class, got {cls!r}")
    if not (dataclasses.is_dataclass(cls) or _has_state(cls)):
        raise TypeError(
            f"register({cls.__qualname__}): a registered class must be a dataclass or define "
            "to_state(self) -> dict and the classmethod from_state(cls, state)"
        )
    _REGISTRY[type_name(cls)] = cls
    return cls


def _paths(directory: storage.Where, name: str) -> tuple[storage.Loc, storage.Loc]:
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"record name {name!r}: use letters, digits, '_' and '-' only, without an extension "
            "(the record is written as NAME.json and NAME.npz)"
        )
    d = storage.location(directory)
    return d / f"{name}.json", d / f"{name}.npz"


# -- writing ---------------------------------------------------------------------------------


def write_atomic(path: storage.Where, data: bytes) -> None:
    """Replace ``path`` by ``data`` atomically: a reader sees the old file or the new one whole
    (``pipeline.core.storage.write_atomic``: a local file is renamed over, an object is one PUT)."""
    storage.write_atomic(path, data)


class _Writer:
    """Turns an object into a type tree, collecting its arrays."""

    def __init__(self, file: storage.Loc):
        self.file = file
        # Any: numpy's stubs type savez's keyword arguments as its own options
        self.arrays: dict[str, Any] = {}
        self.active: set[int] = set()

    def fail(self, where: str, problem: str) -> PersistError:
        return PersistError(f"{self.file}: cannot store {where}: {problem}")

    def array(self, arr: np.ndarray, where: str) -> dict[str, Any]:
        dt = arr.dtype
        if dt.kind not in _ARRAY_KINDS or dt.fields is not None or dt.subdtype is not None:
            what = "Python objects" if dt.kind == "O" else f"dtype {dt}"
            raise self.fail(
                where,
                f"a numpy array of {what} is not stored (only arrays of numbers, bools and "
                "datetimes, which load without unpickling)",
            )
        key = f"a{len(self.arrays)}"
        self.arrays[key] = arr
        return {"type": "ndarray", "key": key, "dtype": dt.str, "shape": list(arr.shape)}

    def node(self, obj: Any, where: str) -> Any:
        t = type(obj)
        # exact types: a subclass (a str enum, np.float64 as a float, bool as an int) would come
        # back as its base class
        if obj is None or t is bool or t is str:
            return obj
        if t is int:
            return obj
        if t is float:
            if math.isfinite(obj):
                return obj
            return {"type": "float", "value": "nan" if math.isnan(obj) else str(obj)}
        if t is np.ndarray:
            return self.array(obj, where)
        if isinstance(obj, np.generic):
            node = self.array(np.asarray(obj), where)
            return {"type": "numpy", "key": node["key"], "dtype": node["dtype"]}
        if isinstance(obj, Path):
            return {"type": "path", "value": str(obj)}
        if t in (list, tuple, dict) or t.__name__ in ("Mapping",):
            return self.container(obj, where)
        name = type_name(t)
        if _REGISTRY.get(name) is t:
            return self.instance(obj, name, where)
        if dataclasses.is_dataclass(obj) or _has_state(t):
            raise self.fail(
                where,
                f"class {name} is not registered; decorate it with @pipeline.core.persist.register",
            )
        raise self.fail(where, f"a {name} is not a storable type (storable: {_STORABLE})")

    def container(self, obj: Any, where: str) -> dict[str, Any]:
        if id(obj) in self.active:
            raise self.fail(where, "it contains itself")
        self.active.add(id(obj))
        try:
            if isinstance(obj, dict):
                items: dict[str, Any] = {}
                for k, v in obj.items():
                    if type(k) is not str:
                        raise self.fail(
                            where, f"dict key {k!r} is a {type(k).__name__}; only str keys are"
                        )
                    items[k] = self.node(v, f"{where}[{k!r}]")
                return {"type": "dict", "items": items}
            kind = "tuple" if isinstance(obj, tuple) else "list"
            return {
                "type": kind,
                "items": [self.node(v, f"{where}[{i}]") for i, v in enumerate(obj)],
            }
        finally:
            self.active.discard(id(obj))

    def instance(self, obj: Any, name: str, where: str) -> dict[str, Any]:
        if id(obj) in self.active:
            raise self.fail(where, "it contains itself")
        self.active.add(id(obj))
        try:
            if _has_state(type(obj)):
                state = obj.to_state()
                if type(state) is not dict:
                    raise self.fail(
                        where, f"{name}.to_state() returned a {type(state).__name__}, not a dict"
                    )
                return {"type": "object", "class": name, "state": self.node(state, where)}
            fields = {
                f.name: self.node(getattr(obj, f.name), f"{where}.{f.name}")
                for f in dataclasses.fields(obj)
                if f.init
            }
            return {"type": "object", "class": name, "fields": fields}
        finally:
            self.active.discard(id(obj))


def save(directory: storage.Where, name: str, obj: Any) -> None:
    """Write ``obj`` as the record ``name`` in ``directory`` (module docstring).

    ``directory/name.npz`` is written first, then ``directory/name.json``, each atomically
    (``write_atomic``); an object that cannot be stored raises ``PersistError`` before either
    file is touched, so the previous record stays whole.

    Parameters
    ----------
    directory : path
        An existing directory.
    name : str
        The record's name: letters, digits, '_' and '-', no extension.
    obj : storable value
        See ``_STORABLE``: nested lists, tuples, dicts with str keys, scalars, paths, numeric
        numpy arrays and scalars, and instances of registered classes.
    """
    json_path, npz_path = _paths(directory, name)
    if not storage.can_hold_files(storage.location(directory)):
        raise PersistError(f"{json_path}: cannot write: {directory} is not a directory")
    w = _Writer(json_path)
    try:
        root = w.node(obj, name)
    except RecursionError as err:
        raise PersistError(f"{json_path}: cannot store {name}: it is nested too deeply") from err
    buf = io.BytesIO()
    np.savez(buf, **w.arrays)
    data = buf.getvalue()
    doc = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "arrays": {
            "file": npz_path.name,
            "sha256": hashlib.sha256(data).hexdigest(),
            "count": len(w.arrays),
        },
        "root": root,
    }
    try:
        # compact: json's C encoder writes it; with indent, json falls back to its Python
        # encoder, 5x slower (a checkpoint after 61 passes 1.0 -> 0.2 ms, after a 100M run's
        # last pass, its 1,024 chunks' summaries, 24 -> 3.6 ms); ``python -m json.tool`` shows
        # it indented
        text = json.dumps(doc, allow_nan=False, separators=(",", ":"))
    except ValueError as err:  # an int beyond the digits int -> str may convert
        raise PersistError(f"{json_path}: cannot store {name}: {err}") from err
    except RecursionError as err:
        raise PersistError(f"{json_path}: cannot store {name}: it is nested too deeply") from err
    write_atomic(npz_path, data)
    write_atomic(json_path, text.encode())


def exists(directory: storage.Where, name: str) -> bool:
    """Whether the record ``name`` was completely written (its JSON is there)."""
    return _paths(directory, name)[0].is_file()


def remove(directory: storage.Where, name: str) -> None:
    """Delete the record ``name`` if present: the JSON first, so a half-removed record reads as
    absent."""
    json_path, npz_path = _paths(directory, name)
    json_path.unlink(missing_ok=True)
    npz_path.unlink(missing_ok=True)


# -- reading ---------------------------------------------------------------------------------


def _refuse_constant(token: str) -> float:
    raise ValueError(f"{token} is not JSON (non-finite floats are stored as typed nodes)")


class _Reader:
    """Rebuilds an object from its type tree and the npz's members."""

    def __init__(self, json_path: storage.Loc, npz_path: storage.Loc, npz: Mapping[str, Any]):
        self.json_path = json_path
        self.npz_path = npz_path
        self.npz = npz

    def fail(self, where: str, problem: str) -> PersistError:
        return PersistError(f"{self.json_path}: {where}: {problem}")

    def array(self, node: Mapping[str, Any], where: str, shape: Any) -> np.ndarray:
        key, dtype = node.get("key"), node.get("dtype")
        if not isinstance(key, str) or not isinstance(dtype, str):
            raise self.fail(where, f"a {node.get('type')} node needs a str 'key' and 'dtype'")
        if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
            raise self.fail(where, f"shape {shape!r} is not a list of sizes")
        try:
            with _NPY_HEADER_LOCK:
                arr = self.npz[key]
        except KeyError:
            raise PersistError(
                f"{self.npz_path}: no array {key!r}, which {self.json_path} refers to at {where}"
            ) from None
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as err:
            # object arrays: np.load refuses to unpickle them (allow_pickle=False)
            raise PersistError(
                f"{self.npz_path}: array {key!r} cannot be read without unpickling or is "
                f"damaged ({' '.join(str(err).split())}); refused"
            ) from err
        if arr.dtype.str != dtype or list(arr.shape) != shape:
            raise PersistError(
                f"{self.npz_path}: array {key!r} has dtype {arr.dtype.str} and shape "
                f"{tuple(arr.shape)}, but {self.json_path} records dtype {dtype} and shape "
                f"{tuple(shape)} for {where}"
            )
        return np.asarray(arr)

    def node(self, node: Any, where: str) -> Any:
        if node is None or type(node) in (bool, int, float, str):
            return node
        if type(node) is not dict:
            raise self.fail(where, f"unexpected JSON {type(node).__name__} in the type tree")
        kind = node.get("type")
        if kind == "float":
            value = node.get("value")
            if value not in ("nan", "inf", "-inf"):
                raise self.fail(where, f"float value {value!r} is not 'nan', 'inf' or '-inf'")
            return float(value)
        if kind in ("list", "tuple"):
            items = node.get("items")
            if type(items) is not list:
                raise self.fail(where, f"a {kind} node needs a list of 'items'")
            out = [self.node(v, f"{where}[{i}]") for i, v in enumerate(items)]
            return tuple(out) if kind == "tuple" else out
        if kind == "dict":
            items = node.get("items")
            if type(items) is not dict:
                raise self.fail(where, "a dict node needs an object of 'items'")
            return {k: self.node(v, f"{where}[{k!r}]") for k, v in items.items()}
        if kind == "path":
            value = node.get("value")
            if type(value) is not str:
                raise self.fail(where, "a path node needs a str 'value'")
            return Path(value)
        if kind == "ndarray":
            return self.array(node, where, node.get("shape"))
        if kind == "numpy":
            return self.array(node, where, [])[()]
        if kind == "object":
            return self.instance(node, where)
        raise self.fail(where, f"unknown node type {kind!r}")

    def instance(self, node: Mapping[str, Any], where: str) -> Any:
        name = node.get("class")
        cls = _REGISTRY.get(current_name(name)) if isinstance(name, str) else None
        if cls is None or not isinstance(name, str):
            raise self.fail(
                where,
                f"type {name!r} is not on the allowlist of classes this dpmm-pipeline loads "
                "(pipeline.core.persist.register); refused",
            )
        try:
            if _has_state(cls):
                if "state" not in node:
                    raise self.fail(where, f"{name} is stored by its state, not by fields")
                state = self.node(node["state"], where)
                return cls.from_state(state)  # type: ignore[attr-defined]
            return cls(**self.fields(cls, name, node.get("fields"), where))
        except PersistError:
            raise
        except Exception as err:
            # the constructor's own validation: a crafted or damaged file, reported as such
            raise self.fail(
                where, f"the stored {name} is invalid: {' '.join(str(err).split())}"
            ) from err

    def fields(self, cls: type, name: str, fields: Any, where: str) -> dict[str, Any]:
        """The constructor arguments of a dataclass from its stored fields."""
        if type(fields) is not dict or not dataclasses.is_dataclass(cls):
            raise self.fail(where, f"{name} is stored by fields: the node needs 'fields'")
        spec = {f.name: f for f in dataclasses.fields(cls) if f.init}
        unknown = sorted(set(fields) - set(spec))
        missing = [
            n
            for n, f in spec.items()
            if n not in fields
            and f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
        ]
        if unknown or missing:
            parts = [f"unknown fields {unknown}"] if unknown else []
            parts += [f"missing fields {missing}"] if missing else []
            raise self.fail(where, f"{name}: " + "; ".join(parts))
        return {k: self.node(v, f"{where}.{k}") for k, v in fields.items()}


@overload
def load(directory: storage.Where, name: str, expect: None = None) -> Any: ...


@overload
def load(directory: storage.Where, name: str, expect: type[T]) -> T: ...


def load(directory: storage.Where, name: str, expect: type[Any] | None = None) -> Any:
    """Read the record ``name`` of ``directory`` back, never unpickling anything.

    Parameters
    ----------
    directory : path
    name : str
        As given to ``save``.
    expect : type, optional
        The loaded object must be an instance of it.

    Returns
    -------
    The object ``save`` was given (registered classes rebuilt through their constructors).

    Raises
    ------
    PersistError
        Naming the file: a missing file, JSON that does not parse, another format version, an
        npz that is not the one the JSON was written with, a type not on the allowlist, a
        missing array, an array whose dtype or shape disagrees with the JSON, an array of
        Python objects, a stored object its class refuses, a result not an ``expect``.
    """
    json_path, npz_path = _paths(directory, name)
    try:
        raw = json_path.read_bytes()
    except FileNotFoundError:
        raise PersistError(f"{json_path}: no such file (no record {name!r} here)") from None
    except OSError as err:
        raise PersistError(f"{json_path}: cannot be read ({err.strerror})") from err
    try:
        doc = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as err:
        msg = " ".join(str(err).split()) or type(err).__name__
        raise PersistError(
            f"{json_path}: not valid JSON ({msg}); the file is damaged or was not written by "
            "dpmm-pipeline"
        ) from err
    if type(doc) is not dict or doc.get("format") != FORMAT:
        raise PersistError(f"{json_path}: not a dpmm-pipeline record (no {FORMAT!r} header)")
    version = doc.get("format_version")
    if version != FORMAT_VERSION:
        raise PersistError(
            f"{json_path}: written by format version {version}; this dpmm-pipeline reads "
            f"version {FORMAT_VERSION}"
        )
    arrays = doc.get("arrays")
    if type(arrays) is not dict or not isinstance(arrays.get("sha256"), str):
        raise PersistError(f"{json_path}: the header has no 'arrays' with a 'sha256'")
    try:
        data = npz_path.read_bytes()
    except FileNotFoundError:
        raise PersistError(
            f"{npz_path}: no such file; the record {json_path} keeps its arrays there"
        ) from None
    except OSError as err:
        raise PersistError(f"{npz_path}: cannot be read ({err.strerror})") from err
    if hashlib.sha256(data).hexdigest() != arrays["sha256"]:
        raise PersistError(
            f"{npz_path}: not the arrays {json_path} was written with (SHA-256 differs): the "
            "file was changed, or a later write of this record was interrupted"
        )
    try:
        npz = np.load(io.BytesIO(data), allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as err:
        raise PersistError(
            f"{npz_path}: not a numpy .npz file of plain arrays "
            f"({' '.join(str(err).split())}); refused"
        ) from err
    if not isinstance(npz, np.lib.npyio.NpzFile):
        raise PersistError(f"{npz_path}: a single .npy array, not a .npz archive; refused")
    with npz:
        try:
            obj = _Reader(json_path, npz_path, npz).node(doc.get("root"), name)
        except RecursionError as err:
            raise PersistError(f"{json_path}: the type tree is nested too deeply") from err
    if expect is not None and not isinstance(obj, expect):
        got = type_name(type(obj)) if type(obj) in _REGISTRY.values() else type(obj).__name__
        raise PersistError(f"{json_path}: holds a {got}, not a {type_name(expect)}")
    return obj


def writable(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` (an unpickled object's ``__dict__``) with every read-only NumPy array in it, or
    in the lists, tuples, dicts and project objects it holds, replaced by a writable copy.

    ``joblib.load(path, mmap_mode="r")`` hands back read-only memory maps, and numba compiles a
    separate specialization of a kernel for read-only arguments: a model loaded that way would
    compile each of its predict kernels again at first use (7 to 12 s each). A fitted model's
    arrays are cluster summaries and a fit's labels, small enough to copy.
    """
    seen: set[int] = set()

    def fix(value: Any) -> Any:
        if isinstance(value, np.ndarray):
            return value if value.flags.writeable else np.array(value)
        if id(value) in seen:
            return value
        seen.add(id(value))
        if isinstance(value, list):
            value[:] = [fix(v) for v in value]
        elif isinstance(value, tuple) and type(value) is tuple:
            return tuple(fix(v) for v in value)
        elif isinstance(value, dict):
            for k, v in value.items():
                value[k] = fix(v)
        elif type(value).__module__.startswith("pipeline.") and hasattr(value, "__dict__"):
            # a frozen dataclass refuses setattr, not its instance dictionary
            fix(vars(value))
        return value

    out: dict[str, Any] = fix(dict(state))
    return out
