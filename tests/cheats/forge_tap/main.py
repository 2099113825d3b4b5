"""A cheat (tests/cheats/README.md): the reference worker, plus a thread running the cheat forge_tap of tests/cheats/cheatlib.py.

Each cheat prints `CHEAT <name>: achieved|blocked ...` into logs/worker.log.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/cheats: cheatlib

import cheatlib  # noqa: E402

from reference.cli import main  # noqa: E402

if __name__ == "__main__":
    cheatlib.launch(["forge_tap"])
    sys.exit(main())
