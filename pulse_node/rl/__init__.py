"""RL workload: models, verifiable tasks, rollouts, GRPO, evaluation and the solo loop.

Everything here imports torch except ``config`` (importable by the CLI and other roles without
torch) and ``tasks``/``rollout``/``assign``/``settings`` (pure python + msgpack). Precision semantics used throughout:
the trainer keeps FP32 master weights and an AdamW state; the BF16 cast of those weights is the
*versioned* compute copy. Inference runs on exactly the BF16 values (held upcast to FP32 on every
device, which is exact, so trainers can recompute every token draw: ``seeded``, ``verify``), and the trainer's forward pass uses the same BF16-rounded values via a
straight-through cast, so at equal versions trainer and inference compute the same policy.
"""
