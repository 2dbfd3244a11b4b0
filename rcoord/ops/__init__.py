"""The operator's command line: ``rcoord groups`` and ``rcoord topics``.

Kafka's ``kafka-consumer-groups.sh`` and ``kafka-topics.sh`` (with the console producer and
consumer folded into ``topics produce`` / ``topics consume``), over the same admin API a program
uses (``GroupCoordinator``, ``rcoord.topics``). One module per command family:

* ``common``: the options every command takes, connecting, and errors at the edge;
* ``output``: tables and JSON;
* ``groups``: list, describe, delete, delete-offsets, reset-offsets (its plan in ``reset``);
* ``topics``: create, list, describe, delete, add-partitions (produce and consume in
  ``console``).
"""
