"""S3 object store (SeaweedFS in tests) behind a small synchronous facade.

Callers in async code run these methods in a thread (``asyncio.to_thread``).
Every failure to reach the store becomes :class:`StorageUnavailable`, which
the roles treat as transient (503 in the API, retry in the worker).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import IO, TYPE_CHECKING, Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

if TYPE_CHECKING:
    from reference.settings import Settings


class StorageUnavailable(Exception):
    """The store could not be reached or answered with a server error."""


class ObjectMissing(Exception):
    """The object does not exist."""


@dataclass(frozen=True)
class ListedObject:
    key: str
    size: int
    last_modified: datetime


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class ObjectStore:
    def __init__(self, endpoint_url: str, bucket: str, access_key: str, secret_key: str, *,
                 region: str = "us-east-1", timeout_seconds: float = 10.0, max_pool_connections: int = 32):
        self.bucket = bucket
        self.client = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url,
            aws_access_key_id=access_key or None,
            aws_secret_access_key=secret_key or None,
            region_name=region,
            config=Config(
                signature_version="s3v4",
                s3={"addressing_style": "path"},
                connect_timeout=min(timeout_seconds, 3.0),
                read_timeout=timeout_seconds,
                retries={"max_attempts": 2, "mode": "standard"},
                max_pool_connections=max_pool_connections,
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )

    @classmethod
    def from_settings(cls, settings: Settings, max_pool_connections: int = 32) -> ObjectStore:
        return cls(settings.s3_endpoint_url, settings.s3_bucket, settings.s3_access_key, settings.s3_secret_key,
                   region=settings.s3_region, timeout_seconds=settings.s3_timeout_seconds,
                   max_pool_connections=max_pool_connections)

    def _call(self, method: Callable[..., Any], **kwargs: Any) -> Any:
        try:
            return method(Bucket=self.bucket, **kwargs)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if code in ("NoSuchKey", "404", "NotFound"):
                raise ObjectMissing(kwargs.get("Key", "")) from None
            if status >= 500 or status == 0 or code in ("SlowDown", "RequestTimeout"):
                raise StorageUnavailable(f"s3 {code or status}") from None
            raise
        except BotoCoreError as exc:
            raise StorageUnavailable(f"s3 unreachable: {type(exc).__name__}") from None

    def put_bytes(self, key: str, data: bytes, content_type: str, sha256: str | None = None) -> None:
        metadata = {"sha256": sha256 or sha256_hex(data)}
        self._call(self.client.put_object, Key=key, Body=data, ContentType=content_type,
                   ContentLength=len(data), Metadata=metadata)

    def put_file(self, key: str, fileobj: IO[bytes], size: int, content_type: str, sha256: str) -> None:
        fileobj.seek(0)
        self._call(self.client.put_object, Key=key, Body=fileobj, ContentType=content_type,
                   ContentLength=size, Metadata={"sha256": sha256})

    def get_bytes(self, key: str) -> bytes:
        response = self._call(self.client.get_object, Key=key)
        try:
            data: bytes = response["Body"].read()
            return data
        except BotoCoreError as exc:
            raise StorageUnavailable(f"s3 read failed: {type(exc).__name__}") from None

    def exists(self, key: str) -> bool:
        try:
            self._call(self.client.head_object, Key=key)
            return True
        except ObjectMissing:
            return False
        except ClientError as exc:
            if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 404:
                return False
            raise

    def delete(self, key: str) -> None:
        self._call(self.client.delete_object, Key=key)

    def list_prefix(self, prefix: str) -> Iterator[ListedObject]:
        """Every object under ``prefix``, page by page (1000 keys a call). For tools and tests: no role lists
        the bucket in its loop — the staging sweep works from the staged_uploads records (costs what is due)."""
        token = None
        while True:
            kwargs = {"Prefix": prefix, "MaxKeys": 1000}
            if token:
                kwargs["ContinuationToken"] = token
            page = self._call(self.client.list_objects_v2, **kwargs)
            for item in page.get("Contents", []) or []:
                yield ListedObject(item["Key"], int(item.get("Size", 0)), item["LastModified"])
            if not page.get("IsTruncated"):
                return
            token = page.get("NextContinuationToken")

    def ping(self) -> None:
        self._call(self.client.head_bucket)

    def ensure_bucket(self) -> None:
        try:
            self._call(self.client.head_bucket)
        except (ClientError, ObjectMissing):
            try:
                self._call(self.client.create_bucket)
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise
