"""Records placed by another client's partitioner are refused, not given a second state.

librdkafka's default (`consistent_random`) puts a key on crc32(key) % n, sarama's on
|int32(fnv1a(key))| % n; Kafka's Java client and aiokafka on murmur2. The two reference
partitioners are written out here from their documented rules, to find keys where they
disagree with murmur2.
"""

from __future__ import annotations

import zlib

import orjson
import pytest
from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from enhydra.contracts.partitioner import (
    MispartitionedRecord,
    misplaced,
    murmur2,
    partition_for,
)
from enhydra.errors.failure import Stage
from enhydra.processing.core import InputRecord, process_batch
from ledger.domain import accounts

PARTITIONS = 4


def librdkafka_consistent(key: bytes, partitions: int) -> int:
    """librdkafka's `consistent_random` (its default) for a keyed record: CRC32 modulo n."""
    return zlib.crc32(key) % partitions


def sarama_hash(key: bytes, partitions: int) -> int:
    """sarama's HashPartitioner: 32-bit FNV-1a read as a signed int, modulo n, made positive."""
    h = 0x811C9DC5
    for byte in key:
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    signed = h - (1 << 32) if h >= 1 << 31 else h
    return abs(signed) % partitions  # Go's % keeps the sign, then sarama negates


def keys_elsewhere(place, count: int = 5) -> list[tuple[str, int]]:
    """Account keys `place` puts on another partition than murmur2, with that partition."""
    found = []
    for i in range(1000):
        key = f"acct-{i:06d}"
        other = place(key.encode(), PARTITIONS)
        if other != partition_for(key.encode(), PARTITIONS):
            found.append((key, other))
        if len(found) == count:
            return found
    raise AssertionError("no key found where the partitioners disagree")


def test_the_reference_partitioners_follow_their_check_values() -> None:
    assert zlib.crc32(b"123456789") == 0xCBF43926  # the CRC-32 check value
    fnv_a = 0xE40C292C  # FNV-1a 32 of b"a", negative as an int32
    assert sarama_hash(b"a", 7) == abs(fnv_a - (1 << 32)) % 7


@pytest.mark.parametrize("place", [librdkafka_consistent, sarama_hash], ids=["crc32", "fnv1a"])
def test_a_key_on_another_clients_partition_is_misplaced(place) -> None:
    for key, other in keys_elsewhere(place):
        wrong = misplaced(key.encode(), other, PARTITIONS)
        assert isinstance(wrong, MispartitionedRecord)
        assert (wrong.expected, wrong.actual) == (partition_for(key.encode(), PARTITIONS), other)
        assert misplaced(key.encode(), wrong.expected, PARTITIONS) is None


def test_the_reason_names_both_partitions_and_the_fix() -> None:
    reason = str(MispartitionedRecord(2, 0))
    assert "belongs on partition 2" in reason and "arrived on partition 0" in reason
    assert "partitioner=murmur2_random" in reason and "enhydra send" in reason
    assert "\n" not in reason


def test_an_unkeyed_record_is_not_misplaced() -> None:
    assert misplaced(None, 3, PARTITIONS) is None
    assert misplaced(b"", 3, PARTITIONS) is None


@pytest.mark.parametrize("place", [librdkafka_consistent, sarama_hash], ids=["crc32", "fnv1a"])
def test_a_misplaced_command_changes_no_state_and_fails_as_read(place) -> None:
    """Between correctly placed commands of the same key, on its partition, nothing changes."""
    key, other = keys_elsewhere(place, 1)[0]
    neighbour = next(
        k for i in range(100) if partition_for((k := f"acct-{i:06d}").encode(), 4) == other
    )

    def cmd(i: int, account: str, kind: str, amount: int = 0) -> bytes:
        body = {"command_id": f"c{i}", "type": kind, "account": account}
        return orjson.dumps({**body, "amount": amount} if amount else body)

    records = [
        InputRecord(0, neighbour.encode(), cmd(0, neighbour, "open")),
        InputRecord(1, key.encode(), cmd(1, key, "open")),
        InputRecord(2, key.encode(), cmd(2, key, "deposit", 50)),
        InputRecord(3, neighbour.encode(), cmd(3, neighbour, "deposit", 20)),
    ]
    result = process_batch(accounts, records, lambda _k: None, partition=other, partitions=4)
    assert sorted(result.changed) == [neighbour]  # the partition's own keys go on as before
    assert result.changed[neighbour].state["balance"] == 20
    assert [(f.record.offset, type(f.error), f.stage, f.key) for f in result.failures] == [
        (1, MispartitionedRecord, Stage.DESERIALIZE, key),
        (2, MispartitionedRecord, Stage.DESERIALIZE, key),
    ]
    assert result.last_offset == 3
    unchecked = process_batch(accounts, records, lambda _k: None)  # the in-memory driver's way
    assert key in unchecked.changed


@given(st.binary(max_size=700))
def test_murmur2_is_kafkas_for_keys_of_any_length(key: bytes) -> None:
    assert murmur2(key) == aiokafka_murmur2(key)
