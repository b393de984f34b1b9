"""The ledger on a 3-node cluster with no replication setting at all (issue #26, item 4).

The `kafka_cluster` brokers default to replication factor 3 and min.insync.replicas 2; the
instances and the commands set neither, so everything below holds on the broker's defaults.
Brokers are rolled (SIGTERM, controlled shutdown) and killed (SIGKILL) while two instances
take a steady command stream; afterwards the fault tests' checker holds (state equals the
model, no zombie write, one event per command and index, every partition resumes, every
instance still runs), and the events topic never stopped growing for longer than the bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from enhydra.kafka.clients import as_connection, open_admin
from enhydra.kafka.groups import committed_offsets
from enhydra.testing.processes import wait_for_committed
from ledger.workload import generate, model
from tests.cluster.support import (
    DURABLE,
    BrokerDefaults,
    GrowthWatch,
    durability,
    wait_in_isr,
)
from tests.faults.support import leaders, run
from tests.integration.ledger_support import feed, read_accounts
from tests.integration.test_topic_durability import cli

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timing]

ROLLING_PAUSE = 3.0  # s: a controlled shutdown moves leaders first, so writes barely wait
# A killed broker keeps leading its partitions until the controller fences it (its session,
# broker.session.timeout.ms, expires: measured here at about twice the configured 4 s); only
# then do leaders move and producers resume. The runtime's part is what follows: 3 s for
# clients to see new metadata and retry, as for a roll. The bound is each kill's measured
# fencing time (until the node leads no events partition) plus those 3 s.
CLIENT_REACTION = 3.0
# A killed broker may be the group coordinator: the group's heartbeats fail until another
# broker takes the coordinator over, after the fencing. With the tests' 6 s session (testing/
# processes.py) the members' sessions expire first and the group rebalances (a 10.5 s pause
# measured); production's 30 s session rides that out, so this test runs with it.
PRODUCTION_SESSION = {"ENHYDRA_SESSION_TIMEOUT_MS": "30000", "ENHYDRA_HEARTBEAT_INTERVAL_MS": "500"}


def each_broker_in_turn(
    act: Callable[[int], None], pause_bound: float, *, fenced: bool = False
) -> Callable[[BrokerDefaults], Awaitable[None]]:
    """A fault: `act` on nodes 1..3 one after another, each restarted and back in the ISR
    before the next, while the events topic's growth is watched. With `fenced`, the bound is
    `pause_bound` after the longest time the cluster took to move the node's leaderships."""

    async def fault(s: BrokerDefaults) -> None:
        nonlocal pause_bound
        topic = f"{s.app_id}-events"
        watch = GrowthWatch(s.kafka.bootstrap, topic)
        watching = asyncio.create_task(watch.run())
        fencing = 0.0
        try:
            await asyncio.sleep(2)
            for node in (1, 2, 3):
                watch.mark(f"node {node} down")
                acted = asyncio.get_running_loop().time()
                await asyncio.to_thread(act, node)
                if fenced:
                    took = await leaderships_moved(s.kafka.bootstrap, topic, node, acted)
                    watch.mark(f"node {node} fenced after {took:.1f}s")
                    fencing = max(fencing, took)
                watch.mark(f"node {node} starting")
                await asyncio.to_thread(s.kafka.cluster.node(node).start, 90)
                await wait_in_isr(s.kafka.bootstrap, node)
                watch.mark(f"node {node} in the ISR")
            await asyncio.sleep(2)
        finally:
            watch.stop()
            await watching
        s.notes.append(watch.summary())
        pause_bound += fencing
        if watch.longest_pause > pause_bound:
            s.failures.append(
                f"the events topic stopped growing for {watch.longest_pause:.1f}s "
                f"(bound {pause_bound:.1f}s), until +{watch.paused_until:.1f}s: {watch.marks}"
            )

    return fault


async def leaderships_moved(bootstrap: str, topic: str, node: int, since: float) -> float:
    """Seconds from `since` until `node` leads no partition of `topic` (at most 60)."""
    loop = asyncio.get_running_loop()
    while loop.time() - since < 60:
        try:
            if node not in (await leaders(bootstrap, topic)).values():
                break
        except Exception:  # metadata from a node that is going away: ask again
            pass
        await asyncio.sleep(0.2)
    return loop.time() - since


