"""Console script ``reference``: one subcommand per role, plus migrate and replay.

    reference migrate            alembic upgrade head + broker topology + bucket (idempotent)
    reference api                HTTP API on HTTP_HOST:HTTP_PORT
    reference relay              outbox relay
    reference worker             job consumer
    reference sweeper            lease recovery and staging cleanup
    reference replay ID --reason TEXT [--operator NAME] [--pipeline-version N]
    reference operator-token (create NAME | revoke NAME | list)
    reference dlq list [--limit N]
    reference dlq replay (--message-id K | --job-id ID | --dead-reason TEXT | --older-than S | --all) --reason TEXT

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
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from reference import tracing
from reference.runtime import configure_logging, install_stop_signals
from reference.settings import Settings

if TYPE_CHECKING:
    from pydantic import ValidationError

    from reference.db.pool import Connection, Pool
    from reference.replay import OperatorRefused

_T = TypeVar("_T")

log = logging.getLogger("reference")


class ConfigurationRefused(SystemExit):
    """Settings refused at start: one line per problem on stderr naming the setting, exit code 2."""


def configuration_problems(error: ValidationError) -> list[str]:
    """One line per problem of a pydantic ValidationError, each naming its setting (values of secrets and URLs
    are not repeated)."""
    lines = []
    for problem in error.errors():
        names = [str(part).upper() for part in problem.get("loc") or () if isinstance(part, str)]
        message = str(problem.get("msg") or "invalid").removeprefix("Value error, ")
        if names:
            name = ".".join(names)
            value = problem.get("input")
            secret = any(word in name for word in ("URL", "KEY", "TOKEN", "SECRET", "PASSWORD"))
            shown = "" if secret or value is None or isinstance(value, dict) else f"={str(value)[:80]!r}"
            lines.append(f"{name}{shown}: {message}")
        else:
            lines.append(message)
    return lines


def _settings(role: str) -> Settings:
    from pydantic import ValidationError

    try:
        settings = Settings()
    except ValidationError as exc:
        for line in configuration_problems(exc):
            print(f"reference {role}: configuration refused: {line}", file=sys.stderr)
        raise ConfigurationRefused(2) from None
    configure_logging(role, settings.log_level, settings.log_format)
    tracing.configure(settings.tracing_exporter, role)
    for warning in settings.start_warnings():
        log.warning("configuration: %s", warning)
    return settings


def cmd_migrate(_: argparse.Namespace) -> int:
    settings = _settings("migrate")
    from reference import brokers, topology
    from reference.db.migrate import upgrade_head
    from reference.storage import ObjectStore

    deadline = time.monotonic() + 60
    while True:
        try:
            upgrade_head(settings)
            ObjectStore.from_settings(settings).ensure_bucket()

            async def declare() -> None:
                connection = await brokers.connect(settings, timeout=5)
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


def _run_role(role: str, build: Callable[[Settings], Any]) -> int:
    settings = _settings(role)
    from reference import health

    service = build(settings)
    role_health = getattr(service, "health", None)
    # /metrics, /livez and /readyz of the role (reference/health.py), before any other socket is opened
    health.serve(settings.metrics_port, role_health)

    async def main() -> None:
        stop = asyncio.Event()
        install_stop_signals(stop)
        if role_health is None:
            await service.run(stop)
            return
        beats = asyncio.create_task(role_health.run_beats(stop))
        try:
            await service.run(stop)
        finally:
            stop.set()
            await beats

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


def _on_one_attachment(name: str, attachment_id_text: str,
                       act: Callable[[Connection, Settings, uuid.UUID], Awaitable[_T]],
                       refused: type[OperatorRefused], render: Callable[[_T], object]) -> int:
    """An operator command on one attachment, with the database credentials as the authority (the HTTP endpoints
    need OPERATOR_TOKEN): ``act(conn, settings, attachment_id)`` in one connection; a refusal is printed as an error
    (exit 1), a bad id too (exit 2), the outcome as ``render(done)`` (exit 0)."""
    settings = _settings(name)
    from reference.db.pool import connect

    try:
        attachment_id = uuid.UUID(attachment_id_text)
    except ValueError:
        print(json.dumps({"error": {"code": "invalid_id", "message": "not a UUID"}}))
        return 2

    async def main() -> int:
        conn = await connect(settings, f"reference-{name}")
        async with conn:
            try:
                done = await act(conn, settings, attachment_id)
            except refused as exc:
                print(json.dumps({"error": {"code": exc.code, "message": exc.message}}))
                return 1
        print(json.dumps(render(done)))
        return 0

    return asyncio.run(main())


def cmd_replay(args: argparse.Namespace) -> int:
    from reference.replay import ReplayRefused, replay

    return _on_one_attachment(
        "replay", args.attachment_id,
        lambda conn, settings, attachment_id: replay(
            conn, attachment_id, reason=args.reason, operator=args.operator, ttl_seconds=settings.job_ttl_seconds,
            max_attempts=settings.max_attempts, max_replays=settings.effective_max_replays,
            pipeline_version=args.pipeline_version, max_version=settings.served_pipeline_version_max),
        ReplayRefused,
        lambda done: {"attachment_id": str(done.attachment_id), "job_id": str(done.job_id), "attempt": done.attempt})


def cmd_reprocess(args: argparse.Namespace) -> int:
    """Level 5: a job for another pipeline version of an attachment (audited, idempotent)."""
    from reference.reprocess import ReprocessRefused, reprocess

    return _on_one_attachment(
        "reprocess", args.attachment_id,
        lambda conn, settings, attachment_id: reprocess(
            conn, attachment_id, pipeline_version=args.pipeline_version, reason=args.reason, operator=args.operator,
            variants=settings.variants, ttl_seconds=settings.job_ttl_seconds),
        ReprocessRefused,
        lambda done: {"attachment_id": str(done.attachment_id), "job_id": str(done.job_id),
                      "pipeline_version": done.pipeline_version, "attempt": done.attempt, "state": done.state,
                      "created": done.created})


def cmd_dlq_list(args: argparse.Namespace) -> int:
    settings = _settings("dlq")
    from reference import dlq

    print(json.dumps(asyncio.run(dlq.list_letters(settings, args.limit)), indent=2, default=str))
    return 0


def cmd_dlq_replay(args: argparse.Namespace) -> int:
    settings = _settings("dlq")
    from reference import dlq

    selector = dlq.Selector(message_keys=set(args.message_id or []), job_ids=set(args.job_id or []),
                            dead_reason=args.dead_reason, older_than_seconds=args.older_than,
                            everything=args.all, limit=args.limit)
    for job_id in selector.job_ids:
        try:
            uuid.UUID(job_id)
        except ValueError:
            print(json.dumps({"error": {"code": "invalid_id", "message": f"{job_id}: not a UUID"}}))
            return 2

    async def work(pool: Pool) -> dict[str, Any]:
        return await dlq.replay_letters(settings, pool, selector, operator=args.operator,
                                        reason=args.reason, ttl_seconds=settings.job_ttl_seconds,
                                        max_attempts=settings.max_attempts,
                                        max_replays=settings.effective_max_replays)

    try:
        done = asyncio.run(dlq.run_with_pool(settings, work))
    except dlq.DlqRefused as exc:
        print(json.dumps({"error": {"code": exc.code, "message": exc.message}}))
        return 1
    print(json.dumps(done, indent=2, default=str))
    return 0


def cmd_operator_token(args: argparse.Namespace) -> int:
    """Per-operator tokens of the admin API (issue 23 defect 11): create prints the token once (only its hash is
    stored), revoke ends every live token of the name, list shows names and dates. Authority: the database
    credentials."""
    settings = _settings("operator-token")
    from reference import operators
    from reference.db.pool import connect

    async def main() -> dict[str, Any] | list[dict[str, Any]]:
        conn = await connect(settings, "reference-operator-token")
        async with conn:
            if args.token_command == "create":
                return await operators.create(conn, args.name, args.operator)
            if args.token_command == "revoke":
                return await operators.revoke(conn, args.name, args.operator)
            return await operators.listing(conn)

    try:
        done = asyncio.run(main())
    except ValueError as exc:
        print(json.dumps({"error": {"code": "invalid_name", "message": str(exc)}}))
        return 2
    except Exception as exc:
        if getattr(exc, "sqlstate", None) == "23505":
            print(json.dumps({"error": {"code": "exists", "message": f"{args.name} has a live token: revoke it "
                                                                      f"first"}}))
            return 1
        raise
    print(json.dumps(done, default=str))
    return 0 if args.token_command != "revoke" or (isinstance(done, dict) and done["revoked"]) else 1


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
    replay.add_argument("--pipeline-version", type=int, default=None, dest="pipeline_version",
                        help="level 5: the version whose job is replayed (default: the job the status shows)")
    replay.set_defaults(func=cmd_replay)
    tokens = commands.add_parser("operator-token", help="per-operator tokens of the admin API: create, revoke, list")
    token_commands = tokens.add_subparsers(dest="token_command", required=True)
    for verb, text in (("create", "make a token for NAME (printed once; only its hash is stored)"),
                       ("revoke", "end NAME's live token")):
        one = token_commands.add_parser(verb, help=text)
        one.add_argument("name")
        one.add_argument("--operator", default=None, help="who does it (default: the login name)")
        one.set_defaults(func=cmd_operator_token)
    token_commands.add_parser("list", help="names and dates, never a token").set_defaults(func=cmd_operator_token)
    dlq = commands.add_parser("dlq", help="the dead-letter queue: list, replay (audited, idempotent)")
    dlq_commands = dlq.add_subparsers(dest="dlq_command", required=True)
    dlq_list = dlq_commands.add_parser("list", help="what is in the dead-letter queue (nothing is consumed)")
    dlq_list.add_argument("--limit", type=int, default=100)
    dlq_list.set_defaults(func=cmd_dlq_list)
    dlq_replay = dlq_commands.add_parser("replay", help="replay dead letters by message id, job id or filter")
    dlq_replay.add_argument("--message-id", action="append", help="a dead letter's message key (repeatable)")
    dlq_replay.add_argument("--job-id", action="append", help="the dead letters of a job (repeatable)")
    dlq_replay.add_argument("--dead-reason", help="letters whose dead-letter reason contains this text")
    dlq_replay.add_argument("--older-than", type=float, help="letters first dead at least this many seconds ago")
    dlq_replay.add_argument("--all", action="store_true", help="every dead letter")
    dlq_replay.add_argument("--limit", type=int, default=1000, help="dead letters looked at, at most")
    dlq_replay.add_argument("--reason", required=True, help="why (audited)")
    dlq_replay.add_argument("--operator", default=None, help="who replays (default: the login name)")
    dlq_replay.set_defaults(func=cmd_dlq_replay)
    again = commands.add_parser("reprocess", help="level 5: process an attachment for another pipeline version")
    again.add_argument("attachment_id")
    again.add_argument("--pipeline-version", type=int, required=True, dest="pipeline_version")
    again.add_argument("--reason", required=True)
    again.add_argument("--operator", default=None, help="who asks (default: the login name)")
    again.set_defaults(func=cmd_reprocess)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "operator", "x") is None:
        try:
            args.operator = f"cli:{getpass.getuser()}"
        except Exception:
            args.operator = "cli"
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
