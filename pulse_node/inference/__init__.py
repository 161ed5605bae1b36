"""The inference role: pull, verify and apply versions, make rollouts with the exact version held."""
