"""Kafka's ACLs on the gateway: who may do what to which group, topic or the cluster.

The model is Kafka's (``StandardAuthorizer``), so a rule written for a Kafka cluster means the
same here. A rule (an ACL) names a principal (``User:alice``, or ``User:*`` for everyone), a
resource type (``topic``, ``group``, ``cluster``), a resource name with a pattern type
(``literal``: that name, or ``*`` for every name; ``prefixed``: every name starting with it),
operations, a permission (``allow`` or ``deny``) and a client host (``*``: any; else one IP
address, compared as an address: ``0:0:0:0:0:0:0:1``, as Kafka prints ``::1``, is ``::1``).

Deciding one action (``Authorizer.authorize``):

* a super user may do anything;
* any matching ``deny`` rule denies, whatever allows it (deny wins);
* else any matching ``allow`` rule allows;
* else the action is denied (Kafka's default, ``allow.everyone.if.no.acl.found=false``).

``ALL`` matches every operation. An ``allow`` of READ, WRITE, DELETE or ALTER also allows
DESCRIBE (and ALTER_CONFIGS allows DESCRIBE_CONFIGS), as in Kafka; a ``deny`` of READ does not
deny DESCRIBE. ``Authorizer.authorize_any`` is Kafka's ``authorizeByResourceType`` (may the
principal do ``op`` on *some* resource of a type?), which InitProducerId uses.

Which request needs which operation is decided in the handlers (``api_*``), following Kafka's
``KafkaApis``; docs/gateway.md has the table.
"""

from __future__ import annotations

import enum
import functools
import ipaddress
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CLUSTER_NAME",
    "KAFKA_CODES",
    "Acl",
    "Authorizer",
    "Operation",
    "ResourceType",
    "operations_bitfield",
    "parse_acls",
    "supported_operations",
]

log = logging.getLogger("rcoord.gateway.authorizer")

CLUSTER_NAME = "kafka-cluster"
"""The name of the one cluster resource, as in Kafka."""
WILDCARD = "*"
EVERY_USER = "User:*"


def _address(host: str) -> str | None:
    """``host`` as an IP address in one spelling (None: it is not an address).

    Kafka compares a rule's host with ``InetAddress.getHostAddress()`` of the client, so the
    same address must match however it is written: Java prints ``::1`` as
    ``0:0:0:0:0:0:0:1``, Python as ``::1``. Java also sees a client on an IPv4-mapped IPv6
    address (``::ffff:1.2.3.4``, a dual-stack socket) as the IPv4 address, so that is what
    it is compared as here."""
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        addr = addr.ipv4_mapped
    return str(addr)


@functools.lru_cache(maxsize=4096)
def canonical_host(host: str) -> str:
    """A client host as rules are compared with it: ``_address``'s spelling of an IP address,
    anything else unchanged. Cached: every decision of a connection asks for the same host."""
    return _address(host) or host


class Operation(enum.Enum):
    ALL = "ALL"
    READ = "READ"
    WRITE = "WRITE"
    CREATE = "CREATE"
    DELETE = "DELETE"
    ALTER = "ALTER"
    DESCRIBE = "DESCRIBE"
    CLUSTER_ACTION = "CLUSTER_ACTION"
    DESCRIBE_CONFIGS = "DESCRIBE_CONFIGS"
    ALTER_CONFIGS = "ALTER_CONFIGS"
    IDEMPOTENT_WRITE = "IDEMPOTENT_WRITE"


class ResourceType(enum.Enum):
    TOPIC = "topic"
    GROUP = "group"
    CLUSTER = "cluster"


class PatternType(enum.Enum):
    LITERAL = "literal"
    PREFIXED = "prefixed"


_OPS_FOR = {
    ResourceType.TOPIC: frozenset({
        Operation.ALL, Operation.READ, Operation.WRITE, Operation.CREATE, Operation.DELETE,
        Operation.ALTER, Operation.DESCRIBE, Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS}),
    ResourceType.GROUP: frozenset({
        Operation.ALL, Operation.READ, Operation.DESCRIBE, Operation.DELETE}),
    ResourceType.CLUSTER: frozenset({
        Operation.ALL, Operation.CREATE, Operation.CLUSTER_ACTION, Operation.DESCRIBE_CONFIGS,
        Operation.ALTER_CONFIGS, Operation.IDEMPOTENT_WRITE, Operation.ALTER,
        Operation.DESCRIBE}),
}
"""The operations Kafka defines on each resource type (its ``AclCommand`` refuses others)."""

KAFKA_CODES = {
    Operation.ALL: 2, Operation.READ: 3, Operation.WRITE: 4, Operation.CREATE: 5,
    Operation.DELETE: 6, Operation.ALTER: 7, Operation.DESCRIBE: 8, Operation.CLUSTER_ACTION: 9,
    Operation.DESCRIBE_CONFIGS: 10, Operation.ALTER_CONFIGS: 11, Operation.IDEMPOTENT_WRITE: 12,
}
"""Kafka's ``AclOperation`` codes, the bits of an ``authorized_operations`` field."""


