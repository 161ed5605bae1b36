"""PULSELoCo: trainer <-> trainer synchronization (sparse error-feedback DiLoCo).

Modules, one concept each:

- ``config``       -- ``LocoConfig`` (torch-free).
- ``payload``      -- the versioned wire struct of one trainer's round contribution (torch-free);
  positions are coded by ``pulse_node.codec.positions``.
- ``basecoder``    -- base-conditioned value and position coding of a payload (torch-free).
- ``bounded_zstd`` -- decompressing one zstd frame of declared, capped size (torch-free).
- ``decision``     -- the signed round decision: which payloads make up a round (torch-free).
- ``hashing``      -- state hash of the global FP32 weights + outer momentum.
- ``sparsify``     -- ``ErrorFeedback``: pseudo-gradient, BF16 gate, error-feedback buffer.
- ``outer``        -- ``OuterOptimizer``: deterministic aggregation + outer Nesterov SGD.

How trainers agree on a round is ``pulse_node/trainer/agreement.py``; N trainers in one process
(tests, benchmark) are ``pulse_node/testing/loco_harness.py``. Importing this package,
``config``, ``payload``, ``basecoder``, ``bounded_zstd`` or ``decision`` does not import torch.
"""
