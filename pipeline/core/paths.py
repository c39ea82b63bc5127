"""Where a command may write: names generated under an output stay inside it, and an output
never overlaps the inputs it is made from.

Checked before anything is written: ``child(root, name)`` refuses a generated name that is not one
plain path component (a separator, ``..``, ``.``, NUL, an absolute path), and
``check_separate(outputs, inputs)`` an output that is, is inside or contains an input. Local paths
are compared resolved; URLs by scheme, bucket and normalised key, refusing ``..`` in a key.
"""

from __future__ import annotations

import ctypes
import errno
import os
import posixpath
import re
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

from pipeline.core.errors import InputError

_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")


def safe_name(name: str, what: str = "name") -> str:
    """``name`` when it is one plain path component, else a ``ValueError`` naming ``what``."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"{what} {name!r}: an empty or non-text file name")
    bad = (
        "\x00" in name
        or "/" in name
        or "\\" in name
        or name in (".", "..")
        or os.path.isabs(name)
        or Path(name).drive != ""
    )
    if bad:
        raise ValueError(
            f"{what} {name!r}: not a plain file name (a path separator, '..' or an absolute "
            "path would write outside the output directory)"
        )
    return name


def child(root: str | os.PathLike[str], name: str, what: str = "name") -> Path:
    """``root / name`` for a generated ``name`` that is one plain component (``safe_name``)."""
    return Path(root) / safe_name(name, what)


def _within(a: str, b: str, sep: str) -> bool:
    """``a`` is ``b`` or inside it."""
    return a == b or a.startswith(b.rstrip(sep) + sep)


def _key(text: str) -> tuple[str, str, str]:
    """(scheme, normalised 'bucket/key', "/") of a URL; ("", real path, os.sep) of a local path
    or ``file://`` URL."""
    m = _URL.match(text)
    if m is not None and m.group(1).lower() not in ("file", "local"):
        parts = [p for p in m.group(2).split("/") if p]
        if ".." in parts:
            raise InputError(
                f"{text}: a '..' in a URL names a different key, not a parent; remove it"
            )
        return m.group(1).lower(), posixpath.normpath("/".join(parts)) if parts else "", "/"
    if m is not None:  # file:///abs/path
        text = m.group(2)
    return "", os.path.realpath(os.path.expanduser(text)), os.sep


def check_separate(
    outputs: Iterable[tuple[str, str | os.PathLike[str] | None]],
    inputs: Iterable[tuple[str, str | os.PathLike[str] | None]],
) -> None:
    """Refuse an output that is an input, is inside one or contains one (``InputError`` naming
    both options); ``outputs`` and ``inputs`` are (option, path or URL) pairs, None skipped."""
    ins = [(opt, str(p), _key(str(p))) for opt, p in inputs if p is not None and str(p)]
    for o_opt, o in outputs:
        if o is None or not str(o):
            continue
        o_scheme, o_path, sep = _key(str(o))
        for i_opt, i, (i_scheme, i_path, _) in ins:
            if i_scheme != o_scheme:
                continue
            if o_path == i_path:
                problem = "is the same as"
            elif _within(o_path, i_path, sep):
                problem = "is inside"
            elif _within(i_path, o_path, sep):
                problem = "contains"
            else:
                continue
            raise InputError(
                f"{o_opt} {o}: {problem} {i_opt} {i}; an output must be separate from its "
                "inputs (replacing it would delete them, writing into them would change them)"
            )


def temp_sibling(path: str | os.PathLike[str]) -> Path:
    """The hidden sibling ``.<name>.partial`` an output ``path`` is written under until complete."""
    p = Path(path)
    return p.parent / f".{p.name}.partial"


def commit_dir(tmp: Path, out: Path, replace: bool = True) -> bool:
    """Rename the complete output ``tmp`` to ``out`` atomically, as a staged output's last step:
    a reader sees the old ``out`` or the new one, never neither. An existing ``out`` is replaced
    only if ``replace`` (else ``tmp`` is left and False returned): Linux swaps the two
    (``renameat2``'s ``RENAME_EXCHANGE``), elsewhere the old one is first moved aside."""
    try:
        os.rename(tmp, out)  # onto nothing (or an empty directory): atomic
        return True
    except OSError as err:
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
    if not replace:
        return False
    exchange = getattr(ctypes.CDLL(None), "renameat2", None)  # AT_FDCWD -100, RENAME_EXCHANGE 2
    if exchange and not exchange(-100, os.fsencode(tmp), -100, os.fsencode(out), 2):
        shutil.rmtree(tmp, ignore_errors=True)  # the old output, swapped out
        return True
    old = out.parent / f".{out.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    os.replace(out, old)
    try:
        os.replace(tmp, out)
    except BaseException:
        os.replace(old, out)
        raise
    shutil.rmtree(old, ignore_errors=True)
    return True
