"""Broken on purpose: the message names where the file is, without a slash or a scheme.

The contract keeps storage out of messages: identifiers and service data only, never an object key or a storage
location. This variant adds a convenience header naming the run's bucket — ``x-store-bucket: <bucket>`` — a flat
value that holds no ``/`` and no ``://``, so a search for paths and URLs alone lets it through; the harness knows
the bucket the roles were given and finds it by value.

Everything else is the reference (the worker ignores the header).
"""

import os
import sys

from reference import messages
from reference.cli import main

_original_properties = messages.JobMessage.amqp_properties


def _properties_with_bucket(self):
    properties = _original_properties(self)
    properties["headers"]["x-store-bucket"] = os.environ.get("S3_BUCKET", "attachments")  # THE BUG
    return properties


messages.JobMessage.amqp_properties = _properties_with_bucket

if __name__ == "__main__":
    sys.exit(main())
