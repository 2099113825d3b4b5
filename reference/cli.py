"""Console script ``reference``: one subcommand per role, plus migrate and replay.

    reference migrate            alembic upgrade head + broker topology + bucket (idempotent)
    reference api                HTTP API on HTTP_HOST:HTTP_PORT
    reference relay              outbox relay
    reference worker             job consumer
    reference sweeper            lease recovery and staging cleanup
    reference replay ID --reason TEXT [--operator NAME]

Long-running roles exit 0 on SIGTERM after a graceful shutdown of at most
SHUTDOWN_GRACE_SECONDS.
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import logging
import signal
import sys
import time
import uuid

from reference.runtime import configure_logging, install_stop_signals
from reference.settings import Settings

log = logging.getLogger("reference")


def _settings(role: str) -> Settings:
    settings = Settings()
    configure_logging(role, settings.log_level)
    return settings


def cmd_migrate(_: argparse.Namespace) -> int:
    settings = _settings("migrate")
    from reference import topology
    from reference.db.migrate import upgrade_head
    from reference.storage import ObjectStore

    deadline = time.monotonic() + 60
    while True:
        try:
            upgrade_head(settings)
            ObjectStore.from_settings(settings).ensure_bucket()

            async def declare() -> None:
                import aio_pika

                connection = await aio_pika.connect(settings.amqp_url, timeout=5)
                async with connection:
                    channel = await connection.channel()
                    await topology.declare(channel, topology.config_from_settings(settings))

            asyncio.run(declare())
            log.info("schema at head, topology declared, bucket present")
            return 0
        except Exception as exc:
            if time.monotonic() > deadline:
                log.error("migrate failed: %s: %s", type(exc).__name__, exc)
                return 1
            log.warning("migrate: %s: %s; retrying", type(exc).__name__, exc)
            time.sleep(1)


def cmd_api(_: argparse.Namespace) -> int:
    settings = _settings("api")
    import uvicorn

    from reference.api.app import create_app

    config = uvicorn.Config(
        create_app(settings), host=settings.http_host, port=settings.http_port, log_level="warning",
        access_log=False, timeout_graceful_shutdown=int(settings.shutdown_grace_seconds), lifespan="on",
    )
    server = uvicorn.Server(config)
    # uvicorn re-raises the captured SIGTERM after its graceful shutdown; with a
    # no-op handler underneath, that ends in exit code 0 like the other roles.
    signal.signal(signal.SIGTERM, lambda *_: None)
    signal.signal(signal.SIGINT, lambda *_: None)
    server.run()
    return 0


def _run_role(role: str, build) -> int:
    settings = _settings(role)
    from reference import metrics

    metrics.serve(settings.metrics_port)

    async def main() -> None:
        stop = asyncio.Event()
        install_stop_signals(stop)
        service = build(settings)
        await service.run(stop)

    asyncio.run(main())
    log.info("%s stopped", role)
    return 0


def cmd_relay(_: argparse.Namespace) -> int:
    from reference.relay import Relay

    return _run_role("relay", Relay)


def cmd_worker(_: argparse.Namespace) -> int:
    from reference.worker import Worker

    return _run_role("worker", Worker)


def cmd_sweeper(_: argparse.Namespace) -> int:
    from reference.sweeper import Sweeper

    return _run_role("sweeper", Sweeper)


def cmd_replay(args: argparse.Namespace) -> int:
    settings = _settings("replay")
    from reference.db.pool import connect
    from reference.replay import ReplayRefused, replay

    try:
        attachment_id = uuid.UUID(args.attachment_id)
    except ValueError:
        print(json.dumps({"error": {"code": "invalid_id", "message": "not a UUID"}}))
        return 2

    async def main() -> int:
        conn = await connect(settings, "reference-replay")
        async with conn:
            try:
                done = await replay(conn, attachment_id, reason=args.reason, operator=args.operator,
                                    ttl_seconds=settings.job_ttl_seconds)
            except ReplayRefused as exc:
                print(json.dumps({"error": {"code": exc.code, "message": exc.message}}))
                return 1
        print(json.dumps({"attachment_id": str(done.attachment_id), "job_id": str(done.job_id),
                          "attempt": done.attempt}))
        return 0

    return asyncio.run(main())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="reference", description="Reference attachment pipeline")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("migrate", help="upgrade the schema, declare the topology").set_defaults(func=cmd_migrate)
    commands.add_parser("api", help="run the HTTP API").set_defaults(func=cmd_api)
    commands.add_parser("relay", help="run the outbox relay").set_defaults(func=cmd_relay)
    commands.add_parser("worker", help="run a worker").set_defaults(func=cmd_worker)
    commands.add_parser("sweeper", help="run the sweeper").set_defaults(func=cmd_sweeper)
    replay = commands.add_parser("replay", help="operator replay of a failed attachment")
    replay.add_argument("attachment_id")
    replay.add_argument("--reason", required=True)
    replay.add_argument("--operator", default=None, help="who replays (default: the login name)")
    replay.set_defaults(func=cmd_replay)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "operator", "x") is None:
        try:
            args.operator = f"cli:{getpass.getuser()}"
        except Exception:
            args.operator = "cli"
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
