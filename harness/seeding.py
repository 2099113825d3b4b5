"""Every random choice of the harness comes from a stream derived from the run's seed.

Separate named streams (workload, faults, ...) keep one part's choices from
shifting another's when its consumption changes.
"""

from __future__ import annotations

import hashlib
import random
import uuid


def stream(seed: int, name: str) -> random.Random:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def seeded_uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))
