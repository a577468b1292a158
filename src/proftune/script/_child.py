"""The child process of one script trial that proftune measures: ``python -m proftune.script._child
SCRIPT ARGS``: the script runs unchanged under the same global hooks as ``proftune run``
(:func:`proftune.profile.run_script`); its profile's metrics go to the report channel at the end."""

from __future__ import annotations

import os
import sys

#: The steps of a trial's profile: every SAMPLE_EVERY-th, SAMPLES of them.
SAMPLE_EVERY, SAMPLES = 10, 3


def main(argv: list[str]) -> int:
    from .._jsonsafe import is_finite_number, json_dumps
    from ..profile import run_script
    from ._channel import REPORT_ENV
    from ._frameworks import install_framework_reports

    if argv and argv[0] != "-m":
        install_framework_reports(argv[0])
    # every 10th step, 3 samples: a trial's profile (step time, memory) at a bounded cost, even
    # for a short script (the default every 50th samples nothing in its first 50 steps)
    result = run_script(["python", *argv], every=SAMPLE_EVERY, steps=SAMPLES, stats=False)
    path = os.environ.get(REPORT_ENV)
    if path and result.profiles:
        p = result.profiles[0]
        metrics = {k: v for k, v in p.metrics().items() if is_finite_number(v)}
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json_dumps({"profile": metrics, "summary": result.summary}) + "\n")
    return result.exit_code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
