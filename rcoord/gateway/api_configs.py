"""DescribeConfigs: what admin tools read about a topic (and ask of the broker) before acting.

A topic's configs are what ``rcoord.topics`` keeps for it, under Kafka's names where Kafka has
one: ``retention.ms`` (-1: unlimited, rcoord's default), ``producer.id.expiration.ms`` (a broker
setting in Kafka, a topic setting here), and rcoord's own ``retention.records``; beside them two
facts that hold for every rcoord topic: ``cleanup.policy=delete`` (retention deletes the oldest
records; nothing is ever compacted) and ``message.timestamp.type=LogAppendTime`` (records are
stamped with the Redis clock on append). A value given at creation has source
DYNAMIC_TOPIC_CONFIG (at creation or by AlterConfigs and IncrementalAlterConfigs,
``api_alter_configs``), any other DEFAULT_CONFIG. The two facts and the broker's configs are
read-only. A config name asked for that rcoord does not have is left out, as Kafka does.

The broker (resource name: this gateway's node id) has the gateway settings Kafka names:
``message.max.bytes``, ``offsets.commit.required.acks`` and ``offsets.commit.timeout.ms``,
with source STATIC_BROKER_CONFIG (command-line flags). The empty name (the cluster-wide dynamic
defaults in Kafka) has no configs: nothing here is set dynamically.

Errors and ACLs, as Kafka's ``ConfigHelper`` and ``KafkaApis``: a topic needs DESCRIBE_CONFIGS
on it (TOPIC_AUTHORIZATION_FAILED, checked before existence, so a refused principal does not
learn whether the topic exists), then an illegal name is INVALID_TOPIC_EXCEPTION and an absent
topic UNKNOWN_TOPIC_OR_PARTITION; the broker needs DESCRIBE_CONFIGS on the cluster
(CLUSTER_AUTHORIZATION_FAILED), and another broker id is INVALID_REQUEST; other resource types
(broker loggers, groups, client metrics) are INVALID_REQUEST.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from ..errors import Errors
from ..topics import TopicError
from ..topics import configs as topic_settings
from .acl import Operation, ResourceType
from .errors import CLUSTER_AUTHORIZATION_FAILED, TOPIC_AUTHORIZATION_FAILED
from .registry import api
from .state import NODE_ID, Connection, GatewayState

__all__ = ["BROKER", "TOPIC", "ConfigEntry", "broker_configs", "configs_of", "topic_configs"]

TOPIC, BROKER = 2, 4
"""Kafka's ``ConfigResource.Type`` codes served here."""

# Kafka's DescribeConfigsResponse.ConfigSource and ConfigType codes.
DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG, DEFAULT_CONFIG = 1, 4, 5
STRING, INT, LONG, LIST = 2, 3, 5, 7


@dataclass(frozen=True)
class ConfigEntry:
    name: str
    value: str
    source: int
    config_type: int
    documentation: str
    read_only: bool = True


def topic_configs(state: GatewayState, name: str) -> list[ConfigEntry]:
    """Blocking: the configs of topic ``name`` (TopicError if it is absent or illegal), from
    one read of its settings (``Topics.describe`` also read every partition's offsets)."""
    return configs_of(state.topics.settings(name))


def configs_of(given: Mapping[str, int | None]) -> list[ConfigEntry]:
    """A topic's configs, sorted by name, from its settings (a setting -> its value; None or
    absent: not given). CreateTopics v5+ answers them for the topic it creates (KIP-525)."""
    def fixed(c: object) -> TypeGuard[topic_settings.FixedConfig]:
        return isinstance(c, topic_settings.FixedConfig)

    return [ConfigEntry(c.kafka_name, value, DYNAMIC_TOPIC_CONFIG if set_ else DEFAULT_CONFIG,
                        (LIST if c.is_list else STRING) if fixed(c) else LONG,
                        c.documentation, read_only=fixed(c))
            for c, value, set_ in topic_settings.topic_configs(given)]


def broker_configs(state: GatewayState) -> list[ConfigEntry]:
    cfg = state.config
    return [
        ConfigEntry("message.max.bytes", str(cfg.message_max_bytes), STATIC_BROKER_CONFIG, INT,
                    "The largest record batch a Produce may append to a partition."),
        ConfigEntry("offsets.commit.required.acks", str(cfg.commit_required_acks),
                    STATIC_BROKER_CONFIG, INT,
                    "Redis replicas that must have an offset commit before it is answered."),
        ConfigEntry("offsets.commit.timeout.ms", str(cfg.commit_ack_timeout_ms),
                    STATIC_BROKER_CONFIG, INT,
                    "How long an offset commit waits for those replicas."),
    ]


def _config(e: ConfigEntry, synonyms: bool, documentation: bool) -> dict[str, Any]:
    return {
        "name": e.name, "value": e.value, "read_only": e.read_only, "config_source": e.source,
        "is_sensitive": False, "config_type": e.config_type,
        "synonyms": [{"name": e.name, "value": e.value, "source": e.source}] if synonyms else [],
        "documentation": e.documentation if documentation else None,
    }


def _result(kind: int, name: str, code: int, message: str | None = None,
            configs: Iterable[dict[str, Any]] = ()) -> dict[str, Any]:
    return {"error_code": code, "error_message": message, "resource_type": kind,
            "resource_name": name, "configs": list(configs)}


async def _describe(conn: Connection, res: Any, synonyms: bool, documentation: bool
                    ) -> dict[str, Any]:
    kind, name = int(res.resource_type), res.resource_name
    if kind == TOPIC:
        if not conn.may(Operation.DESCRIBE_CONFIGS, ResourceType.TOPIC, name):
            return _result(kind, name, TOPIC_AUTHORIZATION_FAILED, "Authorization failed.")
        try:
            entries = await conn.state.blocking(topic_configs, conn.state, name)
        except TopicError as exc:
            return _result(kind, name, exc.error, str(exc))
    elif kind == BROKER:
        if not conn.may(Operation.DESCRIBE_CONFIGS, ResourceType.CLUSTER):
            return _result(kind, name, CLUSTER_AUTHORIZATION_FAILED, "Authorization failed.")
        if name not in ("", str(NODE_ID)):
            return _result(kind, name, Errors.INVALID_REQUEST,
                           f"unexpected broker id {name!r}: this gateway is broker {NODE_ID}")
        entries = broker_configs(conn.state) if name else []
    else:
        return _result(kind, name, Errors.INVALID_REQUEST,
                       f"resource type {kind} is not served: only topics ({TOPIC}) and the "
                       f"broker ({BROKER})")
    keys = res.configuration_keys
    if keys is not None and len(keys) > 0:
        wanted = set(keys)
        entries = [e for e in entries if e.name in wanted]
    return _result(kind, name, Errors.NONE, None,
                   (_config(e, synonyms, documentation) for e in entries))


@api(32, "DescribeConfigs", 1, 4)
async def describe_configs(conn: Connection, req: Any, version: int) -> dict[str, Any]:
    synonyms = bool(getattr(req, "include_synonyms", False))
    documentation = bool(getattr(req, "include_documentation", False))
    return {"throttle_time": 0, "results": [
        await _describe(conn, r, synonyms, documentation) for r in req.resources]}
