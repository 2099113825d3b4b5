"""What every published ``ready`` result named, as the object store held it when ``ready`` was first seen.

The API observer calls a :class:`ReadySnapshot` the first time it sees an attachment ``ready``, before it records the
state (so before the runner can pick that job for a republish, a replay or a crash of its consumer): for each object
key the result names (the API's own ``variants[].key``, no layout assumed) one ``snapshot`` line with the object's
ETag, version id, size and Last-Modified as a HEAD returns them. ``duplicate_effects`` compares these with the final
read: a key named by a ready result whose object changed afterwards was rewritten after ready, however soon.
"""

from __future__ import annotations

from .final_state import missing_or_error, s3_client, utc_text


class ReadySnapshot:
    def __init__(self, s3_env: dict, history):
        self.s3 = s3_client(s3_env)
        self.bucket = s3_env["S3_BUCKET"]
        self.history = history
        self.done: set[str] = set()

    def __call__(self, attachment_id: str, body: dict) -> None:
        if attachment_id in self.done:
            return
        self.done.add(attachment_id)
        for variant in body.get("variants") or []:
            key = variant.get("key")
            if not key:
                continue
            self.history.append("snapshot", attachment_id=attachment_id, state=body.get("state"), key=key,
                                variant=variant.get("name"), pipeline_version=body.get("pipeline_version"),
                                **self.head(key))

    def version_ready(self, attachment_id: str, version, variants: list) -> None:
        """Level 5: the objects of one pipeline version's result when that version is first seen ready (the API's
        ``versions[]``), as ``version_snapshot`` lines; ``version_isolation`` compares them with the final read."""
        if (attachment_id, version) in self.done:
            return
        self.done.add((attachment_id, version))
        for variant in variants or []:
            key = variant.get("key")
            if key:
                self.history.append("version_snapshot", attachment_id=attachment_id, pipeline_version=version,
                                    key=key, variant=variant.get("name"), **self.head(key))

    def head(self, key: str) -> dict:
        try:
            response = self.s3.head_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            return missing_or_error(exc)
        return {"exists": True, "etag": response.get("ETag"), "version_id": response.get("VersionId"),
                "size": response.get("ContentLength"), "last_modified": utc_text(response["LastModified"])}
