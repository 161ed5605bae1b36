"""Byzantine trainers against one swarm, in one process: the harness of ``bench/byzantine.py``.

- ``world.py``: the fixed pieces (default trainer config, warm-started weights, the shared
  sampler, the held-out set, the payload value bound);
- ``honest.py``: a trainer's inner side (GRPO inner steps, error feedback);
- ``attacks.py``: what Byzantine trainers send and do;
- ``stages.py``: the defences as pluggable stages (what exists today, and the interfaces the
  protocol pieces of issue 32's later phase plug into);
- ``harness.py``: one run (rounds of honest and Byzantine trainers through those stages).
"""
