"""The trainer role: GRPO inner steps, the PULSELoCo round agreement, version publication."""
