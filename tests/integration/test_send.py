"""`enhydra send` on a real broker: what lands in the topic, and where it stops on bad input."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

from enhydra.kafka.topics import TopicSpec, ensure_topics
from enhydra.testing.processes import read_topic

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def send(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "enhydra.cli.main", "send", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


@pytest.fixture
def topic(kafka_bootstrap: str, app_id: str) -> str:
    name = f"{app_id}-commands"
    asyncio.run(ensure_topics(kafka_bootstrap, [TopicSpec(name, 4)]))
    return name


def lines_for(keys: int, per_key: int) -> list[str]:
    return [
        json.dumps({"command_id": f"c{n}-{k}", "type": "register", "item": f"item-{k}", "n": n})
        for n in range(per_key)
        for k in range(keys)
    ]


def test_sends_every_line_keyed_by_its_field_in_order(
    kafka_bootstrap: str, topic: str, tmp_path: Path
) -> None:
    lines = lines_for(keys=7, per_key=30)
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text("\n".join(lines[:100]) + "\n\n")
    second.write_text("\n".join(lines[100:]) + "\n")
    result = send(topic, "--bootstrap", kafka_bootstrap, "-k", "item", str(first), str(second))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"sent {len(lines)} records to {topic}, keyed by item in ")

    records = asyncio.run(read_topic(kafka_bootstrap, topic))
    assert len(records) == len(lines)
    per_key: dict[str, list[str]] = defaultdict(list)
    partitions: dict[str, set[int]] = defaultdict(set)
    for record in records:
        key = record.key.decode()
        assert json.loads(record.value)["item"] == key
        per_key[key].append(record.value.decode())
        partitions[key].add(record.partition)
    assert all(len(found) == 1 for found in partitions.values()), partitions
    assert len(set().union(*partitions.values())) > 1  # 7 keys spread over the 4 partitions
    expected: dict[str, list[str]] = defaultdict(list)
    for line in lines:
        expected[json.loads(line)["item"]].append(line)
    assert per_key == expected  # every line once, as written, in order per key


def test_reads_stdin(kafka_bootstrap: str, topic: str) -> None:
    lines = lines_for(keys=2, per_key=2)
    result = send(topic, "--bootstrap", kafka_bootstrap, "-k", "item", stdin="\n".join(lines))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"sent 4 records to {topic}, keyed by item")
    values = [r.value.decode() for r in asyncio.run(read_topic(kafka_bootstrap, topic))]
    assert sorted(values) == sorted(lines)


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        ('{"command_id": "x", "item": "item-1"', "not JSON ("),
        ('{"command_id": "x", "type": "register"}', "no 'item' field (the key)"),
    ],
)
def test_a_bad_line_stops_it_after_sending_the_lines_before(
    kafka_bootstrap: str, topic: str, tmp_path: Path, bad: str, reason: str
) -> None:
    lines = lines_for(keys=3, per_key=2)
    path = tmp_path / "commands.jsonl"
    path.write_text("\n".join([*lines[:5], bad, *lines[5:]]) + "\n")
    result = send(topic, "--bootstrap", kafka_bootstrap, "-k", "item", str(path))
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"Error: {path} line 6: {reason}")
    assert line.endswith("stopped there, after sending the 5 records before it")
    values = [r.value.decode() for r in asyncio.run(read_topic(kafka_bootstrap, topic))]
    assert sorted(values) == sorted(lines[:5])


def test_a_missing_topic_is_refused_before_anything_is_sent(
    kafka_bootstrap: str, app_id: str
) -> None:
    result = send(f"{app_id}-nope", "--bootstrap", kafka_bootstrap, stdin='{"a": 1}\n')
    assert result.returncode == 1
    (line,) = result.stderr.splitlines()
    assert line == (
        f"Error: no topic '{app_id}-nope' on {kafka_bootstrap}: start the service once (it "
        "creates its topics with their partition count), or check the name"
    )


def test_an_unreachable_broker_in_one_line_and_a_hint() -> None:
    result = send("t", "--bootstrap", "127.0.0.1:1", stdin='{"a": 1}\n')
    assert result.returncode == 3  # Kafka cannot be used, as for every command
    line, hint = result.stderr.splitlines()
    assert line == "Error: cannot reach Kafka at 127.0.0.1:1: connection refused"
    assert hint.startswith("  hint: check ENHYDRA_BOOTSTRAP_SERVERS")


def test_a_missing_file_is_a_usage_error() -> None:
    result = send("t", "/nonexistent/commands.jsonl")
    assert result.returncode == 2
    assert "/nonexistent/commands.jsonl: no such file" in result.stderr
