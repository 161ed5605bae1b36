"""``pulse-node swarm``: a whole local swarm as separate processes, and its live view."""
