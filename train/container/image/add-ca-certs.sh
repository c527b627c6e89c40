#!/bin/sh
# Build step of every Dockerfile, before anything is fetched over TLS: trust the
# extra CA certificates in $EXTRA_CA_CERTS_B64 (base64 of PEM bundles; `invoke
# build --ca-cert` or $TRAINBOX_CA_CERTS, for corporate TLS-inspecting proxies).
set -eu
[ -n "${EXTRA_CA_CERTS_B64:-}" ] || exit 0
echo "$EXTRA_CA_CERTS_B64" | base64 -d \
  | awk '/BEGIN CERTIFICATE/ { n++ } { print > ("/usr/local/share/ca-certificates/trainbox-extra-" n ".crt") }'
update-ca-certificates
