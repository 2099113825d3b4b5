"""Broken on purpose: every error of the object store is taken for an outage and waited out, forever.

The reference waits a store that is down (5xx, unreachable) out within the job's deadline, but a refusal (403 and
other 4xx) is an error of the job: the retry is recorded with backoff and the attempt budget bounds it (``failed``,
``attempts_exhausted``, once spent). This variant's worker treats every S3 error — a 403 AccessDenied as much as a
connection that hangs — as the store being down, with no bound at all: it keeps the delivery and
its lease and tries the write again every half second until it goes through. Through a real outage that is
harmless (the write succeeds once the store is back; the existing catalogue grades it valid); against a store that
refuses for good, the job is never terminal. Only the worker's object write is replaced; everything else is the
reference.
"""

import sys
import time

from reference import storage as storage_mod
from reference.cli import main

RETRY_SECONDS = 0.5

_put_bytes = storage_mod.ObjectStore.put_bytes


def _put_until_it_works(self, key, data, content_type, sha256=None):
    while True:
        try:
            return _put_bytes(self, key, data, content_type, sha256)
        except Exception:  # noqa: BLE001 - StorageUnavailable, and a 403 the store's client raises as is
            time.sleep(RETRY_SECONDS)  # THE BUG: a permanent refusal is waited out like an outage, with no bound


storage_mod.ObjectStore.put_bytes = _put_until_it_works

if __name__ == "__main__":
    sys.exit(main())
