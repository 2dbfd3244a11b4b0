"""One rule for namespaces, checked by every party that names keys (rcoord.names)."""

from __future__ import annotations

import pytest

from rcoord import CoordinatorConfig
from rcoord.errors import ConfigError, InvalidRequestError
from rcoord.names import valid_namespace
from rcoord.topics import Producer, Topics, fetch, fetch_many


@pytest.mark.parametrize("name", ["rcoord", "a.b:c-d_e", "x" * 64, "0"])
def test_valid_namespaces(name):
    assert valid_namespace(name)
    assert CoordinatorConfig(namespace=name).namespace == name


@pytest.mark.parametrize("name", ["", "x" * 65, "a{b}", "a}b{", "ns\n", "sp ace", "é", None, 7])
def test_invalid_namespaces_are_refused_by_the_coordinator(name):
    assert not valid_namespace(name)
    with pytest.raises(ConfigError, match="namespace must be"):
        CoordinatorConfig(namespace=name)


@pytest.mark.parametrize("name", ["a}b{", "ns\n", ""])
def test_the_topics_api_refuses_them_too(redis_client, name):
    # Before, "a}b{" put a partition's stream and its producer state in different cluster
    # slots (CROSSSLOT at the first idempotent append); now every entry point says so at once.
    with pytest.raises(InvalidRequestError, match="namespace must be"):
        Topics(redis_client, name)
    with pytest.raises(InvalidRequestError, match="namespace must be"):
        Producer(redis_client, name)
    with pytest.raises(InvalidRequestError, match="namespace must be"):
        fetch(redis_client, name, "t", 0, 0)
    with pytest.raises(InvalidRequestError, match="namespace must be"):
        fetch_many(redis_client, name, [("t", 0, 0)])


@pytest.mark.parametrize("instance_id", [".", "..", "abc\n", "", "a b", "x" * 250, 7, "host:1",
                                         "pod/3"])
def test_a_static_member_id_the_java_client_refuses_is_refused_by_the_config(instance_id):
    """Kafka's Java client checks group.instance.id when the consumer is made (ConsumerConfig,
    with the topic name rule); the worker's config does the same. It took "." and "..", and
    "abc\\n" (a regex's $ matches before a final newline). The coordinator takes them, as
    Kafka's broker does (tests/test_static_membership_ids.py)."""
    from rcoord import ConsumerGroupConfig

    with pytest.raises(ConfigError, match="group_instance_id"):
        ConsumerGroupConfig(group_id="g", topics=["t"], redis_url="redis://h:1",
                            group_instance_id=instance_id)


@pytest.mark.parametrize("instance_id", [".", "..", "abc\n", "a b", "x" * 1024, "host:1",
                                         "pod/3", "{tag}", "\u00fc"])
def test_the_coordinator_takes_every_instance_id_kafkas_broker_takes(instance_id):
    """Only Kafka's Java client applies the topic name rule; a librdkafka or kafka-python
    member with group.instance.id "host:1" was answered INVALID_REQUEST by the gateway."""
    from rcoord.protocol._checks import check_instance_id

    assert check_instance_id(instance_id) == instance_id


@pytest.mark.parametrize("instance_id", ["", "x" * 1025, "\ud800", 7])
def test_the_coordinator_refuses_an_instance_id_it_cannot_store(instance_id):
    from rcoord.protocol._checks import check_instance_id

    with pytest.raises((InvalidRequestError, TypeError)):
        check_instance_id(instance_id)


@pytest.mark.parametrize("instance_id", ["worker-1", "a.b_c", "x" * 249, "..."])
def test_static_member_ids_kafka_takes(instance_id):
    from rcoord import ConsumerGroupConfig
    from rcoord.protocol._checks import check_instance_id

    config = ConsumerGroupConfig(group_id="g", topics=["t"], redis_url="redis://h:1",
                                 group_instance_id=instance_id)
    assert config.group_instance_id == check_instance_id(instance_id) == instance_id
