"""The `cluster` fixture: the ledger's harness on the session's 3-node cluster, left whole."""

from __future__ import annotations

import asyncio

import pytest

from tests.cluster.support import BrokerDefaults, wait_in_isr


@pytest.fixture
def cluster(kafka_cluster, app_id, tmp_path):
    made = BrokerDefaults(kafka_cluster, app_id, tmp_path)
    yield made
    made.stop_instances()
    kafka_cluster.heal()
    kafka_cluster.cluster.start(timeout=120)  # a test that failed mid-fault restarts its node
    for node in (1, 2, 3):  # and the next test starts on a whole cluster
        asyncio.run(wait_in_isr(kafka_cluster.bootstrap, node))
