"""The child process of one script trial that proftune measures: ``python -m proftune.script._child
SCRIPT ARGS``: the script runs unchanged under the same global hooks as ``proftune run``
(:func:`proftune.profile.run_script`); its profile's metrics go to the report channel at the end."""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    from ..profile import run_script
    from ._channel import REPORT_ENV

    result = run_script(["python", *argv], stats=False)
    path = os.environ.get(REPORT_ENV)
    if path and result.profiles:
        p = result.profiles[0]
        metrics = {k: v for k, v in p.metrics().items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"profile": metrics, "summary": result.summary}) + "\n")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
