"""Notifications: the person's own command, run on the events they care about."""
