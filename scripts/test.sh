#!/usr/bin/env bash
# The one command that runs all of tenet's checks: the crate map, formatting, lints, and every test.
# The ledger's PostgreSQL suite runs against TENET_TEST_POSTGRES_URL, or against a throwaway
# server this script starts on 127.0.0.1 when PostgreSQL is installed (else it is skipped,
# and says so).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${TENET_TEST_POSTGRES_URL:-}" ]; then
    pgdir=$(mktemp -d "${TMPDIR:-/tmp}/tenet-pg.XXXXXX")
    if url=$(./scripts/pg-test-server.sh start "$pgdir"); then
        export TENET_TEST_POSTGRES_URL=$url
        trap './scripts/pg-test-server.sh stop "$pgdir"' EXIT
        echo "== PostgreSQL for the ledger tests: $url"
    else
        rm -rf "$pgdir"
        echo "== PostgreSQL is not installed: the ledger's PostgreSQL suite will be skipped"
    fi
fi
echo "== crate map (docs/ARCHITECTURE.md) against the Cargo.toml files"
python3 scripts/check-layers.py
echo "== cargo fmt --check"
cargo fmt --all --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --locked -- -D warnings
echo "== cargo test"
cargo test --workspace --locked
echo "== Python package (maturin develop, then pytest)"
# TENET_PYTHON_VENV: a venv with maturin, numpy and pytest (.ci/run makes one under target/).
if [ -n "${TENET_PYTHON_VENV:-}" ]; then
    (cd python && VIRTUAL_ENV="$TENET_PYTHON_VENV" PATH="$TENET_PYTHON_VENV/bin:$PATH" \
        maturin develop --quiet --locked)
    # The network tests start a coordinator and nodes from the binary `cargo test` built.
    TENET_BIN="$PWD/target/debug/tenet" "$TENET_PYTHON_VENV/bin/python" -m pytest -q python/tests
elif [ "${TENET_REQUIRE_PYTHON:-}" = 1 ]; then
    echo "TENET_REQUIRE_PYTHON=1 but TENET_PYTHON_VENV is not set" >&2
    exit 1
else
    echo "skipped: set TENET_PYTHON_VENV to a venv with maturin, numpy and pytest"
fi
