"""``python -m proftune``: the same as the ``proftune`` console script (and ``python -m proftune.cli``)."""

from __future__ import annotations

from .cli import main

main()
