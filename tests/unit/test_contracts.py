"""The contracts stream and batch share: one partitioner, one header set, one entry codec."""

from __future__ import annotations

from aiokafka.partitioner import murmur2 as aiokafka_murmur2
from hypothesis import given
from hypothesis import strategies as st

from enhydra.contracts.codec import Entry, decode_entry, encode_entry
from enhydra.contracts.headers import (
    COMMAND_ID_HEADER,
    COMMAND_OFFSET_HEADER,
    EVENT_INDEX_HEADER,
    EVENT_VERSION_HEADER,
    command_event_headers,
    event_headers,
    event_source,
    header,
    version_header,
)
from enhydra.contracts.partitioner import murmur2, partition_for


@given(st.binary(max_size=64))
def test_murmur2_is_kafkas(key: bytes) -> None:
    assert murmur2(key) == aiokafka_murmur2(key)


@given(st.binary(min_size=1, max_size=32), st.integers(1, 512))
def test_keys_land_where_kafka_producers_put_them(key: bytes, partitions: int) -> None:
    assert partition_for(key, partitions) == (aiokafka_murmur2(key) & 0x7FFFFFFF) % partitions


@given(
    st.text(min_size=1, max_size=20),
    st.integers(0, 2**40),
    st.integers(0, 40),
    st.integers(1, 1000),
)
def test_event_headers_read_back(command_id: str, offset: int, index: int, version: int) -> None:
    headers = event_headers(command_id.encode(), offset, index, version_header(version))
    assert [name for name, _ in headers] == [
        COMMAND_ID_HEADER,
        COMMAND_OFFSET_HEADER,
        EVENT_INDEX_HEADER,
        EVENT_VERSION_HEADER,
    ]
    assert header(headers, COMMAND_ID_HEADER) == command_id.encode()
    assert event_source(headers) == (offset, index)
    assert header(headers, EVENT_VERSION_HEADER) == str(version).encode()


@given(
    st.text(min_size=1, max_size=20),
    st.integers(0, 2**40),
    st.lists(st.integers(1, 5), min_size=1, max_size=20),
)
def test_a_commands_event_headers_are_each_events_headers(
    command_id: str, offset: int, versions: list[int]
) -> None:
    """The hot path builds a command's headers at once; they are the same as one by one."""
    version_headers = [version_header(v) for v in versions]
    at_once = command_event_headers(command_id.encode(), offset, version_headers)
    assert at_once == [
        event_headers(command_id.encode(), offset, index, version)
        for index, version in enumerate(version_headers)
    ]


def test_events_are_version_1_unless_told() -> None:
    assert header(event_headers(b"c", 0, 0), EVENT_VERSION_HEADER) == b"1"


def test_entry_bytes_round_trip() -> None:
    entry = Entry({"balance": 5}, 17, ["c1", "c2"])
    assert decode_entry(encode_entry(entry)) == entry
    assert encode_entry(entry) == b'[17,["c1","c2"],{"balance":5}]'
