"""``ray start`` with every address on 127.0.0.1: ``python tests/search/ray_loopback.py start ...``.

Ray advertises the machine's outward-facing address by default; the test cluster (a head and a
worker node on this machine) must stay on loopback, so the address lookup is pinned here.
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray._private.services as services

    services.node_ip_address_from_perspective = lambda *a, **k: "127.0.0.1"
    from ray.scripts.scripts import cli

    return int(cli.main(args=sys.argv[1:], prog_name="ray", standalone_mode=False) or 0)


if __name__ == "__main__":
    sys.exit(main())
