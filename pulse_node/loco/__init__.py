"""PULSELoCo: trainer <-> trainer synchronization (sparse error-feedback DiLoCo).

Modules, one concept each:

- ``config``    -- ``LocoConfig`` (torch-free).
- ``payload``   -- the versioned wire struct of one trainer's round contribution (torch-free).
- ``positions`` -- fallback delta-varint + zstd position coder (torch-free).
- ``hashing``   -- state hash of the global FP32 weights + outer momentum.
- ``sparsify``  -- ``ErrorFeedback``: pseudo-gradient, BF16 gate, error-feedback buffer.
- ``outer``     -- ``OuterOptimizer``: deterministic aggregation + outer Nesterov SGD.
- ``harness``   -- ``run_inprocess``: N trainers in one process (tests, benchmark).

Importing this package does not import torch; ``sparsify``/``outer``/``harness`` do.
"""
