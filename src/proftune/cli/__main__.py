"""``python -m proftune.cli``: the same as the ``proftune`` console script."""

from __future__ import annotations

from . import main

main()
