#!/usr/bin/env bash
# A throwaway MariaDB on 127.0.0.1 in a project-local folder, for the demo and the tests.
#   scripts/mariadb.sh start|stop|status|url|sql [mariadb client args]     (env: MARIADB_DIR, MARIADB_PORT)
# start is idempotent: it initialises the folder once, starts the server if it is not running, and makes sure of
# database `qwenspark` and of least-privilege accounts (passwords generated once, in $MARIADB_DIR/*.password, mode
# 600; the job reads its own from there (db.password_file), never argv):
#   qwenspark_admin      schema owner: ALL on qwenspark.* WITH GRANT OPTION (qwenspark init-db, load-reviews)
#   qwenspark            the job: role qwenspark_job_role, which init-db grants exactly the job's DML
#   qwenspark_dashboard  the dashboard: role qwenspark_dashboard_role, which init-db grants SELECT on the views
# root logs in through the unix socket only (auth unix_socket, no TCP account); a folder of an older release (root
# without a password on TCP, `qwenspark` with ALL privileges) is repaired by the same start.
set -euo pipefail
DIR=$(realpath -m "${MARIADB_DIR:-.run/mariadb}")
PORT=${MARIADB_PORT:-13306}
SOCK=$DIR/mysqld.sock
PID=$DIR/mysqld.pid
# The OS user's socket account: root when run as root (unix_socket: the OS user's name is the login).
SOCK_USER=$(id -un)
say() { echo "[mariadb] $*"; }

login() {  # who client logs in as: the socket account, or root without a password on an older release's folder
  if mariadb --no-defaults --socket="$SOCK" -u"$SOCK_USER" -e 'select 1' >/dev/null 2>&1; then
    echo "$SOCK_USER"
  else
    echo root  # until secure() switches it to the socket
  fi
}

client() { mariadb --no-defaults --socket="$SOCK" -u"$(login)" "$@"; }

running() { [ -S "$SOCK" ] && client -e 'select 1' >/dev/null 2>&1; }

start() {
  command -v mariadbd >/dev/null || { echo "mariadbd not found: run 'make deps' (apt-get install mariadb-server)" >&2; exit 1; }
  mkdir -p "$DIR"
  if [ ! -d "$DIR/data/mysql" ]; then
    say "initialising a new server folder in $DIR/data"
    # A tmpdir of its own: servers of other folders (parallel test runs) name their temporary files alike in /tmp.
    mkdir -p "$DIR/tmp"
    mariadb-install-db --no-defaults --user=root --datadir="$DIR/data" --tmpdir="$DIR/tmp" \
      --auth-root-authentication-method=socket --auth-root-socket-user="$SOCK_USER" --skip-test-db \
      >"$DIR/install.log" 2>&1
  fi
  if running; then
    say "already running on 127.0.0.1:$PORT ($DIR)"
  else
    say "starting on 127.0.0.1:$PORT ($DIR)"
    # utf8mb4 on purpose: the server default is latin1, which loses Chinese text.
    mkdir -p "$DIR/tmp"
    nohup mariadbd --no-defaults --user=root --datadir="$DIR/data" --tmpdir="$DIR/tmp" --bind-address=127.0.0.1 --port="$PORT" \
      --socket="$SOCK" --pid-file="$PID" --log-error="$DIR/error.log" --skip-name-resolve \
      --character-set-server=utf8mb4 --collation-server=utf8mb4_unicode_ci \
      --innodb-flush-log-at-trx-commit=2 --max-connections=200 >/dev/null 2>&1 &
    for _ in $(seq 1 100); do running && break; sleep 0.2; done
    running || { echo "MariaDB did not start; see $DIR/error.log" >&2; tail -20 "$DIR/error.log" >&2; exit 1; }
  fi
  secure
  accounts
}

password() {  # the password kept in $DIR/$1.password, generated the first time (mode 600)
  local file=$DIR/$1.password
  if [ ! -s "$file" ]; then
    (umask 077; head -c 18 /dev/urandom | base64 | tr -d '/+=' > "$file")
  fi
  cat "$file"
}

secure() {  # root (and the OS user) through the socket only; every other root or anonymous account dropped
  local drop
  drop=$(client -N -e "SELECT CONCAT('DROP USER IF EXISTS ', QUOTE(User), '@', QUOTE(Host), ';') FROM mysql.global_priv
    WHERE (User = 'root' AND Host <> 'localhost') OR User = ''")
  client <<SQL
$drop
ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket;
CREATE USER IF NOT EXISTS '$SOCK_USER'@'localhost' IDENTIFIED VIA unix_socket;
GRANT ALL PRIVILEGES ON *.* TO '$SOCK_USER'@'localhost' WITH GRANT OPTION;
SQL
}

accounts() {
  local admin job dash
  admin=$(password qwenspark-admin); job=$(password qwenspark); dash=$(password qwenspark-dashboard)
  # ALTER USER after CREATE: a password file made anew (deleted by hand) takes effect on an existing account.
  # REVOKE ALL: an older release granted the job ALL on qwenspark.*; its privileges now come from its role only.
  client <<SQL
CREATE DATABASE IF NOT EXISTS qwenspark CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci;
CREATE USER IF NOT EXISTS 'qwenspark_admin'@'127.0.0.1' IDENTIFIED BY '$admin';
ALTER USER 'qwenspark_admin'@'127.0.0.1' IDENTIFIED BY '$admin';
GRANT ALL PRIVILEGES ON qwenspark.* TO 'qwenspark_admin'@'127.0.0.1' WITH GRANT OPTION;
CREATE ROLE IF NOT EXISTS qwenspark_job_role;
CREATE ROLE IF NOT EXISTS qwenspark_dashboard_role;
CREATE USER IF NOT EXISTS 'qwenspark'@'127.0.0.1' IDENTIFIED BY '$job';
ALTER USER 'qwenspark'@'127.0.0.1' IDENTIFIED BY '$job';
REVOKE ALL PRIVILEGES, GRANT OPTION FROM 'qwenspark'@'127.0.0.1';
GRANT qwenspark_job_role TO 'qwenspark'@'127.0.0.1';
SET DEFAULT ROLE qwenspark_job_role FOR 'qwenspark'@'127.0.0.1';
DROP USER IF EXISTS 'qwenspark'@'localhost';
CREATE USER IF NOT EXISTS 'qwenspark_dashboard'@'127.0.0.1' IDENTIFIED BY '$dash';
ALTER USER 'qwenspark_dashboard'@'127.0.0.1' IDENTIFIED BY '$dash';
REVOKE ALL PRIVILEGES, GRANT OPTION FROM 'qwenspark_dashboard'@'127.0.0.1';
GRANT qwenspark_dashboard_role TO 'qwenspark_dashboard'@'127.0.0.1';
SET DEFAULT ROLE qwenspark_dashboard_role FOR 'qwenspark_dashboard'@'127.0.0.1';
SQL
}

stop() {
  if running; then
    say "stopping ($DIR)"
    mariadb-admin --no-defaults --socket="$SOCK" -u"$(login)" shutdown
  else
    say "not running ($DIR)"
  fi
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) if running; then say "running on 127.0.0.1:$PORT ($DIR)"; else say "not running ($DIR)"; exit 1; fi ;;
  url) echo "jdbc:mysql://127.0.0.1:$PORT/qwenspark" ;;
  sql) shift; client "$@" ;;
  *) echo "usage: $0 start|stop|status|url|sql [client args]" >&2; exit 2 ;;
esac
