"""A private SeaweedFS (`weed mini`) serving S3 with credentials on and the default bucket created."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import boto3
from botocore.config import Config

from .ports import LOOPBACK, PortAllocator, wait_until
from .process import ServiceProcess
from .tools import weed

ACCESS_KEY = "harness-access"
SECRET_KEY = "harness-secret-key"

# Every port weed mini opens, so none falls back to a fixed default that another stack may hold.
PORT_FLAGS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port",
              "filer.port.grpc", "s3.port.grpc", "admin.port", "admin.port.grpc")


def s3_client(endpoint_url: str, access_key: str = ACCESS_KEY, secret_key: str = SECRET_KEY, timeout: float = 10):
    """boto3 as SeaweedFS wants it: path-style addressing, checksums only when an operation requires them."""
    return boto3.client(
        "s3", endpoint_url=endpoint_url, aws_access_key_id=access_key, aws_secret_access_key=secret_key,
        region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"}, request_checksum_calculation="when_required",
                      response_checksum_validation="when_required", connect_timeout=timeout, read_timeout=timeout,
                      retries={"max_attempts": 1}),
    )


@dataclass
class SeaweedFS:
    root: Path
    s3_port: int
    bucket: str
    other_ports: dict[str, int] = field(default_factory=dict)
    process: ServiceProcess | None = None

    name = "s3"

    @classmethod
    def allocate(cls, root: Path, ports: PortAllocator, bucket: str) -> "SeaweedFS":
        return cls(root=root, s3_port=ports.take(), bucket=bucket, other_ports={f: ports.take() for f in PORT_FLAGS})

    def endpoint_url(self, port: int | None = None) -> str:
        return f"http://{LOOPBACK}:{port or self.s3_port}"

    def start(self) -> None:
        (self.root / "data").mkdir(parents=True, exist_ok=True)
        config = self.root / "s3.json"
        config.write_text(json.dumps({"identities": [{
            "name": "harness", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}))
        argv = [str(weed()), "mini", f"-dir={self.root / 'data'}", f"-ip={LOOPBACK}", f"-ip.bind={LOOPBACK}",
                f"-s3.port={self.s3_port}", "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false",
                "-admin.ui=false", f"-s3.config={config}", f"-bucket={self.bucket}"]
        argv += [f"-{flag}={port}" for flag, port in self.other_ports.items()]
        env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "S3_"))}
        self.process = ServiceProcess(name=self.name, argv=argv, log_path=self.root / "weed.log",
                                      env=env, cwd=self.root).start()

    def client(self, endpoint_url: str | None = None):
        return s3_client(endpoint_url or self.endpoint_url())

    def ready(self) -> bool:
        self.client().head_bucket(Bucket=self.bucket)
        return True

    def wait_ready(self, timeout: float = 30) -> float:
        return wait_until(self.ready, timeout, "SeaweedFS S3", interval=0.1,
                          on_fail=lambda: self.process.tail() if self.process else "")

    def create_bucket(self, name: str) -> None:
        client = self.client()
        try:
            client.head_bucket(Bucket=name)
        except Exception:
            client.create_bucket(Bucket=name)
