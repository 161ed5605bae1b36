"""``python -m pulse_node.commands.warmup NODE_TOML``: the embedded model's warm start for that
trainer config, trained and cached (or found in the cache), its progress on stderr.

``pulse-node swarm`` runs it once before it starts any trainer (``swarm/launcher.py``), so the
trainers load the warm start from the cache instead of all training the same one at once in
silence. Not a subcommand of its own: nobody needs to type it. Exit code 1 on a bad config.
"""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    from pulse_node.config import load_node_config
    from pulse_node.errors import PulseError
    from pulse_node.rl.policy import build_policy

    args = sys.argv[1:] if argv is None else argv
    try:
        cfg = load_node_config(args[0] if args else None, role="trainer")
        build_policy(cfg.model, cfg.task, seed=cfg.seed, grpo_cfg=getattr(cfg, "grpo", None), progress=True)
    except PulseError as exc:
        print(f"[warm start] error: {exc}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
