"""``python -m outbox_relay``: run one relay instance until SIGTERM or SIGINT.

Settings come from the arguments only. Bad arguments exit with status 2 and one
line on stderr; a clean stop (the batch in flight finished) exits 0.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import NoReturn

import uvloop

from kit import logs, telemetry
from kit.heap import prepare_service_heap
from kit.signals import until_signal
from outbox_relay.config import RelayConfig
from outbox_relay.relay import run_relay

# This command's text lines as they always were (a colon before the message).
_TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


def _topic_pair(text: str) -> tuple[str, str]:
    source, sep, target = text.partition("=")
    if not sep or not source or not target:
        raise argparse.ArgumentTypeError(f"expected ROW_TOPIC=KAFKA_TOPIC, got {text!r}")
    return source, target


def parser() -> argparse.ArgumentParser:
    """The command line of ``python -m outbox_relay``."""
    p = _Parser(prog="outbox_relay", description="Relay an outbox table to Kafka.")
    p.add_argument("--database-url", required=True, help="postgresql:// URL of the outbox")
    p.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers, host:port[,...]")
    p.add_argument("--table", default="outbox", help="outbox table name (default: outbox)")
    p.add_argument(
        "--no-idempotence",
        dest="enable_idempotence",
        action="store_false",
        help="disable the idempotent producer (brokers without it, e.g. Tansu)",
    )
    p.add_argument("--topic-prefix", default="", help="prepended to each row's topic")
    p.add_argument(
        "--topic-map",
        type=_topic_pair,
        action="append",
        default=[],
        metavar="ROW_TOPIC=KAFKA_TOPIC",
        help="publish rows of ROW_TOPIC to KAFKA_TOPIC (repeatable)",
    )
    p.add_argument("--relay-id", help="lease owner name (default: relay:<host>:<pid>:<random>)")
    p.add_argument("--batch-size", type=int, default=1000)
    p.add_argument("--poll-interval", type=float, default=1.0, help="seconds")
    p.add_argument(
        "--read-interval",
        type=float,
        default=0.01,
        help="seconds at least between two reads of a stream of commits (one batch)",
    )
    p.add_argument("--lease-ttl", type=float, default=15.0, help="seconds")
    p.add_argument("--retention-hours", type=float, default=24.0)
    p.add_argument("--retention-interval", type=float, default=60.0, help="seconds")
    p.add_argument("--metrics-interval", type=float, default=5.0, help="seconds")
    p.add_argument("--request-timeout-ms", type=int, default=30_000)
    p.add_argument("--max-message-bytes", type=int, default=1_048_576)
    p.add_argument("--backoff-max", type=float, default=30.0, help="seconds")
    p.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port")
    p.add_argument(
        "--traces-exporter",
        default="none",
        choices=["none", "console", "otlp"],
        help="export a span per published row (default: none)",
    )
    p.add_argument("--otlp-endpoint", help="OTLP/HTTP traces URL (with --traces-exporter otlp)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    p.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="plain text, or one JSON object per line (default: text)",
    )
    return p


def config_from(args: argparse.Namespace) -> RelayConfig:
    """Build the relay's settings from parsed arguments (``ValueError`` if invalid)."""
    extra = {"relay_id": args.relay_id} if args.relay_id else {}
    return RelayConfig(
        database_url=args.database_url,
        kafka_bootstrap=args.bootstrap,
        table=args.table,
        enable_idempotence=args.enable_idempotence,
        topic_prefix=args.topic_prefix,
        topic_map=dict(args.topic_map),
        batch_size=args.batch_size,
        poll_interval=args.poll_interval,
        read_interval=args.read_interval,
        lease_ttl=args.lease_ttl,
        retention=timedelta(hours=args.retention_hours),
        retention_interval=args.retention_interval,
        metrics_interval=args.metrics_interval,
        request_timeout_ms=args.request_timeout_ms,
        max_message_bytes=args.max_message_bytes,
        backoff_max=args.backoff_max,
        **extra,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv``, run the relay, return the exit status."""
    p = parser()
    args = p.parse_args(argv)
    try:
        config = config_from(args)
    except ValueError as exc:
        p.error(str(exc))
    logs.configure(args.log_level, args.log_format, text_format=_TEXT_FORMAT)
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)
    try:
        telemetry.install("outbox-relay", args.traces_exporter, args.otlp_endpoint)
    except ValueError as exc:
        p.error(str(exc))
    prepare_service_heap()
    try:
        # uvloop, as every process of tool-dispatcher (dispatcher.runtime, which this
        # package sits below): the relay's CPU is mostly event-loop and driver bookkeeping.
        uvloop.run(until_signal(lambda stop: run_relay(config, stop)))
    finally:
        telemetry.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
