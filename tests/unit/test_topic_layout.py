"""The cluster's durability and a topic's layout, decided from plain data (kafka/topics.py)."""

from __future__ import annotations

import pytest

from enhydra.kafka.topics import Durability, TopicError, TopicSpec, durability_of, layout_findings
from enhydra.settings import Connection

BROKER = {"default.replication.factor": "3", "min.insync.replicas": "2"}


def conn(rf: int | None = None, isr: int | None = None) -> Connection:
    return Connection(replication_factor=rf, min_insync_replicas=isr)


def test_unset_means_the_brokers_defaults() -> None:
    assert durability_of(conn(), 3, BROKER) == Durability(3, 2, 3)


def test_set_values_win_and_are_remembered_as_set() -> None:
    assert durability_of(conn(3, 3), 5, BROKER) == Durability(3, 3, 5, True, True)


def test_more_replicas_than_brokers_is_one_plain_error_naming_the_setting_on_creating() -> None:
    durability = durability_of(conn(3), 1, {"default.replication.factor": "1"})
    with pytest.raises(TopicError) as caught:
        TopicSpec("a-commands", 4).new_topic(durability)
    assert str(caught.value) == (
        "ENHYDRA_REPLICATION_FACTOR=3 asks for more replicas than the cluster has brokers up "
        "(1) to create a topic on: set ENHYDRA_REPLICATION_FACTOR to at most 1, or start the "
        "brokers that are down"
    )


def test_a_broker_down_refuses_creating_only() -> None:
    """RF 3 with one of three brokers stopped: the topics that exist go on (min ISR 2 of the
    two left), so reading the durability is no error; only a topic to create needs three."""
    durability = durability_of(conn(), 2, BROKER)
    assert (durability.replication_factor, durability.brokers) == (3, 2)
    with pytest.raises(TopicError, match=r"default\.replication\.factor=3 .* up \(2\)"):
        durability.check_creatable()
    durability_of(conn(), 3, BROKER).check_creatable()  # all up: nothing to say


def test_a_min_isr_above_the_replication_factor_is_refused() -> None:
    with pytest.raises(TopicError, match="ENHYDRA_MIN_INSYNC_REPLICAS=3 is more than"):
        durability_of(conn(2, 3), 3, BROKER)
    # The broker's min.insync.replicas=2 cannot be met by ENHYDRA_REPLICATION_FACTOR=1.
    with pytest.raises(TopicError, match=r"the broker's min\.insync\.replicas=2"):
        durability_of(conn(1), 3, BROKER)


def test_an_unreadable_broker_default_asks_for_the_setting() -> None:
    with pytest.raises(TopicError, match="set ENHYDRA_REPLICATION_FACTOR"):
        durability_of(conn(), 3, {})
    assert durability_of(conn(2, 1), 3, {}).replication_factor == 2


def test_new_topics_get_the_replication_and_a_configured_min_isr() -> None:
    new = TopicSpec("a-changelog", 4, compacted=True).new_topic(Durability(3, 2, 3, True, True))
    assert new.replication_factor == 3
    assert new.topic_configs == {
        "cleanup.policy": "compact",
        "min.compaction.lag.ms": "60000",  # the owner's repair of a late zombie write
        "min.insync.replicas": "2",
    }
    # Unset min ISR: the topic inherits the broker's, so it is not written on the topic.
    plain = TopicSpec("a-commands", 4).new_topic(Durability(3, 2, 3))
    assert plain.topic_configs == {}


GOOD = Durability(3, 2, 3)
CHANGELOG = TopicSpec("a-s-changelog", 4, compacted=True)
EVENTS = TopicSpec("a-events", 4, history=True)
KEPT = {"cleanup.policy": "delete", "retention.ms": "-1", "retention.bytes": "-1"}


def test_a_right_layout_has_no_findings() -> None:
    compacted = {"cleanup.policy": "compact", "min.insync.replicas": "2"}
    assert layout_findings(CHANGELOG, compacted, 3, GOOD) == []
    assert layout_findings(EVENTS, {**KEPT, "min.insync.replicas": "2"}, 3, GOOD) == []


def test_a_changelog_that_is_not_compacted_is_fatal_with_the_fix() -> None:
    [finding] = layout_findings(CHANGELOG, {"cleanup.policy": "delete"}, 3, GOOD)
    assert finding.fatal
    assert finding.line() == (
        "topic a-s-changelog: cleanup.policy=delete, expected cleanup.policy=compact "
        "(a changelog); fix: kafka-configs.sh --bootstrap-server <broker> --alter "
        "--entity-type topics --entity-name a-s-changelog --add-config cleanup.policy=compact"
    )
    # compact,delete deletes old keys by age too
    assert layout_findings(CHANGELOG, {"cleanup.policy": "compact,delete"}, 3, GOOD)[0].fatal


def test_an_events_topic_with_retention_is_fatal() -> None:
    [finding] = layout_findings(EVENTS, {**KEPT, "retention.ms": "604800000"}, 3, GOOD)
    assert finding.fatal and finding.found == "retention.ms=604800000"
    assert "--add-config retention.ms=-1,retention.bytes=-1,cleanup.policy=delete" in finding.fix
    [compacted] = layout_findings(EVENTS, {**KEPT, "cleanup.policy": "compact"}, 3, GOOD)
    assert compacted.found == "cleanup.policy=compact"


def test_a_lower_min_isr_is_fatal_and_a_lower_replication_a_warning() -> None:
    findings = layout_findings(TopicSpec("a-commands", 4), {"min.insync.replicas": "1"}, 1, GOOD)
    assert [(f.fatal, f.found) for f in findings] == [
        (True, "min.insync.replicas=1"),
        (False, "replication factor 1"),
    ]
    assert "--add-config min.insync.replicas=2" in findings[0].fix
    assert "kafka-reassign-partitions.sh" in findings[1].fix


def test_the_durability_settings_reach_every_command_through_the_connection() -> None:
    from enhydra.settings import Settings

    env = {"ENHYDRA_REPLICATION_FACTOR": "3", "ENHYDRA_MIN_INSYNC_REPLICAS": "2"}
    assert Connection.from_env(env).replication_factor == 3  # reset, snapshot, backfill
    settings = Settings.from_env({**env, "ENHYDRA_APP_ID": "bank"})
    assert settings.connection.min_insync_replicas == 2  # the running service
    assert Settings.from_env({"ENHYDRA_APP_ID": "bank"}).connection.replication_factor is None


def test_a_min_isr_above_the_configured_replication_is_a_settings_error() -> None:
    from enhydra.settings import Settings, SettingsError

    env = {"ENHYDRA_APP_ID": "bank", "ENHYDRA_REPLICATION_FACTOR": "2"}
    with pytest.raises(SettingsError, match="INSYNC_REPLICAS=3 is invalid: expected at most"):
        Settings.from_env({**env, "ENHYDRA_MIN_INSYNC_REPLICAS": "3"})
