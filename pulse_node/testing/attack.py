"""One hostile peer process: ``python -m pulse_node.testing.attack NAME --bootstrap ADDR --run-id R
--root DIR --seconds S [--out result.json]``. Runs attack NAME of ``testing/attackers.py`` on the
real network and writes what it tried and saw as JSON (stdout, and ``--out``)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name")
    ap.add_argument("--bootstrap", action="append", required=True)
    ap.add_argument("--run-id", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--out")
    ap.add_argument("--identity", help="member attacks: the admitted key file the attacker holds")
    ap.add_argument("--started", help="a file created when the attack itself starts (its workers are up)")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwinds: the attacker's workers are stopped
    from pulse_node.testing.attackers import run_attack
    from pulse_node.testing.flood import FLOODS, run_flood
    from pulse_node.testing.free_keys import all_attacks
    from pulse_node.testing.member_attackers import MEMBER_ATTACKS, run_member_attack

    def started() -> None:
        if args.started:
            Path(args.started).touch()

    try:
        if args.name in MEMBER_ATTACKS:
            res = run_member_attack(args.name, Path(args.root), identity=Path(args.identity), run_id=args.run_id,
                                    bootstrap=args.bootstrap, seconds=args.seconds, host=args.host,
                                    on_start=started)
        elif args.name in FLOODS:  # one process, many fresh keys, no node of its own
            res = run_flood(args.name, run_id=args.run_id, bootstrap=args.bootstrap, seconds=args.seconds,
                            host=args.host, on_start=started)
        else:
            attacks, sybils = all_attacks()
            res = run_attack(args.name, Path(args.root), run_id=args.run_id, bootstrap=args.bootstrap,
                             seconds=args.seconds, host=args.host, attacks=attacks, sybils=sybils, on_start=started)
    except Exception as exc:  # the bench reports an attacker that could not run
        res = {"tried": args.name, "attacker_error": f"{type(exc).__name__}: {exc}"}
    text = json.dumps(res, default=str)
    if args.out:
        Path(args.out).write_text(text)
    print(text, flush=True)


if __name__ == "__main__":
    main()