def supported_operations(resource: ResourceType) -> frozenset[Operation]:
    """The operations an ``authorized_operations`` field reports on (Kafka's
    ``AclEntry.supportedOperations``): those defined on the type, without ALL. A group has
    READ, DESCRIBE and DELETE (Kafka 4.0 adds DESCRIBE_CONFIGS and ALTER_CONFIGS, for group
    configs, which this gateway does not serve)."""
    return _OPS_FOR[resource] - {Operation.ALL}


def operations_bitfield(ops: Iterable[Operation]) -> int:
    """Kafka's ``Utils.to32BitField`` of the operations' codes."""
    out = 0
    for op in ops:
        out |= 1 << KAFKA_CODES[op]
    return out


_IMPLIES_DESCRIBE = frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE,
                               Operation.DELETE, Operation.ALTER})
_IMPLIES_DESCRIBE_CONFIGS = frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS})


@dataclass(frozen=True)
class Acl:
    """One rule; see the module docstring."""

    principal: str
    resource: ResourceType
    name: str
    pattern: PatternType
    operation: Operation
    allow: bool
    host: str = WILDCARD

    def matches_resource(self, resource: ResourceType, name: str) -> bool:
        if resource is not self.resource:
            return False
        if self.pattern is PatternType.PREFIXED:
            return name.startswith(self.name)
        return self.name == WILDCARD or self.name == name

    def grants(self, op: Operation) -> bool:
        """Does this rule speak about ``op`` (with Kafka's implied DESCRIBE for allows)?"""
        if self.operation is Operation.ALL or self.operation is op:
            return True
        if not self.allow:
            return False
        if op is Operation.DESCRIBE:
            return self.operation in _IMPLIES_DESCRIBE
        if op is Operation.DESCRIBE_CONFIGS:
            return self.operation in _IMPLIES_DESCRIBE_CONFIGS
        return False

    def applies_to(self, principal: str, host: str) -> bool:
        return (self.principal in (principal, EVERY_USER)
                and self.host in (WILDCARD, canonical_host(host)))


class _Rules:
    """The rules of one principal on one resource type, filed by how their name matches, so a
    decision reads only the rules that can match its name: Kafka's ``StandardAuthorizer``
    likewise finds them in its sorted ``aclsByResource`` instead of scanning every ACL."""

    def __init__(self) -> None:
        self.every_name: list[Acl] = []
        self.literal: dict[str, list[Acl]] = {}
        self.prefixed: dict[str, list[Acl]] = {}
        self.prefix_lengths: list[int] = []
        """The lengths of the prefixes in ``prefixed``, ascending: a name looks up its own
        prefixes of those lengths, one dict lookup each."""

    def add(self, acl: Acl) -> None:
        if acl.pattern is PatternType.PREFIXED:
            self.prefixed.setdefault(acl.name, []).append(acl)
            self.prefix_lengths = sorted({*self.prefix_lengths, len(acl.name)})
        elif acl.name == WILDCARD:
            self.every_name.append(acl)
        else:
            self.literal.setdefault(acl.name, []).append(acl)

    def matching(self, name: str) -> Iterator[Acl]:
        """The rules whose resource pattern matches ``name`` (``Acl.matches_resource``)."""
        yield from self.every_name
        yield from self.literal.get(name, ())
        for length in self.prefix_lengths:
            if length > len(name):
                break
            yield from self.prefixed.get(name[:length], ())


class Authorizer:
    """Decides actions by the rules (see the module docstring); holds no other state."""

    def __init__(self, acls: Iterable[Acl], super_users: Iterable[str] = ()) -> None:
        self.acls = tuple(acls)
        self.super_users = frozenset(super_users)
        self._rules: dict[tuple[ResourceType, str], _Rules] = {}
        for acl in self.acls:
            self._rules.setdefault((acl.resource, acl.principal), _Rules()).add(acl)

    def _matching(self, principal: str, resource: ResourceType, name: str) -> Iterator[Acl]:
        """The rules of ``principal`` and of ``User:*`` whose pattern matches the resource."""
        for who in dict.fromkeys((principal, EVERY_USER)):
            rules = self._rules.get((resource, who))
            if rules is not None:
                yield from rules.matching(name)

    def authorize(self, principal: str, host: str, op: Operation, resource: ResourceType,
                  name: str, *, log_denied: bool = True) -> bool:
        """May ``principal`` (from ``host``) do ``op`` on the resource ``name``?"""
        if principal in self.super_users:
            return True
        client = canonical_host(host)
        allowed = False
        for acl in self._matching(principal, resource, name):
            if acl.host not in (WILDCARD, client) or not acl.grants(op):
                continue
            if not acl.allow:
                allowed = False
                break  # deny wins
            allowed = True
        if not allowed and log_denied:
            log.info("Principal = %s is Denied operation = %s from host = %s on resource = "
                     "%s:%s", principal, op.value, host, resource.value, name)
        return allowed

    def authorize_any(self, principal: str, host: str, op: Operation,
                      resource: ResourceType) -> bool:
        """May ``principal`` do ``op`` on at least one resource of this type? Kafka's
        ``authorizeByResourceType``: an allow counts unless a deny covers all it allows (a
        literal ``*`` deny, the same literal name, or a prefix of the allowed name)."""
        if principal in self.super_users:
            return True
        deny_literal: set[str] = set()
        deny_prefix: set[str] = set()
        allows: list[Acl] = []
        for acl in self.acls:  # (once per InitProducerId: not worth an index)
            if acl.resource is not resource or not acl.applies_to(principal, host):
                continue
            if acl.operation is not op and acl.operation is not Operation.ALL:
                continue
            if not acl.allow:
                if acl.pattern is PatternType.LITERAL and acl.name == WILDCARD:
                    return False
                (deny_literal if acl.pattern is PatternType.LITERAL else deny_prefix).add(
                    acl.name)
            else:
                allows.append(acl)
        for acl in allows:
            if acl.pattern is PatternType.LITERAL and acl.name == WILDCARD:
                return True
        for acl in allows:
            if acl.pattern is PatternType.LITERAL and acl.name in deny_literal:
                continue
            if any(acl.name.startswith(p) for p in deny_prefix):
                continue
            return True
        return False


