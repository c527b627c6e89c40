#!/bin/sh
# A mail for a trainbox event, its JSON as the body, through the machine's own mail setup
# (`mail` from bsd-mailx or mailutils, else `sendmail` from any MTA: postfix, msmtp-mta, ...):
#   trainbox supervise --notify 'examples/notify/mail.sh you@example.org' -- python train.py
to=${1:?usage: mail.sh ADDRESS}
subject="trainbox: $TRAINBOX_SUMMARY"
if command -v mail >/dev/null 2>&1; then exec mail -s "$subject" "$to"; fi
sendmail=$(command -v sendmail || echo /usr/sbin/sendmail)  # /usr/sbin is not on every user's PATH
{ printf 'To: %s\nSubject: %s\n\n' "$to" "$subject"; cat; } | "$sendmail" -i -- "$to"
