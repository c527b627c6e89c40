"""Judging silences: how long a child may stay silent, and what happens when it stays silent too long."""
