"""The one exception for bad input: ``InputError``, a ``ValueError`` naming the file, column and
0-based data row; the command line prints it as one line and exits with status 2.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input or usage: the message names the file, the column and the row."""
