"""A private PostgreSQL instance: initdb as the `postgres` user, data under the run directory."""
from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import psycopg

from .ports import LOOPBACK, wait_until
from .process import ServiceProcess
from .tools import postgres_bindir

USER = "harness"
PASSWORD = "harness"
OS_USER = "postgres"  # initdb and the server refuse to run as root


def _chown_to_postgres(path: Path) -> None:
    shutil.chown(path, OS_USER, OS_USER)


@dataclass
class Postgres:
    root: Path
    port: int
    process: ServiceProcess | None = None

    name = "postgres"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "socket"

    def url(self, database: str = "postgres", port: int | None = None) -> str:
        return f"postgresql://{USER}:{PASSWORD}@{LOOPBACK}:{port or self.port}/{database}"

    def init(self) -> None:
        """initdb once; a second call on the same folder keeps the data (restart keeps data intact)."""
        if (self.data_dir / "PG_VERSION").exists():
            return
        for folder in (self.root, self.data_dir, self.socket_dir):
            folder.mkdir(parents=True, exist_ok=True)
            _chown_to_postgres(folder)
        pwfile = self.root / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        _chown_to_postgres(pwfile)
        result = subprocess.run(
            ["runuser", "-u", OS_USER, "--", str(postgres_bindir() / "initdb"), "-D", str(self.data_dir),
             "-U", USER, f"--pwfile={pwfile}", "--auth=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync"],
            capture_output=True, text=True,
        )
        pwfile.unlink()
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")

    def start(self) -> None:
        self.init()
        self.process = ServiceProcess(
            name=self.name,
            argv=[str(postgres_bindir() / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                  "-k", str(self.socket_dir), "-c", f"listen_addresses={LOOPBACK}",
                  # fsync=off only loses data on an OS crash; a killed server still recovers every commit,
                  # which is what the database-restart faults need. synchronous_commit stays on.
                  "-c", "fsync=off", "-c", "full_page_writes=off", "-c", "max_connections=300",
                  "-c", "shared_buffers=128MB", "-c", "log_min_messages=warning"],
            log_path=self.root / "postgres.log", user=OS_USER, env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C"},
        ).start()

    def ready(self) -> bool:
        with psycopg.connect(self.url(), connect_timeout=1, autocommit=True) as conn:
            return conn.execute("select 1").fetchone() == (1,)

    def wait_ready(self, timeout: float = 30) -> float:
        return wait_until(self.ready, timeout, "PostgreSQL", on_fail=lambda: self.process.tail() if self.process else "")

    def create_database(self, name: str) -> None:
        with psycopg.connect(self.url(), connect_timeout=5, autocommit=True) as conn:
            exists = conn.execute("select 1 from pg_database where datname = %s", (name,)).fetchone()
            if not exists:
                conn.execute(psycopg.sql.SQL("create database {}").format(psycopg.sql.Identifier(name)))
