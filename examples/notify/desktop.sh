#!/bin/sh
# A desktop notification for a trainbox event (notify-send, Debian package libnotify-bin):
#   trainbox supervise --notify examples/notify/desktop.sh -- python train.py
# Run it in your desktop session (it needs DBUS_SESSION_BUS_ADDRESS); the event's JSON on stdin is not needed.
urgency=normal
case "$TRAINBOX_EVENT" in give_up | stall | supervisor_hung) urgency=critical ;; esac
exec notify-send --app-name=trainbox --urgency="$urgency" "trainbox: $TRAINBOX_EVENT" "$TRAINBOX_SUMMARY"
