"""Broken on purpose: let it crash.

The reference ends an undecodable image ``failed`` and goes on with the next
delivery. This variant records the failure correctly, then exits with status
1 ("a bad input means a bad state: restart clean"): the platform restarts it,
and every bad upload costs a worker restart — a crash loop under a stream of
bad files, and every other delivery it held goes back to the queue.

Everything else is the reference.
"""

import os
import sys

from reference import worker as worker_mod
from reference.cli import main

_finish_failed = worker_mod.Worker._finish_failed


async def _finish_failed_then_exit(self, message, claim, error_code, reason, lease=None):
    done = await _finish_failed(self, message, claim, error_code, reason, lease)
    if done and error_code != "expired":
        os._exit(1)  # THE BUG: a permanent failure of one input takes the whole process down
    return done


worker_mod.Worker._finish_failed = _finish_failed_then_exit

if __name__ == "__main__":
    sys.exit(main())
