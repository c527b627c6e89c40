#!/bin/sh
# A push to your phone through ntfy (https://ntfy.sh): subscribe to TOPIC in the ntfy app, then
#   trainbox supervise --notify 'examples/notify/ntfy.sh TOPIC' -- python train.py
# On the public server a topic's name is its password: pick a long random one. NTFY_URL: your own server.
topic=${1:?usage: ntfy.sh TOPIC}
priority=default
case "$TRAINBOX_EVENT" in give_up | supervisor_hung) priority=high ;; esac
# --max-time 8: done within trainbox's 10 s limit for a notifier.
exec curl -fsS --max-time 8 -H "Title: trainbox: $TRAINBOX_EVENT" -H "Priority: $priority" \
    --data-binary "$TRAINBOX_SUMMARY" "${NTFY_URL:-https://ntfy.sh}/$topic"
