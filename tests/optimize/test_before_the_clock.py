"""What a process pays once is paid before the budget's clock starts (issue 45): torch's optimizers
import ``torch._dynamo`` when the first one is built (1.5 s here, 7 s at load 9, inside the defaults'
own training), and Optuna's storage on a new database loads alembic and stamps its schema (2 s at
load 9, inside the search stage). At a 16 s budget that was half the time of a small task's loop."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TASKS = Path(__file__).parent / "tasks.py"

_SPY = r"""
import json, sys
import proftune
import proftune.optimize._api as api
from proftune.search import _storage

class Stop(Exception):
    pass

seen = {"before_import": "torch._dynamo" in sys.modules}

class Spy(api.Budget):
    def __init__(self, *args, **kwargs):
        seen["dynamo"] = "torch._dynamo" in sys.modules
        seen["storages"] = [key[0] for key in _storage._OPEN]
        raise Stop

api.Budget = Spy
try:
    proftune.optimize(sys.argv[1], budget=30, out=sys.argv[2], db=sys.argv[3], goal="none")
except Stop:
    pass
print(json.dumps(seen))
"""


def test_the_clock_starts_after_the_process_wide_setup(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'runs.db'}"
    proc = subprocess.run([sys.executable, "-c", _SPY, f"{TASKS}:TinyTask", str(tmp_path / "o"), db],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["before_import"] is False  # a fresh process: nothing imported it yet
    assert seen["dynamo"] is True
    assert seen["storages"] == [db]
