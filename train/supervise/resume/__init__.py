"""A restart that resumes: the programs trainbox knows, their complete checkpoints, and what a restart adds."""
