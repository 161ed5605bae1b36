"""Role wiring: the trainer and inference daemons, the local swarm launcher, status endpoints."""
