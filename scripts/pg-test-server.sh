#!/usr/bin/env bash
# A throwaway PostgreSQL for the ledger's tests, on 127.0.0.1 only.
#   scripts/pg-test-server.sh start DIR   initdb in DIR, start, print the server URL
#   scripts/pg-test-server.sh stop DIR    stop it and remove DIR
# Exits 1 (printing nothing) if PostgreSQL's server programs are not installed.
set -euo pipefail
cmd=${1:?start or stop}
dir=${2:?a directory}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1 || true)
if [ -z "$bin" ] && command -v initdb >/dev/null; then bin=$(dirname "$(command -v initdb)"); fi
[ -n "$bin" ] && [ -x "$bin/initdb" ] || exit 1
as_owner() {
    # initdb refuses to run as root: run the server as the postgres user then.
    if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}
case "$cmd" in
start)
    mkdir -p "$dir"
    if [ "$(id -u)" = 0 ]; then chown postgres "$dir"; fi
    as_owner "$bin/initdb" -D "$dir/data" -A trust -U postgres >"$dir/initdb.log" 2>&1
    for _ in 1 2 3 4 5; do
        port=$((20000 + RANDOM % 20000))
        if as_owner "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 30 \
            -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c fsync=off" start >/dev/null 2>&1; then
            echo "postgres://postgres@127.0.0.1:$port/postgres"
            exit 0
        fi
    done
    echo "PostgreSQL did not start; see $dir/server.log" >&2
    exit 1
    ;;
stop)
    as_owner "$bin/pg_ctl" -D "$dir/data" -m fast -w stop >/dev/null 2>&1 || true
    rm -rf "$dir"
    ;;
esac
