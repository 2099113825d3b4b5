"""Each tenant's own credentials (issue 21): what a submission's roles are given — a database role, a broker user, an
S3 key — reaches its own database, vhost and bucket and nothing else of the shared stack, even through its own
proxies (which isolation lets it reach). The harness's own observers keep the administrator's (the direct URLs).

Before: every tenant was given the stack's superuser, broker administrator and S3 admin key, so a submission read
other tenants' databases and buckets through its own proxy (tests/cheats/other_tenants: "achieved")."""

from __future__ import annotations

import asyncio
import re
import time
import uuid

import aio_pika
import boto3
import psycopg
import pytest

from harness.broker.rabbitmq import Management

pytestmark = pytest.mark.integration


def _connects(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3) as conn:
            return conn.execute("select 1").fetchone() == (1,)
    except psycopg.OperationalError:
        return False


def _with_database(url: str, name: str) -> str:
    return url.rsplit("/", 1)[0] + "/" + name


def _s3(env: dict):
    return boto3.client("s3", endpoint_url=env["S3_ENDPOINT_URL"], region_name="us-east-1",
                        aws_access_key_id=env["S3_ACCESS_KEY"], aws_secret_access_key=env["S3_SECRET_KEY"])


async def _opens(url: str) -> bool:
    try:
        connection = await aio_pika.connect(url, timeout=5)
    except Exception:
        return False
    await connection.close()
    return True


async def _touches_the_tap(url: str) -> dict:
    found = {}
    connection = await aio_pika.connect(url, timeout=5)
    async with connection:
        for what, action in (("read", lambda ch: ch.get_queue("harness.tap", ensure=False)),
                             ("delete", lambda ch: ch.queue_delete("harness.tap")),
                             ("own queue", lambda ch: ch.declare_queue("jobs", durable=True))):
            channel = await connection.channel()
            try:
                queue = await action(channel)
                if what == "read":
                    await queue.get(fail=False, timeout=5)
                found[what] = "declared" if what == "own queue" else "allowed"
            except Exception as exc:
                found[what] = "refused" if "ACCESS_REFUSED" in repr(exc) or "403" in repr(exc) else repr(exc)
    return found


def test_a_tenants_credentials_reach_its_own_services_only(stack):
    a = stack.new_tenant(f"cred-a-{uuid.uuid4().hex[:6]}")
    b = stack.new_tenant(f"cred-b-{uuid.uuid4().hex[:6]}")
    env_a, env_b = a.env(proxied=True), b.env(proxied=True)
    db_b = env_b["DATABASE_URL"].rsplit("/", 1)[1]

    # PostgreSQL: its own database, owned by its role (so its migrations work); no other database, not even the
    # cluster's own; no superuser.
    with psycopg.connect(env_a["DATABASE_URL"], connect_timeout=5, autocommit=True) as conn:
        conn.execute("create table mine (id int)")
        assert conn.execute("select rolsuper or rolcreatedb or rolcreaterole from pg_roles "
                            "where rolname = current_user").fetchone() == (False,)
    for other in (db_b, "postgres", "template1"):
        assert not _connects(_with_database(env_a["DATABASE_URL"], other)), other
    assert _connects(env_b["DATABASE_URL"])
    # The harness, as the superuser, still reads every tenant's tables.
    with psycopg.connect(a.direct.database_url, connect_timeout=5) as conn:
        assert conn.execute("select count(*) from mine").fetchone() == (0,)

    # RabbitMQ: its own vhost only, and there not the harness's own queue (the tap).
    assert asyncio.run(_opens(env_a["AMQP_URL"]))
    assert not asyncio.run(_opens(env_a["AMQP_URL"].rsplit("/", 1)[0] + "/" + b.vhost))
    Management(a.rabbitmq_management_url, a.direct.amqp_url).declare_queue("harness.tap")
    assert asyncio.run(_touches_the_tap(env_a["AMQP_URL"])) == {"read": "refused", "delete": "refused",
                                                                  "own queue": "declared"}

    # S3: its own bucket only, and no say over who may do what.
    s3_a = _s3(env_a)
    s3_a.put_object(Bucket=a.bucket, Key="k", Body=b"x")
    assert s3_a.get_object(Bucket=a.bucket, Key="k")["Body"].read() == b"x"
    assert [x["Name"] for x in s3_a.list_buckets()["Buckets"]] == [a.bucket]
    _s3(env_b).put_object(Bucket=b.bucket, Key="theirs", Body=b"y")
    for attempt in (lambda: s3_a.list_objects_v2(Bucket=b.bucket), lambda: s3_a.get_object(Bucket=b.bucket, Key="theirs"),
                    lambda: s3_a.put_object(Bucket=b.bucket, Key="planted", Body=b"z")):
        with pytest.raises(Exception, match="AccessDenied|Forbidden|403"):
            attempt()
    iam = boto3.client("iam", endpoint_url=env_a["S3_ENDPOINT_URL"], region_name="us-east-1",
                       aws_access_key_id=env_a["S3_ACCESS_KEY"], aws_secret_access_key=env_a["S3_SECRET_KEY"])
    with pytest.raises(Exception):
        iam.put_user_policy(UserName=a.bucket, PolicyName="all", PolicyDocument='{"Version": "2012-10-17", '
                            '"Statement": [{"Effect": "Allow", "Action": ["s3:*"], "Resource": ["arn:aws:s3:::*"]}]}')
    with pytest.raises(Exception, match="AccessDenied|Forbidden|403"):
        s3_a.list_objects_v2(Bucket=b.bucket)

    # The harness's own reads (direct environment) keep the administrator's key.
    direct = a.env(proxied=False)
    assert direct["S3_ACCESS_KEY"] != env_a["S3_ACCESS_KEY"]
    assert _s3(direct).list_objects_v2(Bucket=b.bucket)["KeyCount"] == 1


def test_a_closed_tenants_key_is_removed_and_its_bucket_kept(stack):
    """close_tenant removes the tenant's S3 key, policy and user (each key left in the store slows every later IAM
    write: harness/stack/seaweedfs.py), keeps its bucket for a post-mortem, and may be called twice."""
    tenant = stack.new_tenant(f"closed-{uuid.uuid4().hex[:8]}")
    env = tenant.env(proxied=False) | {k: v for k, v in tenant.env().items() if k.startswith("S3_") and "KEY" in k}
    _s3(env).put_object(Bucket=tenant.bucket, Key="kept", Body=b"x")
    stack.close_tenant(tenant)
    # The store applies its identity configuration a moment after the write (seconds on a loaded machine).
    refused, deadline = None, time.monotonic() + 30
    while refused is None and time.monotonic() < deadline:
        try:
            _s3(env).put_object(Bucket=tenant.bucket, Key="after", Body=b"y")
            time.sleep(0.3)
        except Exception as exc:
            refused = exc
    assert refused is not None and re.search("InvalidAccessKeyId|AccessDenied|Forbidden|403", str(refused)), refused
    users = {u["UserName"] for u in stack.s3.iam().list_users()["Users"]}
    assert tenant.bucket not in users
    direct = _s3(tenant.env(proxied=False))
    assert direct.get_object(Bucket=tenant.bucket, Key="kept")["Body"].read() == b"x"
    stack.close_tenant(tenant)  # twice: nothing left to remove, no error