def _choice(entry: Mapping[str, Any], field: str, enum_cls: Any, default: str | None,
            where: str) -> Any:
    value = entry.get(field, default)
    if not isinstance(value, str):
        raise ValueError(f"{where}: {field!r} is required")  # noqa: TRY004 (a bad file)
    try:
        return enum_cls(value.lower() if enum_cls is not Operation else value.upper())
    except ValueError:
        allowed = ", ".join(m.value for m in enum_cls)
        raise ValueError(f"{where}: {field} {value!r} is not one of {allowed}") from None


def parse_acls(entries: Any, where: str = "acls") -> list[Acl]:
    """The ``acls`` list of the auth file as rules; ValueError (for any malformed file, as
    ``load_auth_file`` reports it) naming the bad entry and field.

    Each entry: ``{"principal": "User:alice", "resource": "topic"|"group"|"cluster",
    "name": "orders" | "*", "pattern": "literal"|"prefixed", "operations": ["READ", ...],
    "permission": "allow"|"deny", "host": "*"}``; ``pattern`` defaults to literal,
    ``permission`` to allow, ``host`` to ``*``, a cluster's ``name`` to ``kafka-cluster``.
    """
    if not isinstance(entries, list):
        raise ValueError(f"{where} must be a list of rules")  # noqa: TRY004 (a bad file)
    out: list[Acl] = []
    for i, entry in enumerate(entries):
        at = f"{where}[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{at} must be an object")  # noqa: TRY004 (a bad file)
        unknown = set(entry) - {"principal", "resource", "name", "pattern", "operations",
                                "permission", "host"}
        if unknown:
            raise ValueError(f"{at}: unknown field(s) {', '.join(sorted(unknown))}")
        principal = entry.get("principal")
        if not isinstance(principal, str) or not principal.startswith("User:") or \
                len(principal) == len("User:"):
            raise ValueError(f"{at}: principal must be 'User:<name>' or 'User:*', "
                             f"got {principal!r}")
        resource = _choice(entry, "resource", ResourceType, None, at)
        pattern = _choice(entry, "pattern", PatternType, "literal", at)
        default_name = CLUSTER_NAME if resource is ResourceType.CLUSTER else None
        name = entry.get("name", default_name)
        if not isinstance(name, str) or not name:
            raise ValueError(f"{at}: name must be a non-empty string ('*' for every name)")
        if pattern is PatternType.PREFIXED and name == WILDCARD:
            raise ValueError(f"{at}: a prefixed pattern cannot be '*' (use literal '*')")
        if resource is ResourceType.CLUSTER and name not in (CLUSTER_NAME, WILDCARD):
            raise ValueError(f"{at}: the cluster resource is named {CLUSTER_NAME!r}")
        permission = entry.get("permission", "allow")
        if permission not in ("allow", "deny"):
            raise ValueError(f"{at}: permission must be 'allow' or 'deny', got {permission!r}")
        host = entry.get("host", WILDCARD)
        if host != WILDCARD:
            # Kafka's AclEntry holds a literal client address or "*": no names, no ranges.
            address = _address(host) if isinstance(host, str) else None
            if address is None:
                raise ValueError(f"{at}: host must be an IP address or '*', got {host!r} "
                                 "(host names and CIDR ranges never match a client)")
            host = address
        ops = entry.get("operations")
        if not isinstance(ops, list) or not ops:
            raise ValueError(f"{at}: operations must be a non-empty list, e.g. [\"READ\"]")
        for op_name in ops:
            op = _choice({"op": op_name}, "op", Operation, None, f"{at} operations")
            if op not in _OPS_FOR[resource]:
                valid = ", ".join(sorted(o.value for o in _OPS_FOR[resource]))
                raise ValueError(f"{at}: {op.value} is not an operation on a {resource.value} "
                                 f"(valid: {valid})")
            out.append(Acl(principal, resource, name, pattern, op, permission == "allow", host))
    return out
