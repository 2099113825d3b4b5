"""Not broken: the API sleeps (``time.sleep``) before each PUT of an original.

A correct program: it paces its writes to the store with a 10 ms ``time.sleep`` in the thread that uploads the
original (as a client spacing its requests or backing off would). Python 3.11+ sleeps with
``clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME)``; a clock offset that breaks that call (libfaketime 0.9.10 with
``FAKETIME_DONT_FAKE_MONOTONIC=1`` turns it into ``OSError: [Errno 22]``) makes every upload fail. The harness must
skew a role's wall clock without breaking its sleeps: ``clock-skew-staging`` must grade this variant as it grades the
reference.

Everything else is the reference.
"""

import sys
import time

from reference.cli import main
from reference.storage import ObjectStore

_put_file = ObjectStore.put_file


def _paced_put_file(self, *args, **kwargs):
    time.sleep(0.01)  # THE SHAPE: a plain sleep in a role whose wall clock the harness moves
    return _put_file(self, *args, **kwargs)


ObjectStore.put_file = _paced_put_file

if __name__ == "__main__":
    sys.exit(main())
