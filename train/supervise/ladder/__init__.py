"""The safer-settings ladder: its rungs for any command, its memory of a run, and the rung that finishes first."""
