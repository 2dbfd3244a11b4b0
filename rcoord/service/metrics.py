"""Prometheus metrics of a coordinator process (its own registry, so tests can run several)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics"]

_LATENESS_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
_REBALANCE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class Metrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.groups = Gauge("rcoord_groups", "Groups in the partitions this process leases, by state",
                            ["state"], registry=r)
        self.members = Gauge("rcoord_members", "Members of the groups in leased partitions", registry=r)
        self.rebalances_started = Counter("rcoord_rebalances_started", "Rebalances started", registry=r)
        self.rebalances_completed = Counter("rcoord_rebalances_completed",
                                            "Rebalances that reached Stable or Empty", registry=r)
        self.rebalance_duration = Histogram("rcoord_rebalance_duration_seconds",
                                            "From PreparingRebalance to Stable (or Empty)",
                                            buckets=_REBALANCE_BUCKETS, registry=r)
        self.members_expired = Counter("rcoord_members_expired", "Members removed by session expiry",
                                       registry=r)
        self.lateness = Histogram("rcoord_deadline_lateness_seconds",
                                  "How long after its deadline each timer acted (sweeps of this process)",
                                  buckets=_LATENESS_BUCKETS, registry=r)
        self.leases = Gauge("rcoord_leases_held", "Partition leases held by this process", registry=r)
        self.wakeups = Counter("rcoord_wakeups", "Why the timer loop woke up", ["source"], registry=r)
        self.hints = Counter("rcoord_expiry_hints",
                             "Expired-key hints: 'hit' if the hint applied a deadline first, else 'miss'",
                             ["result"], registry=r)
        self.deadlines_applied = Counter("rcoord_deadlines_applied",
                                         "Deadlines applied by this process", ["source"], registry=r)
        self.transitions = Counter("rcoord_group_transitions", "Group state transitions seen",
                                   ["to"], registry=r)
        self.retention_passes = Counter(
            "rcoord_retention_passes",
            "Topic retention passes of this process: 'failed' if the topics could not be listed, "
            "a topic's retention failed, or the process's leases were not confirmed (tried again "
            "next pass); a pass a stop cut short is not counted ok", ["result"], registry=r)
        self.retention_topics = Counter(
            "rcoord_retention_topics_applied",
            "Topics (on this process's leases, with a retention setting) whose retention this "
            "process applied", registry=r)
        self.retention_errors = Counter(
            "rcoord_retention_topic_errors",
            "Topics whose retention this process could not apply in a pass", registry=r)
