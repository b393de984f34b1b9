"""A tiny instance for the failover tests: a static group member with a liveness endpoint.

    python -m tests.failover.peer --instance v1 --port 0 [--bootstrap B --group G --topic T]
        [--session-timeout-ms 30000] [--heartbeat-interval-ms 3000] [--beacon] [--dynamic]

Prints JSON lines: {"event": "listening", "port": P}, then {"event": "assigned"|"revoked",
"partitions": [...], "member": ..., "at": unix time} on every rebalance. It keeps consuming, so
it stays a working member. GET /block?seconds=S blocks its event loop (a busy loop, a long GC).
SIGTERM stops it cleanly: a goodbye on the liveness streams, no LeaveGroup (static member).
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import sys
import time

import orjson
from aiohttp import web
from aiokafka import ConsumerRebalanceListener

from enhydra.control.channel import ControlChannel
from enhydra.failover import Beacon, add_liveness_routes
from enhydra.kafka.clients import Consumer, as_connection, new_consumer, start


def emit(event: str, **fields: object) -> None:
    sys.stdout.write(orjson.dumps({"event": event, "at": time.time(), **fields}).decode() + "\n")
    sys.stdout.flush()


class Reporter(ConsumerRebalanceListener):
    def __init__(self) -> None:
        self.consumer: Consumer | None = None

    def member(self) -> str | None:
        coordinator = getattr(self.consumer, "_coordinator", None)
        return coordinator.member_id if coordinator is not None else None

    def generation(self) -> int | None:
        coordinator = getattr(self.consumer, "_coordinator", None)
        return coordinator.generation if coordinator is not None else None

    async def on_partitions_revoked(self, revoked):  # type: ignore[no-untyped-def]
        if revoked:
            emit("revoked", partitions=sorted(tp.partition for tp in revoked))

    async def on_partitions_assigned(self, assigned):  # type: ignore[no-untyped-def]
        partitions = sorted(tp.partition for tp in assigned)
        emit("assigned", partitions=partitions, member=self.member(), generation=self.generation())


async def main(args: argparse.Namespace) -> None:
    reporter = Reporter()
    app = web.Application()

    async def block(request: web.Request) -> web.Response:
        time.sleep(float(request.query.get("seconds", "1")))  # the whole loop stands still
        return web.json_response({"blocked": True})

    app.router.add_get("/block", block)
    endpoint = add_liveness_routes(app, args.instance, member_id=reporter.member)
    runner = web.AppRunner(app)
    await runner.setup()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", args.port))
    site = web.SockSite(runner, sock)
    await site.start()
    emit("listening", port=sock.getsockname()[1])

    consumer = None
    control = beacon = None
    if args.group:
        consumer = new_consumer(
            args.bootstrap,
            group_id=args.group,
            group_instance_id=None if args.dynamic else args.instance,
            client_id=args.instance,
            session_timeout_ms=args.session_timeout_ms,
            heartbeat_interval_ms=args.heartbeat_interval_ms,
            auto_offset_reset="earliest",
        )
        reporter.consumer = consumer
        consumer.subscribe([args.topic], listener=reporter)
        await start(consumer, args.bootstrap)
    if args.beacon:

        async def ignore(_message: dict) -> None:
            return None

        control = ControlChannel(as_connection(args.bootstrap), args.group, args.instance, ignore)
        await control.start()
        beacon = Beacon(control.send, member_id=reporter.member)
        beacon.start()

    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    while not stop.is_set():
        if consumer is not None:
            await consumer.getmany(timeout_ms=200)
        else:
            await asyncio.sleep(0.2)
    # Each step of the stop is reported, so a stop that hangs says where.
    emit("stopping", step="goodbye")
    await endpoint.goodbye("restart")
    if beacon is not None:
        emit("stopping", step="beacon")
        await beacon.stop()
    if control is not None:
        emit("stopping", step="control channel")
        await control.stop()
    if consumer is not None:
        emit("stopping", step="consumer")
        await consumer.stop()  # a static member sends no LeaveGroup; a dynamic one does
    emit("stopping", step="http server")
    await runner.cleanup()
    emit("stopped")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--instance", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--bootstrap", default="")
    parser.add_argument("--group", default="")
    parser.add_argument("--topic", default="")
    parser.add_argument("--session-timeout-ms", type=int, default=30000)
    parser.add_argument("--heartbeat-interval-ms", type=int, default=3000)
    parser.add_argument("--beacon", action="store_true")
    parser.add_argument("--dynamic", action="store_true", help="no group.instance.id")
    asyncio.run(main(parser.parse_args()))
