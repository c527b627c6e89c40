#!/bin/sh
# POST the event's JSON (as in events.jsonl) to a webhook: your own service, Home Assistant, n8n, ...
#   trainbox supervise --notify 'examples/notify/webhook.sh https://hooks.example.org/trainbox' -- python train.py
url=${1:?usage: webhook.sh URL}
# --max-time 8: done within trainbox's 10 s limit for a notifier. -f: an HTTP error is a failure trainbox reports.
exec curl -fsS --max-time 8 -H 'Content-Type: application/json' -H "X-Trainbox-Event: $TRAINBOX_EVENT" \
    --data-binary @- "$url"
