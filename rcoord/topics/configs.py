"""A topic's configs, declared once: what each is called in Kafka and in rcoord, its bounds and
its default.

``Topics.create`` and ``Topics.alter_configs`` take the settings by their Python names (the
fields of the metadata hash); the gateway (CreateTopics, DescribeConfigs, AlterConfigs,
IncrementalAlterConfigs) and the CLI take Kafka's names and text values. Both go through this
table, so a setting added here is checked, stored and described the same way everywhere.

Besides the settings, two facts hold for every rcoord topic and are described as configs, as
Kafka describes them: ``cleanup.policy=delete`` (retention deletes the oldest records; nothing
is ever compacted) and ``message.timestamp.type=LogAppendTime`` (records are stamped with the
Redis clock on append). Setting one to the value it has is accepted and changes nothing (tools
that apply a whole config file do that); any other value is INVALID_CONFIG.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import Errors
from ._base import PRODUCER_ID_EXPIRATION_MS, TopicError

__all__ = [
    "APPEND",
    "DELETE",
    "FIXED",
    "MAX_CONFIG",
    "OP_NAMES",
    "SET",
    "SETTINGS",
    "SUBTRACT",
    "FixedConfig",
    "TopicSetting",
    "check_fixed",
    "check_settings",
    "parse_setting",
    "setting_named",
    "settings_change",
    "topic_configs",
]

MAX_CONFIG = 2**63 - 1
"""The largest count or duration a topic setting takes (Kafka's configs are Java longs).
Up to it the retention script takes the count (once given to ``XTRIM MAXLEN``, which refused a
larger one and so failed every ``apply_retention``), and the scripts' doubles compare ages and
counts that large correctly."""

UNLIMITED = -1
"""Kafka's "no limit" (``retention.ms=-1``): taken as the setting left out, which means no
limit here too."""

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
"""Kafka's ``AlterConfigOp.OpType`` ids: the operations of IncrementalAlterConfigs."""
OP_NAMES = {SET: "SET", DELETE: "DELETE", APPEND: "APPEND", SUBTRACT: "SUBTRACT"}

_LONG = re.compile(r"[+-]?[0-9]+")


@dataclass(frozen=True)
class TopicSetting:
    kafka_name: str
    field: str
    """The keyword of ``Topics.create`` / ``alter_configs`` and the metadata hash's field."""
    minimum: int
    default: int
    """What applies while the setting is not given (``UNLIMITED``: no limit)."""
    unlimited: bool
    """Whether ``UNLIMITED`` is a value Kafka's tools give (then it means "not set")."""
    documentation: str


@dataclass(frozen=True)
class FixedConfig:
    kafka_name: str
    value: str
    is_list: bool
    documentation: str
    why: str
    """Why no other value is taken: the message of the INVALID_CONFIG refusing one."""


SETTINGS: tuple[TopicSetting, ...] = (
    TopicSetting("producer.id.expiration.ms", "producer_id_expiration_ms", 1,
                 PRODUCER_ID_EXPIRATION_MS, False,
                 "How long an idempotent producer's state outlives its last append."),
    TopicSetting("retention.ms", "retention_ms", 0, UNLIMITED, True,
                 "Records older than this are deleted by retention; -1: no limit."),
    TopicSetting("retention.records", "retention_records", 0, UNLIMITED, True,
                 "rcoord's own: retention keeps this many newest records; -1: no limit."),
)

FIXED: tuple[FixedConfig, ...] = (
    FixedConfig("cleanup.policy", "delete", True,
                "rcoord deletes the oldest records by retention; it never compacts.",
                "rcoord topics are never compacted: cleanup.policy is always delete"),
    FixedConfig("message.timestamp.type", "LogAppendTime", False,
                "Records are stamped with the Redis clock when appended.",
                "rcoord stamps every record with the Redis clock on append: "
                "message.timestamp.type is always LogAppendTime"),
)

_BY_FIELD = {s.field: s for s in SETTINGS}
_BY_NAME: dict[str, TopicSetting | FixedConfig] = {
    **{s.kafka_name: s for s in SETTINGS}, **{f.kafka_name: f for f in FIXED}}


def topic_configs(settings: Mapping[str, int | None]) -> list[tuple[FixedConfig | TopicSetting,
                                                                   str, bool]]:
    """A topic's configs sorted by Kafka name, from its settings (a field -> its value, None or
    absent: not given): (the config, its value as Kafka's tools show it, whether it was given
    rather than the default)."""
    out: list[tuple[FixedConfig | TopicSetting, str, bool]] = [(f, f.value, False) for f in FIXED]
    for s in SETTINGS:
        value = settings.get(s.field)
        out.append((s, str(s.default if value is None else value), value is not None))
    return sorted(out, key=lambda c: c[0].kafka_name)


def setting_named(kafka_name: str) -> TopicSetting | FixedConfig:
    """The config of that Kafka name; INVALID_CONFIG naming those there are if none."""
    found = _BY_NAME.get(kafka_name)
    if found is None:
        raise TopicError(Errors.INVALID_CONFIG,
                         f"Unknown topic config name: {kafka_name} (rcoord topics have: "
                         f"{', '.join(sorted(_BY_NAME))})")
    return found


def check_settings(settings: Mapping[str, Any]) -> None:
    """INVALID_CONFIG unless each key is a setting's Python name and its value None (not given:
    the default) or an int within the setting's bounds; checks only, before anything is
    written."""
    for field, value in settings.items():
        s = _BY_FIELD.get(field)
        if s is None:
            raise TopicError(Errors.INVALID_CONFIG,
                             f"unknown topic setting {field!r}; there are: "
                             f"{', '.join(sorted(_BY_FIELD))}")
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or not s.minimum <= value <= MAX_CONFIG):
            raise TopicError(Errors.INVALID_CONFIG,
                             f"{field} must be an int from {s.minimum} to {MAX_CONFIG}: "
                             f"{value!r}")


