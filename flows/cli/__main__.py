"""``python -m flows.cli``: the ``dpmm`` command line."""

from __future__ import annotations

import sys

from flows.cli import main

sys.exit(main())
