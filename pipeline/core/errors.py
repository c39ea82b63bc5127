"""The one exception for bad input.

``InputError`` is a ``ValueError`` (so that library callers catching ``ValueError``, and the
scikit-learn conventions, keep working) whose message names what is wrong and where: the file,
the column, the 0-based data row. The ``dpmm`` command line prints it as one line and exits
with status 2; anything else that goes wrong is a bug and keeps its traceback.
"""

from __future__ import annotations


class InputError(ValueError):
    """Bad input or usage: the message names the file, the column and the row."""
