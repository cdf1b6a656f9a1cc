#!/usr/bin/env bash
# A throwaway MariaDB on 127.0.0.1 in a project-local folder, for the demo and the tests.
#   scripts/mariadb.sh start|stop|status|url     (env: MARIADB_DIR, MARIADB_PORT)
# start is idempotent: it initialises the folder once, starts the server if it is not running, and makes
# sure database `qwenspark` and user `qwenspark` exist. The user's password is generated once and kept in
# $MARIADB_DIR/qwenspark.password (mode 600): the job reads it from there (db.password_file), never argv.
set -euo pipefail
DIR=$(realpath -m "${MARIADB_DIR:-.run/mariadb}")
PORT=${MARIADB_PORT:-13306}
SOCK=$DIR/mysqld.sock
PID=$DIR/mysqld.pid
PWFILE=$DIR/qwenspark.password
say() { echo "[mariadb] $*"; }

client() { mariadb --no-defaults --socket="$SOCK" -uroot "$@"; }

running() { [ -S "$SOCK" ] && client -e 'select 1' >/dev/null 2>&1; }

start() {
  command -v mariadbd >/dev/null || { echo "mariadbd not found: run 'make deps' (apt-get install mariadb-server)" >&2; exit 1; }
  mkdir -p "$DIR"
  if [ ! -d "$DIR/data/mysql" ]; then
    say "initialising a new server folder in $DIR/data"
    mariadb-install-db --no-defaults --user=root --datadir="$DIR/data" \
      --auth-root-authentication-method=normal --skip-test-db >"$DIR/install.log" 2>&1
  fi
  if running; then
    say "already running on 127.0.0.1:$PORT ($DIR)"
  else
    say "starting on 127.0.0.1:$PORT ($DIR)"
    # utf8mb4 on purpose: the server default is latin1, which loses Chinese text.
    nohup mariadbd --no-defaults --user=root --datadir="$DIR/data" --bind-address=127.0.0.1 --port="$PORT" \
      --socket="$SOCK" --pid-file="$PID" --log-error="$DIR/error.log" --skip-name-resolve \
      --character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci \
      --innodb-flush-log-at-trx-commit=2 --max-connections=200 >/dev/null 2>&1 &
    for _ in $(seq 1 100); do running && break; sleep 0.2; done
    running || { echo "MariaDB did not start; see $DIR/error.log" >&2; tail -20 "$DIR/error.log" >&2; exit 1; }
  fi
  if [ ! -s "$PWFILE" ]; then
    (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$PWFILE")
  fi
  local pw; pw=$(cat "$PWFILE")
  client <<SQL
CREATE DATABASE IF NOT EXISTS qwenspark CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;
CREATE USER IF NOT EXISTS 'qwenspark'@'127.0.0.1' IDENTIFIED BY '$pw';
CREATE USER IF NOT EXISTS 'qwenspark'@'localhost' IDENTIFIED BY '$pw';
GRANT ALL PRIVILEGES ON qwenspark.* TO 'qwenspark'@'127.0.0.1';
GRANT ALL PRIVILEGES ON qwenspark.* TO 'qwenspark'@'localhost';
SQL
}

stop() {
  if running; then
    say "stopping ($DIR)"
    mariadb-admin --no-defaults --socket="$SOCK" -uroot shutdown
  else
    say "not running ($DIR)"
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if running; then say "running on 127.0.0.1:$PORT ($DIR)"; else say "not running ($DIR)"; exit 1; fi ;;
  url) echo "jdbc:mysql://127.0.0.1:$PORT/qwenspark" ;;
  *) echo "usage: $0 start|stop|status|url" >&2; exit 2 ;;
esac
