#!/usr/bin/env bash
# The entrypoint of the test bed's `postgres:<major>` image, mounted at
# /usr/local/bin/docker-entrypoint.sh. It behaves as the official image's entrypoint does:
#   - arguments that start with `-` are options for `postgres`;
#   - any command other than `postgres` runs as given;
#   - as root, it prepares PGDATA and the socket directory for the postgres user (uid 999, as
#     in the official image) and runs itself again as that user;
#   - on an empty PGDATA it runs initdb with POSTGRES_USER and POSTGRES_PASSWORD (or
#     POSTGRES_HOST_AUTH_METHOD=trust), POSTGRES_INITDB_ARGS and POSTGRES_INITDB_WALDIR, lets
#     remote hosts in with password authentication (scram-sha-256 unless
#     POSTGRES_HOST_AUTH_METHOD says otherwise), listens on every address, and creates
#     POSTGRES_DB when it is not `postgres`;
#   - then it execs the command.
# Not emulated: /docker-entrypoint-initdb.d scripts and the *_FILE variants of the variables.
set -Eeuo pipefail

if [[ "${1:-}" == -* ]]; then set -- postgres "$@"; fi
if [[ "${1:-}" != postgres ]]; then exec "$@"; fi

: "${PGDATA:?PGDATA is not set}"
if [[ "$(id -u)" == 0 ]]; then
    mkdir -p "$PGDATA" /var/run/postgresql
    chown 999:999 "$PGDATA" /var/run/postgresql
    chmod 700 "$PGDATA"
    chmod 3777 /var/run/postgresql
    exec setpriv --reuid=999 --regid=999 --init-groups "${BASH_SOURCE[0]}" "$@"
fi

mkdir -p "$PGDATA"
chmod 700 "$PGDATA" 2>/dev/null || true

if [[ ! -s "$PGDATA/PG_VERSION" ]]; then
    user="${POSTGRES_USER:-postgres}"
    auth="${POSTGRES_HOST_AUTH_METHOD:-scram-sha-256}"
    if [[ -z "${POSTGRES_PASSWORD:-}" && "$auth" != trust ]]; then
        echo "Error: Database is uninitialized and superuser password is not specified." >&2
        echo "       Set POSTGRES_PASSWORD (or POSTGRES_HOST_AUTH_METHOD=trust)." >&2
        exit 1
    fi
    pwfile="$(mktemp)"
    printf '%s\n' "${POSTGRES_PASSWORD:-}" >"$pwfile"
    waldir=()
    if [[ -n "${POSTGRES_INITDB_WALDIR:-}" ]]; then waldir=(--waldir "$POSTGRES_INITDB_WALDIR"); fi
    # shellcheck disable=SC2086 # POSTGRES_INITDB_ARGS is a list of options, split on purpose
    initdb --username="$user" --pwfile="$pwfile" "${waldir[@]}" ${POSTGRES_INITDB_ARGS:-}
    rm -f "$pwfile"
    # initdb trusts 127.0.0.1, which in a container is the pod itself. On the test bed, pods
    # share the host's loopback and 127.0.0.1 is the host (and the test process): the pod's own
    # address takes its place, so only the pod itself is trusted, as in a real pod.
    if [[ -n "${PGKUBE_TESTBED_POD_IP:-}" ]]; then
        sed -i "s|127\.0\.0\.1/32|$PGKUBE_TESTBED_POD_IP/32|" "$PGDATA/pg_hba.conf"
    fi
    printf '\nhost all all all %s\n' "$auth" >>"$PGDATA/pg_hba.conf"
    printf "\nlisten_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
    db="${POSTGRES_DB:-$user}"
    if [[ "$db" != postgres ]]; then
        printf 'CREATE DATABASE "%s";\n' "${db//\"/\"\"}" |
            postgres --single -j -D "$PGDATA" postgres >/dev/null
    fi
    echo "PostgreSQL init process complete; ready for start up."
fi

exec "$@"
