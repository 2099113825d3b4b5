"""A private PostgreSQL instance: initdb as the `postgres` user, data and socket in the stack's short data folder."""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg

from ..paths import state_dir
from .data_dir import socket_path
from .ports import LOOPBACK, wait_until
from .process import ServiceProcess
from .tools import postgres_bindir

USER = "harness"
PASSWORD = "harness"
OS_USER = "postgres"  # initdb and the server refuse to run as root

SERVER_SETTINGS = {
    "listen_addresses": LOOPBACK,
    # fsync=off only loses data on an OS crash; a killed server still recovers every commit,
    # which is what the database-restart faults need. synchronous_commit stays on.
    "fsync": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "shared_buffers": "128MB",
    "log_min_messages": "warning",
}


INITDB_ARGS = ("-U", USER, "--auth=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync")
TEMPLATE_CACHE = state_dir() / "cache"  # .run/cache under the checkout, else under the current directory


def _chown_to_postgres(path: Path) -> None:
    shutil.chown(path, OS_USER, OS_USER)


def cluster_template() -> Path:
    """Where a fresh cluster made by this PostgreSQL with these initdb settings is cached (one per combination)."""
    key = hashlib.sha256(repr((str(postgres_bindir()), INITDB_ARGS, PASSWORD)).encode()).hexdigest()[:12]
    return TEMPLATE_CACHE / f"postgres-cluster-{key}"