def parse_setting(setting: TopicSetting, text: str) -> int | None:
    """A Kafka config value (text) as the setting's value: None for Kafka's -1 where it means
    no limit; INVALID_CONFIG, in words that say what is taken, for anything else out of
    bounds."""
    low = UNLIMITED if setting.unlimited else setting.minimum
    value = int(text) if _LONG.fullmatch(text.strip()) else None
    if value is None or not low <= value <= MAX_CONFIG:
        also = f" ({UNLIMITED}: no limit)" if setting.unlimited else ""
        raise TopicError(Errors.INVALID_CONFIG,
                         f"Invalid value {text} for configuration {setting.kafka_name}: "
                         f"it must be an integer from {low} to {MAX_CONFIG}{also}")
    return None if setting.unlimited and value == UNLIMITED else value


def check_fixed(config: FixedConfig, value: str) -> None:
    """INVALID_CONFIG unless ``value`` is the one ``config`` always has."""
    parts = [p.strip() for p in value.split(",")] if config.is_list else [value.strip()]
    if parts != [config.value]:
        raise TopicError(Errors.INVALID_CONFIG, f"{config.why} (got {value!r})")


def settings_change(ops: Sequence[tuple[str, int, str]]) -> dict[str, int | None]:
    """Kafka config operations ``(name, op, value)`` on a topic as the settings change
    ``Topics.alter_configs`` takes (a field -> its value, or None for its default);
    TopicError INVALID_CONFIG for an unknown config (a DELETE of one is nothing to do, as in
    Kafka), a value out of bounds, APPEND or SUBTRACT to a config that is not a list, or a fixed
    config given another value."""
    changes: dict[str, int | None] = {}
    for name, op, value in ops:
        if op not in OP_NAMES:
            raise TopicError(Errors.INVALID_REQUEST, f"Unknown operations type {op}")
        if op == DELETE and name not in _BY_NAME:
            # Kafka's controller drops a deleted name before it validates the rest and records
            # nothing for a config that stays unset, so a tool bringing a topic to a wanted set
            # (`kafka-configs --delete-config`) succeeds; INVALID_CONFIG here lost the request's
            # other changes of the topic with it.
            continue
        found = setting_named(name)
        if op in (APPEND, SUBTRACT) and not (isinstance(found, FixedConfig) and found.is_list):
            raise TopicError(Errors.INVALID_CONFIG, f"Can't {OP_NAMES[op]} to key {name} "
                             "because its type is not LIST.")
        if isinstance(found, FixedConfig):
            if op == SET:
                check_fixed(found, value)
            elif op in (APPEND, SUBTRACT):  # on the one value the list has
                parts = [found.value]
                for part in value.split(","):
                    if op == APPEND and part not in parts:
                        parts.append(part)
                    elif op == SUBTRACT and part in parts:
                        parts.remove(part)
                check_fixed(found, ",".join(parts))
            # (DELETE: its default is the value it has)
        else:
            changes[found.field] = None if op == DELETE else parse_setting(found, value)
    return changes
