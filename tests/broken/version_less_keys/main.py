"""Broken on purpose: variant object keys without the pipeline version.

The reference keys every variant object by its effect key (attachment_id, pipeline_version, variant) plus the claim's
fencing token: ``variants/<attachment>/v<version>/t<token>/<variant>.<ext>``. This variant drops the version from the
prefix (``variants/<attachment>/t<token>/...``), a plausible slip when a second pipeline version is added to code
written for one. The database still keeps one result row per version, and each version's recorded sha256 matches its
own render — but version 2's first claim (token 1) PUTs over the objects version 1's first claim published: a
published, ready version's effect is overwritten by another version's attempt (and a late version-1 attempt with the
token of version 2's would overwrite version 2).

Everything else is the reference.
"""

import sys
import uuid

from reference import keys as keys_mod
from reference import worker_jobs as jobs_mod
from reference.cli import main


def _variant_prefix_without_version(attachment_id, pipeline_version) -> str:
    # THE BUG: the pipeline version is not part of the key.
    return f"{keys_mod.VARIANTS_PREFIX}{uuid.UUID(str(attachment_id))}/"


keys_mod.variant_prefix = _variant_prefix_without_version  # variant_key builds on it
jobs_mod.variant_prefix = _variant_prefix_without_version  # the worker's cleanup lists by it

if __name__ == "__main__":
    sys.exit(main())
