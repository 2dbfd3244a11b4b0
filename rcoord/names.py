"""What a namespace may be called: the prefix of every Redis key of one rcoord deployment.

Every party that names keys checks it the same way (the coordinator's and the worker's
configuration, the topics API, the Spark options). Braces are out above all: ``{...}`` is a hash
tag in Redis Cluster, and a namespace holding one would move a partition's keys into different
slots, so its scripts would fail with CROSSSLOT. A colon is in: so a key that ends in a name a
user chooses (a group id) must have a brace before it, else it may be another namespace's key
(``rcoord.keys``: the Spark replay records).
"""

from __future__ import annotations

import re

__all__ = ["NAMESPACE_RULE", "valid_namespace"]

_NAMESPACE_RE = re.compile(r"[A-Za-z0-9._:-]{1,64}")
NAMESPACE_RULE = "1-64 characters of [A-Za-z0-9._:-] (no braces)"
"""The rule in words, for error messages."""


def valid_namespace(namespace: object) -> bool:
    """Whether ``namespace`` is a string that follows ``NAMESPACE_RULE``."""
    return isinstance(namespace, str) and _NAMESPACE_RE.fullmatch(namespace) is not None
