"""CoordinatorConfig: the deployment settings of one rcoord namespace, with Kafka's defaults.

The group limits are broker settings in Kafka, so every party of a namespace must enforce the
same ones. They are stored in Redis: a namespace-wide hash for Python (``<ns>:settings``) and a
copy in each coordinator partition (``<ns>:{tag}:cfg``) that the scripts read, because a script
may only touch keys of its own slot. A config passed to ``GroupCoordinator`` writes the settings
it *names* (the fields given to the constructor; a ``dataclasses.replace`` copy names those the
original named and those it changed); settings it does not name come from Redis, or from the
defaults below when Redis has none.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from .errors import ConfigError
from .names import NAMESPACE_RULE, valid_namespace

__all__ = ["STORED_SETTINGS", "CoordinatorConfig"]



@dataclass(frozen=True)
class CoordinatorConfig:
    """Settings of a namespace. Defaults are Kafka's broker defaults.

    Attributes:
        group_min_session_timeout_ms: smallest session timeout a member may ask for
            (``group.min.session.timeout.ms``).
        group_max_session_timeout_ms: largest session timeout (``group.max.session.timeout.ms``).
        group_max_size: most members a group may have (``group.max.size``).
        group_initial_rebalance_delay_ms: how long the first rebalance of an empty group waits
            for more members, extended per arrival up to the rebalance timeout
            (``group.initial.rebalance.delay.ms``).
        num_partitions: coordinator partitions (``offsets.topic.num.partitions``); fixed once the
            namespace holds groups.
        new_member_join_timeout_ms: how long a new member's parked JoinGroup may wait before the
            member is dropped (Kafka's ``GroupCoordinator.NewMemberJoinTimeoutMs``).
        offsets_retention_ms: how long offsets are kept after a group became Empty
            (``offsets.retention.minutes``).
        offset_metadata_max_bytes: largest commit metadata string (``offset.metadata.max.bytes``).
        offsets_retention_check_interval_ms: how long an Empty group with no offsets lingers
            before it is removed; Kafka removes it at its next periodic clean-up
            (``offsets.retention.check.interval.ms``). Offsets themselves expire exactly on time.
        namespace: key prefix, so several deployments can share one Redis.
    """

    group_min_session_timeout_ms: int = 6000
    group_max_session_timeout_ms: int = 1_800_000
    group_max_size: int = 2**31 - 1
    group_initial_rebalance_delay_ms: int = 3000
    num_partitions: int = 50
    new_member_join_timeout_ms: int = 300_000
    offsets_retention_ms: int = 604_800_000
    offset_metadata_max_bytes: int = 4096
    offsets_retention_check_interval_ms: int = 600_000
    namespace: str = "rcoord"
    _named: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def __post_init__(self) -> None:
        self.validate()

    @property
    def named(self) -> frozenset[str]:
        """The settings this config was constructed with explicitly."""
        return self._named

    def validate(self) -> None:
        """Check every invariant; the message names the field to fix."""
        for name in _INT_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{name} must be an int, got {value!r}")
        positive = (
            "group_min_session_timeout_ms",
            "group_max_session_timeout_ms",
            "group_max_size",
            "num_partitions",
            "new_member_join_timeout_ms",
            "offsets_retention_ms",
            "offsets_retention_check_interval_ms",
        )
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.group_initial_rebalance_delay_ms < 0:
            raise ConfigError("group_initial_rebalance_delay_ms must be >= 0")
        if self.offset_metadata_max_bytes < 0:
            raise ConfigError("offset_metadata_max_bytes must be >= 0")
        if self.group_min_session_timeout_ms > self.group_max_session_timeout_ms:
            raise ConfigError(
                "group_min_session_timeout_ms "
                f"({self.group_min_session_timeout_ms}) must not exceed "
                f"group_max_session_timeout_ms ({self.group_max_session_timeout_ms})"
            )
        for name, top, why in _UPPER_BOUNDS:
            if getattr(self, name) > top:
                raise ConfigError(f"{name} must be <= {top} ({why}), got {getattr(self, name)}")
        if self.num_partitions > 16384:
            raise ConfigError("num_partitions must be <= 16384 (one Redis Cluster slot each)")
        if not valid_namespace(self.namespace):
            raise ConfigError(f"namespace must be {NAMESPACE_RULE}, got {self.namespace!r}")

    def stored_values(self) -> dict[str, int]:
        """The settings kept in Redis, as field -> value."""
        return {name: getattr(self, name) for name in STORED_SETTINGS}

    def merged_with_stored(self, stored: Mapping[str, Any]) -> CoordinatorConfig:
        """This config's named settings over ``stored`` ones over the defaults. A stored value
        that is no integer (written by hand) is a ConfigError naming the setting; before, the
        error was int()'s alone ("invalid literal for int() with base 10: 'abc'")."""
        values: dict[str, Any] = {}
        for name in STORED_SETTINGS:
            if name in self._named:
                values[name] = getattr(self, name)
            elif name in stored:
                try:
                    values[name] = int(stored[name])
                except (TypeError, ValueError):
                    raise ConfigError(bad_stored_setting(self.namespace, name,
                                                         stored[name])) from None
        values["namespace"] = self.namespace
        merged = dataclasses.replace(CoordinatorConfig(), **values)
        object.__setattr__(merged, "_named", _Named(self._named, merged))
        return merged


def bad_stored_setting(namespace: str, name: str, value: Any) -> str:
    """What to fix when the stored setting ``name`` of ``namespace`` is ``value``, no integer
    (written by hand). Naming another setting writes it over the bad value; not the partition
    count: which layout the namespace's groups live in cannot be told from it, and changing the
    count must check that layout for groups and delete it (``rcoord.settings``), so it is to be
    corrected by hand to the count in use (the anchor copies ``<ns>:{...}:anchor`` name it)."""
    fix = (f"correct it in {namespace}:settings to the partition count in use (the anchor "
           f"copies {namespace}:{{...}}:anchor name it)" if name == "num_partitions"
           else f"correct it in {namespace}:settings (or start a coordinator naming it)")
    what = "a positive integer" if name == "num_partitions" else "an integer"
    return (f"the stored setting {name} of namespace {namespace!r} is {value!r}, not {what}: "
            f"{fix}")


_FIELDS = [f.name for f in dataclasses.fields(CoordinatorConfig) if not f.name.startswith("_")]
_INT_FIELDS = [n for n in _FIELDS if n != "namespace"]

_JAVA_INT = 2**31 - 1
_UPPER_BOUNDS = tuple(
    [(name, _JAVA_INT, "Kafka's setting is a Java int") for name in _INT_FIELDS
     if name not in ("offsets_retention_ms", "offsets_retention_check_interval_ms")]
    + [
        ("offsets_retention_ms", _JAVA_INT * 60_000,
         "Kafka's offsets.retention.minutes is a Java int"),
        # Kafka's is a long; the scripts add it to their clock, a double exact to 2**53, and a
        # deadline past the server's expire range failed the step after its first writes.
        ("offsets_retention_check_interval_ms", 2**52, "about 142,700 years"),
    ]
)
"""The largest value of each setting, with why. A larger one made the scripts' deadlines
fail (a commit with offsets_retention_ms = 2**63 - 1 raised a server error)."""
STORED_SETTINGS: tuple[str, ...] = tuple(_INT_FIELDS)
"""Settings stored per namespace in Redis (everything but the namespace itself)."""

_dataclass_init = CoordinatorConfig.__init__


class _Named(frozenset[str]):
    """The settings a config names, with the values the config held (``of``), so that
    ``dataclasses.replace``, which passes every field to the constructor again, names only the
    fields it changed: before, a replaced config named every setting, and starting a
    coordinator with ``replace(CoordinatorConfig(namespace=ns), group_max_size=9)`` wrote every
    default over the namespace's stored settings (its partition count too, if it held no
    group)."""

    values: dict[str, Any]

    def __new__(cls, names: frozenset[str] | set[str], of: CoordinatorConfig | None = None,
                values: Mapping[str, Any] | None = None) -> Self:
        named = super().__new__(cls, names)
        named.values = dict(values or {}) if of is None else {n: getattr(of, n) for n in _FIELDS}
        return named

    def __reduce__(self) -> tuple[Any, ...]:  # (pickle and copy: the values too)
        return (_Named, (frozenset(self), None, self.values))


def _recording_init(self: CoordinatorConfig, *args: Any, **kwargs: Any) -> None:
    named = set(_FIELDS[: len(args)]) | {k for k in kwargs if not k.startswith("_")}
    was = kwargs.pop("_named", None)
    _dataclass_init(self, *args, **kwargs)
    if isinstance(was, _Named):  # dataclasses.replace: the fields it changed, and those named
        named = set(was) | {name for name in _FIELDS
                            if getattr(self, name) != was.values.get(name, getattr(self, name))}
    object.__setattr__(self, "_named", _Named(named, self))


CoordinatorConfig.__init__ = _recording_init  # type: ignore[method-assign]
