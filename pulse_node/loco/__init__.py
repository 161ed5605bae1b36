"""PULSELoCo: trainer <-> trainer synchronization (sparse error-feedback DiLoCo).

Modules, one concept each:

- ``config``    -- ``LocoConfig`` (torch-free).
- ``payload``   -- the versioned wire struct of one trainer's round contribution (torch-free).
- ``positions`` -- fallback delta-varint + zstd position coder (torch-free); the payload
  uses ``pulse_node.codec.positions`` when it is importable.
- ``hashing``   -- state hash of the global FP32 weights + outer momentum.
- ``sparsify``  -- ``ErrorFeedback``: pseudo-gradient, BF16 gate, error-feedback buffer.
- ``outer``     -- ``OuterOptimizer``: deterministic aggregation + outer Nesterov SGD.
- ``resync``    -- the outer-state message a diverged trainer pulls from a peer.
- ``harness``   -- ``run_inprocess``: N trainers in one process (tests, benchmark).
- ``toy``       -- a tiny FP32 trainer for tests and smoke runs.

Importing this package, ``config`` or ``payload`` does not import torch; the others do.
"""