def test_the_ledger_creates_every_topic_with_the_brokers_durability(cluster, app_id):
    cluster.start_instances()

    async def nothing(s: BrokerDefaults) -> None:
        await asyncio.sleep(2)

    run(cluster, nothing, fault_s=2).assert_holds()
    made = asyncio.run(durability(cluster.kafka.bootstrap, f"{app_id}-"))
    assert set(made) >= {f"{app_id}-{t}" for t in ("commands", "events", "control")}, made
    assert f"{app_id}-accounts-changelog" in made, made
    assert {name: d for name, d in made.items() if d != DURABLE} == {}


def test_a_rolling_restart_of_every_broker_while_commands_flow(cluster):
    cluster.start_instances()

    def controlled_shutdown(node: int) -> None:
        assert cluster.kafka.cluster.node(node).stop(timeout=60)

    fault = each_broker_in_turn(controlled_shutdown, ROLLING_PAUSE)
    run(cluster, fault, fault_s=150).assert_holds()


# Measured on 2026-11-27 (load average 10-30 on 2 cores): every invariant held; the events
# topic paused 8.7 s (30 s session), of which the leaders took 8.3 s to move (the controller's
# fencing) and the clients 0.4 s to resume.
def test_a_kill_9_of_each_broker_in_turn_while_commands_flow(cluster):
    cluster.extra_env.update(PRODUCTION_SESSION)
    cluster.start_instances()

    def crash(node: int) -> None:
        assert cluster.kafka.cluster.node(node).kill()  # returns with its ports free

    fault = each_broker_in_turn(crash, CLIENT_REACTION, fenced=True)
    run(cluster, fault, fault_s=150).assert_holds()


def test_reset_leaves_topics_at_the_brokers_durability(cluster, app_id):
    """`enhydra reset` deletes and recreates the changelogs; with no replication setting they
    come back at the brokers' RF 3 / min ISR 2, as every other topic of the app is."""
    bootstrap = cluster.kafka.bootstrap
    cluster.start_instances(("i1",))
    feed(bootstrap, app_id, generate(20, 100, seed=3))
    asyncio.run(wait_for_committed(bootstrap, app_id, f"{app_id}-commands", timeout=90))
    cluster.stop_instances()

    done = cli({"ENHYDRA_BOOTSTRAP_SERVERS": bootstrap}, "reset", "--app", app_id, "--yes")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{app_id}-accounts-changelog" in done.stdout + done.stderr

    after = asyncio.run(durability(bootstrap, f"{app_id}-"))
    assert f"{app_id}-accounts-changelog" in after, after
    assert {name: d for name, d in after.items() if d != DURABLE} == {}


def test_an_instance_starts_with_one_broker_down_and_a_reset_waits_for_it(cluster, app_id):
    """RF 3 on three brokers, one stopped: the topics that exist take writes (min ISR 2 of the
    two left), so an instance (re)starts and works, as a pod rescheduled during a broker's
    maintenance must; only a command that creates topics needs the third broker, and says so
    in one line, deleting nothing."""
    bootstrap = cluster.kafka.bootstrap
    commands = generate(20, 300, seed=9)
    cluster.start_instances(("i1",))
    feed(bootstrap, app_id, commands[:100])
    cluster.stop_instances()
    cluster.instances.clear()
    node = cluster.kafka.cluster.node(3)
    assert node.stop()
    before = asyncio.run(durability(bootstrap, f"{app_id}-"))

    async def group_offsets() -> dict:
        async with open_admin(as_connection(bootstrap)) as admin:
            return await committed_offsets(admin, app_id)

    (instance,) = cluster.start_instances(("i1",))
    feed(bootstrap, app_id, commands[100:])
    expected = model(commands)
    assert read_accounts([instance], sorted(expected)) == expected
    assert "fewer brokers up than the replication factor" in instance.log_tail(400)
    cluster.stop_instances()
    offsets = asyncio.run(group_offsets())

    refused = cli({"ENHYDRA_BOOTSTRAP_SERVERS": bootstrap}, "reset", "--app", app_id, "--yes")
    assert refused.returncode != 0
    assert "Traceback" not in refused.stderr, refused.stderr
    assert "than the cluster has brokers up (2) to create a topic on" in refused.stderr
    assert asyncio.run(durability(bootstrap, f"{app_id}-")) == before  # nothing deleted
    assert asyncio.run(group_offsets()) == offsets  # nor the group rewound
