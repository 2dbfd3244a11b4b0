"""The runnable examples in workers/ keep working (they double as documentation)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from harness import without_join_delay

from rcoord.topics import Producer, Topics

ROOT = Path(__file__).resolve().parent.parent


def test_word_count_worker_counts_every_record(redis_server, single_client, namespace):
    without_join_delay(single_client, namespace)
    Topics(single_client, namespace).create("lines", 3)
    producer = Producer(single_client, namespace)
    for i in range(30):
        producer.send("lines", b"alpha beta alpha", key=str(i).encode())
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    res = subprocess.run(
        [sys.executable, str(ROOT / "workers" / "word_count.py"), "--redis-url", redis_server.url,
         "--topic", "lines", "--namespace", namespace, "--max-records", "30"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "records 30; top words [('alpha', 60), ('beta', 30)]" in res.stdout
    assert "assigned [0, 1, 2]" in res.stdout