def _copy_tree(source: Path, target: Path) -> None:
    # cp -a keeps owner and modes (the cluster belongs to `postgres`, mode 0700), which shutil.copytree does not.
    result = subprocess.run(["cp", "-a", "--", str(source), str(target)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"PostgreSQL: copying the cached cluster {source} failed: {result.stderr.strip()}")


def _save_template(data_dir: Path, template: Path) -> None:
    """Cache a copy of a cluster initdb just made. Built beside its final name and renamed, so a concurrent start
    never copies half of one; any failure only means the next start runs initdb again."""
    partial = template.with_name(f"{template.name}.partial-{os.getpid()}-{threading.get_ident()}")
    try:
        template.parent.mkdir(parents=True, exist_ok=True)
        _copy_tree(data_dir, partial)
        os.rename(partial, template)
    except (OSError, RuntimeError):
        pass  # another start cached it first, or the checkout is read-only
    finally:
        shutil.rmtree(partial, ignore_errors=True)


@dataclass
class Postgres:
    root: Path  # in the stack's data folder; owned by the `postgres` OS user
    log_dir: Path  # in the run directory; the log is written through a descriptor we open, so any path works
    port: int
    process: ServiceProcess | None = None
    shared_closed: bool = False  # close_shared_databases ran since this server was waited for

    name = "postgres"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root

    @property
    def socket_path(self) -> Path:
        return socket_path(self.socket_dir, f".s.PGSQL.{self.port}")

    @property
    def log_path(self) -> Path:
        return self.log_dir / "postgres.log"

    def url(self, database: str = "postgres", port: int | None = None, user: str = USER,
            password: str = PASSWORD) -> str:
        return f"postgresql://{user}:{password}@{LOOPBACK}:{port or self.port}/{database}"

    def init(self) -> None:
        """A fresh cluster, unless the folder has one already (a restart keeps its data).

        initdb costs 1-5 s of CPU (shared with the other services starting at the same time); a copy of a cluster
        it made before, kept in the checkout's cache, costs a fraction of that.
        """
        if (self.data_dir / "PG_VERSION").exists():
            return
        self.root.mkdir(parents=True, exist_ok=True)
        _chown_to_postgres(self.root)
        template = cluster_template()
        if (template / "global" / "pg_control").exists():
            _copy_tree(template, self.data_dir)
            return
        self._initdb()
        _save_template(self.data_dir, template)

    def _initdb(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        _chown_to_postgres(self.data_dir)
        pwfile = self.root / "pwfile"
        pwfile.write_text(PASSWORD + "\n")
        _chown_to_postgres(pwfile)
        result = subprocess.run(
            ["runuser", "-u", OS_USER, "--", str(postgres_bindir() / "initdb"), "-D", str(self.data_dir),
             f"--pwfile={pwfile}", *INITDB_ARGS],
            capture_output=True, text=True,
        )
        pwfile.unlink()
        if result.returncode != 0:
            raise RuntimeError(f"PostgreSQL initdb failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")

    def argv(self) -> list[str]:
        argv = [str(postgres_bindir() / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                "-k", str(self.socket_path.parent)]
        for key, value in SERVER_SETTINGS.items():
            argv += ["-c", f"{key}={value}"]
        return argv

    def start(self) -> None:
        self.init()
        self.process = ServiceProcess(
            name=self.name, argv=self.argv(), log_path=self.log_path, user=OS_USER,
            env={"PATH": os.environ.get("PATH", ""), "LC_ALL": "C"},
        ).start()

    def ready(self) -> bool:
        with psycopg.connect(self.url(), connect_timeout=1, autocommit=True) as conn:
            return conn.execute("select 1").fetchone() == (1,)

    def wait_ready(self, timeout: float = 30, abandon: threading.Event | None = None) -> float:
        seconds = wait_until(self.ready, timeout, "PostgreSQL", process=self.process, abandon=abandon,
                             on_fail=lambda: self.process.tail() if self.process else "")
        self.close_shared_databases()
        return seconds

    def close_shared_databases(self) -> None:
        """The cluster's ``postgres`` and ``template1`` databases closed to every non-superuser (the tenants' roles),
        once per server start, before any tenant exists — not once per tenant role: two REVOKEs of one database's
        privileges at the same moment fail with "tuple concurrently updated" (a run's setup failed so while broken
        variants made their tenants three at once). Tried again on that error all the same."""
        for attempt in range(5):
            try:
                with psycopg.connect(self.url(), connect_timeout=5, autocommit=True) as conn:
                    conn.execute("revoke all on database postgres from public")
                    conn.execute("revoke all on database template1 from public")
                break
            except psycopg.errors.InternalError_:
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))
        self.shared_closed = True

    def create_database(self, name: str, template: str | None = None, owner: str | None = None) -> None:
        """A database ``name``; with ``template``, a copy of that database (``CREATE DATABASE … TEMPLATE``: no other
        session may be connected to the template meanwhile; this session is on ``postgres``). With ``owner`` (a
        tenant's role, ``create_role``), that role owns it and everything in it, and no other role but the
        superuser may connect to it: a submission, given its own role, reads no other tenant's database."""
        sql = psycopg.sql
        with psycopg.connect(self.url(), connect_timeout=5, autocommit=True) as conn:
            exists = conn.execute("select 1 from pg_database where datname = %s", (name,)).fetchone()
            if not exists:
                if template:
                    conn.execute(sql.SQL("create database {} template {}").format(sql.Identifier(name),
                                                                                  sql.Identifier(template)))
                else:
                    conn.execute(sql.SQL("create database {}").format(sql.Identifier(name)))
            if owner is None:
                return
            conn.execute(sql.SQL("alter database {} owner to {}").format(sql.Identifier(name), sql.Identifier(owner)))
            conn.execute(sql.SQL("revoke all on database {} from public").format(sql.Identifier(name)))
        if template:  # the copy's objects belong to the template's tenant role: hand them to this one
            with psycopg.connect(self.url(name), connect_timeout=5, autocommit=True) as conn:
                for (role,) in conn.execute(
                        "select distinct r.rolname from pg_class c join pg_roles r on r.oid = c.relowner "
                        "join pg_namespace n on n.oid = c.relnamespace where not r.rolsuper and r.rolname <> %s "
                        "and n.nspname not in ('pg_catalog', 'information_schema')", (owner,)).fetchall():
                    conn.execute(sql.SQL("reassign owned by {} to {}").format(sql.Identifier(role),
                                                                               sql.Identifier(owner)))

    def create_role(self, name: str, password: str) -> None:
        """A login role of a tenant's own: no superuser, cannot create databases or roles. The cluster's
        ``postgres`` and ``template1`` databases are closed to it (and to every other non-superuser)."""
        sql = psycopg.sql
        with psycopg.connect(self.url(), connect_timeout=5, autocommit=True) as conn:
            if conn.execute("select 1 from pg_roles where rolname = %s", (name,)).fetchone():
                conn.execute(sql.SQL("alter role {} with login password {}").format(sql.Identifier(name),
                                                                                   sql.Literal(password)))
            else:
                conn.execute(sql.SQL("create role {} with login nosuperuser nocreatedb nocreaterole password {}")
                             .format(sql.Identifier(name), sql.Literal(password)))
        if not self.shared_closed:  # a server this object did not wait for (started elsewhere)
            self.close_shared_databases()

    def seal_template(self, name: str) -> None:
        """Make database ``name`` a template no one can connect to (a role of a run cannot change what the next
        tenants are cloned from), and end any session still on it (a setup command's pool closing late)."""
        sql = psycopg.sql
        with psycopg.connect(self.url(), connect_timeout=5, autocommit=True) as conn:
            conn.execute(sql.SQL("alter database {} with is_template true allow_connections false")
                         .format(sql.Identifier(name)))
            # The superuser's from now on: a clone's ``reassign owned`` (create_database) must not hand the template
            # itself to the clone's tenant.
            conn.execute(sql.SQL("alter database {} owner to {}").format(sql.Identifier(name), sql.Identifier(USER)))
            conn.execute("select pg_terminate_backend(pid) from pg_stat_activity where datname = %s and pid <> "
                         "pg_backend_pid()", (name,))

    def drop_template(self, name: str, connect_timeout: float = 3) -> None:
        """Drop a database ``seal_template`` made a template."""
        sql = psycopg.sql
        with psycopg.connect(self.url(), connect_timeout=connect_timeout, autocommit=True) as conn:
            if conn.execute("select 1 from pg_database where datname = %s", (name,)).fetchone():
                conn.execute(sql.SQL("alter database {} with is_template false").format(sql.Identifier(name)))
                conn.execute(sql.SQL("drop database {} with (force)").format(sql.Identifier(name)))
