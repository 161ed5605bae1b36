"""pulse-node: a peer-to-peer node for decentralized RL post-training.

Layering (lower layers never import higher ones):

- ``codec``  pure, torch-free: raw tensor bits, PULSESync patches, state hashes.
- ``chain``  pure, torch-free: signed version records, the on-disk version store,
  the reorder buffer, catch-up patches.
- ``rl``     torch: models, tasks, rollouts, GRPO.
- ``loco``   torch: PULSELoCo pseudo-gradient exchange between trainers.
- ``net``    network workers (hivemind DHT process, py-libp2p data plane process)
  behind narrow typed local APIs.
- ``node``   role wiring: bootstrap, trainer, inference, the local swarm launcher.
- ``commands`` thin CLI entry points; heavy imports happen inside ``run``.
"""

__version__ = "0.1.0"
