"""Review of the last session's commits (1cdfa16..b222add): reproductions of what they left."""

from __future__ import annotations

import pytest
from test_cli_errors import one_error_line, rcoord

from rcoord import TopicPartition
from rcoord.client import InvalidAssignmentError
from rcoord.client.join import check_assignment
from rcoord.protocol.consumer import ConsumerProtocolSubscription

# 37889c1 named a plan's member ids "whatever their type" (a plan whose ids were not all str
# crashed with TypeError); a partition id of another type than int still does: the leader's
# check compares it with 0 and ends the round with "'<=' not supported between instances of
# 'int' and 'str'", naming neither the assignor, the member nor the partition, where the plan's
# other faults are InvalidAssignmentError naming all three.


@pytest.mark.parametrize("partition", ["0", None, 1.5])
def test_a_plan_with_a_partition_id_that_is_no_int_is_named_as_any_bad_plan(partition):
    subs = {"m1": ConsumerProtocolSubscription(["t"])}
    with pytest.raises(InvalidAssignmentError) as caught:
        check_assignment({"m1": [TopicPartition("t", partition)]}, subs, {"t": 2}, "custom", "g")
    assert "'custom'" in str(caught.value) and "'m1'" in str(caught.value)


# ebdf9f2 made the demo's whole-number flags digits only (--records 1_0 ran with 10), but its two
# flags of seconds still read float(): --time-limit 1_0 runs with 10 s and " 3" with 3 s, where
# the same words are refused for --records (test_cli_errors.test_the_demo_numbers_are_digits_only).


@pytest.mark.parametrize("number", ["1_0", " 3"])
@pytest.mark.parametrize("flag", ["--time-limit", "--produce-seconds"])
def test_the_demo_seconds_take_the_same_words_as_its_numbers(flag, number):
    res = rcoord("demo", flag, number, env={"RCOORD_REDIS_URL": "redis://127.0.0.1:1"})
    assert res.returncode == 2, (res.returncode, res.stderr)
    line = one_error_line(res, "demo")
    assert flag in line and repr(number) in line, line


# dfca8db answered the review's "word_count on a topic that does not exist waits for ever without
# a word" (3e2df01) with a warning logged by the leader alone, for every member's topics. A
# member that is not the leader (a second worker started with a --topic typo beside a running
# one, the usual way to make one) still prints "assigned []" and says nothing more: the warning
# is in the other worker's log. Kafka's consumer logs its own subscription's missing topics at
# each metadata refresh, whichever member leads.


def test_a_follower_on_a_topic_that_does_not_exist_says_so(redis_server, single_client,
                                                          namespace) -> None:
    import subprocess
    import sys
    from contextlib import ExitStack
    from pathlib import Path

    from harness import output_lines, wait_until, without_join_delay

    from rcoord.topics import Topics

    root = Path(__file__).resolve().parent.parent
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("RCOORD_")}
    env["PYTHONPATH"] = str(root)
    without_join_delay(single_client, namespace)
    Topics(single_client, namespace).create("lines", 1)

    def worker(stack: ExitStack, topic: str) -> list[str]:
        proc = stack.enter_context(subprocess.Popen(
            [sys.executable, str(root / "workers" / "word_count.py"), "--redis-url",
             redis_server.url, "--namespace", namespace, "--topic", topic, "--group", "g77"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        return stack.enter_context(output_lines(proc))

    with ExitStack() as stack:
        leader = worker(stack, "lines")
        wait_until(lambda: any("assigned [0]" in line for line in leader),
                   timeout_s=60, why=lambda: "".join(leader))
        follower = worker(stack, "nosuch")
        wait_until(lambda: any("assigned []" in line for line in follower), timeout_s=60,
                   why=lambda: "".join(follower))
        # The leader has said it by now (at the assignment that gave the follower nothing).
        wait_until(lambda: any("nosuch" in line for line in leader), timeout_s=30,
                   why=lambda: "the leader did not name it either:\n" + "".join(leader))
        wait_until(lambda: any("nosuch" in line for line in follower), timeout_s=30,
                   why=lambda: "no line of the follower names its missing topic:\n"
                   + "".join(follower))
