#!/usr/bin/env bash
# Set up and run the whole test suite on a fresh machine (the README's second command).
# Installs the package with its dev extras into .venv, starts PostgreSQL, Redis and
# RabbitMQ if they are stopped, checks the code (ruff, mypy: either failing fails the run),
# and runs pytest. With CI=true a service that cannot be
# started fails the run instead of skipping its tests.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${CONVEYOR_VENV:-.venv}
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check -e '.[dev]'

up() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
start_service() {  # name port command...
  local name=$1 port=$2; shift 2
  up "$port" && return 0
  echo "starting $name (port $port was closed)"
  "$@" >/dev/null 2>&1 || true
  for _ in $(seq 1 60); do up "$port" && return 0; sleep 1; done
  echo "$name did not come up on 127.0.0.1:$port" >&2
  [ "${CI:-}" = "true" ] && exit 1
  return 0
}
start_service postgres 5432 pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql 2>/dev/null | head -1)" main start
start_service redis 6379 redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no
# RabbitMQ holds ~3 file handles per quorum queue: give it more than the default 1024.
start_service rabbitmq 5672 sh -c 'ulimit -n 65536 2>/dev/null; exec rabbitmq-server -detached'
up 5672 && { rabbitmq-plugins -q enable rabbitmq_management >/dev/null || echo "could not enable rabbitmq_management: RabbitMQ depth() will fail" >&2; }  # idempotent, online

# The dashboard's browser tests drive Debian's Chromium (Playwright never downloads one).
# Another apt-get (a second test run on the machine) holds the dpkg lock for a while: wait.
if [ ! -x /usr/bin/chromium ]; then
  echo "installing chromium (the dashboard's browser tests drive it)"
  { apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium || { apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq chromium; }; } \
    >/dev/null 2>&1 || true
  if [ ! -x /usr/bin/chromium ]; then
    echo "chromium could not be installed: the dashboard's browser tests will skip" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
fi

# The partition tests (tests/integration/test_partitions.py) cut links with nftables.
if ! command -v nft >/dev/null 2>&1; then
  echo "installing nftables (the partition tests cut links with it)"
  { apt-get -o DPkg::Lock::Timeout=600 install -y -qq nftables || { apt-get -o DPkg::Lock::Timeout=600 update -qq && apt-get -o DPkg::Lock::Timeout=600 install -y -qq nftables; }; } \
    >/dev/null 2>&1 || true
  if ! command -v nft >/dev/null 2>&1; then
    echo "nftables could not be installed: the partition tests will fail in CI" >&2
    [ "${CI:-}" = "true" ] && exit 1
  fi
fi

"$VENV/bin/ruff" check -q src tests benchmarks
"$VENV/bin/mypy" src
# Three test processes on 2 cores: most tests wait on brokers and child processes, not on
# the CPU (with two, the load average stayed at 0.3-2 and the run took 946 s on a quiet
# machine). CONVEYOR_TEST_WORKERS=0 runs them in this one process.
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider \
  -n "${CONVEYOR_TEST_WORKERS:-3}" --dist loadgroup "$@"
