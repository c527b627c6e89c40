"""Reading a command's output: the pseudo-terminal, its lines, and the progress counters they show."""
