"""Test and bench support, never used by a production node: in-process swarms, fault injection,
forging peers, the in-process PULSELoCo harness and its toy trainer.

(``pulse-node join`` imports ``faults`` only when the testing-only ``[net.faults]`` option is on.)
"""
