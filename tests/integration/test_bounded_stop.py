"""SIGTERM ends the process in time even when the broker stops answering.

Kubernetes kills a pod 30 s after SIGTERM; a stop that waits on a broker that does not answer
(an offset commit with no coordinator, a flush, a leave) would be killed mid-way instead of
ending cleanly. The broker here is frozen with SIGSTOP: its sockets stay open and nothing
answers, which is what a hung broker or a black-holed network looks like to the client.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from enhydra.devtools.broker import LocalBroker
from enhydra.testing.processes import ServiceProcess, service_env
from ledger.workload import generate
from tests.integration.ledger_support import produce_in_chunks

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timing]

SIGTERM_BUDGET_S = 25.0  # the target; the setting's default is 25 with a margin inside


def test_sigterm_ends_the_process_in_time_when_the_broker_stops_answering(tmp_path: Path):
    broker = LocalBroker(tmp_path / "kafka", port=0, secured=False)
    info = broker.start()
    service = None
    try:
        env = service_env(
            app_id="frozen-broker",
            bootstrap=info.bootstrap,
            instance_id="f1",
            state_dir=tmp_path / "state",
            extra={"ENHYDRA_LEAVE_GROUP_ON_SHUTDOWN": "true"},  # one more call that must end
        )
        service = ServiceProcess("ledger.service:service", env, tmp_path / "f1.log")
        service.start()
        service.wait_ready()
        commands = generate(50, 3000, seed=4)
        asyncio.run(produce_in_chunks(info.bootstrap, "frozen-broker-commands", commands))
        time.sleep(1.0)  # batches in flight and offsets to commit
        os.kill(info.pid, signal.SIGSTOP)
        time.sleep(1.0)
        started = time.monotonic()
        assert service.process is not None
        service.process.send_signal(signal.SIGTERM)
        try:
            code = service.process.wait(SIGTERM_BUDGET_S + 10)
        except Exception:
            service.kill()
            raise AssertionError(f"still running after SIGTERM:\n{service.log_tail()}") from None
        took = time.monotonic() - started
        print(f"SIGTERM with a frozen broker: exited {code} after {took:.1f}s")
        assert took < SIGTERM_BUDGET_S, service.log_tail()
        assert "could not" in service.log_tail(80)  # it says what it gave up
    finally:
        os.kill(info.pid, signal.SIGCONT)
        if service is not None:
            service.kill()
        broker.stop()
