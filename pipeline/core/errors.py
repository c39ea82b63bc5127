"""The one exception for bad input: ``InputError``, a ``ValueError`` naming the file, column and
0-based data row; the command line prints it as one line and exits with status 2. A failure of
the storage rather than of the input (retries spent, a full disk, a damaged chunk) is a
``StorageError``: one line naming the object, exit status 3.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input or usage: the message names the file, the column and the row."""


class StorageError(InputError):
    """Storage failed, not the input: the message names the object or file and what to do."""
