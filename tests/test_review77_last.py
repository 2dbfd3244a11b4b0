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
