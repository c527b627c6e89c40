#!/bin/sh
# Build step shared by every Dockerfile: create the default
# non-root user and the directories named in /etc/trainbox/env.d/*.env. At run
# time the container runs as the host UID:GID, so writable directories are
# world-writable (sticky) and named volumes inherit that on first use.
set -eu
set -a
for file in /etc/trainbox/env.d/*.env; do . "$file"; done
set +a
useradd --uid 1000 --user-group --no-create-home --home-dir "$HOME" --shell /bin/sh trainbox
# useradd writes the day of the build into /etc/shadow (last password change); the account has
# no password, so an empty field (no password ageing) says the same and is the same in every build.
sed -i 's/^\(trainbox:[^:]*:\)[0-9]*:/\1:/' /etc/shadow
install -d -m 0755 "$TRAINBOX_DATA"
for dir in "$HOME" "$TRAINBOX_RUNS" "${MIOPEN_USER_DB_PATH:-}" "${MIOPEN_CUSTOM_CACHE_DIR:-}" \
  "${TORCHINDUCTOR_CACHE_DIR:-}" "${TRITON_CACHE_DIR:-}"; do
  [ -z "$dir" ] || install -d -m 1777 "$dir"
done
install -m 0755 /usr/local/lib/trainbox/entrypoint.sh /usr/local/bin/trainbox
