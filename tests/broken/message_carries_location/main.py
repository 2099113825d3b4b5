"""Broken on purpose: the message says where the file is.

The contract keeps storage out of messages: a job message carries identifiers
only, and the worker looks the original up in the database (no URLs, no
storage keys, no client paths). This variant adds a convenience header with
the original's location — ``x-original-url: s3://<bucket>/staging/<id>`` — so
a message copied out of the broker points straight at the stored file.

Everything else is the reference (the worker ignores the header).
"""

import os
import sys

from reference import messages
from reference.cli import main
from reference.keys import staging_key

_original_properties = messages.JobMessage.amqp_properties


def _properties_with_location(self):
    properties = _original_properties(self)
    bucket = os.environ.get("S3_BUCKET", "attachments")
    properties["headers"]["x-original-url"] = f"s3://{bucket}/{staging_key(self.attachment_id)}"  # THE BUG
    return properties


messages.JobMessage.amqp_properties = _properties_with_location

if __name__ == "__main__":
    sys.exit(main())
