"""``pulse-node trainers``: admit a new trainer to a run's trainer set, or inspect an admission.

    # on each of k member trainers (k = chain.admission_quorum, default a majority of the keys):
    pulse-node trainers admit <NEW TRAINER KEY> --run-id RUN --identity DATA_DIR/identity.key --file admission.bin
    # pass admission.bin from member to member, then to the new trainer, which sets
    #   chain.admission_file = "admission.bin"; every node verifies it against its own trainer set
    pulse-node trainers show admission.bin [--trusted KEY ...] [--quorum K]

The file is a declared, versioned, signed struct (``chain/admission.py`` ``Admission``): the
run id, the new key, and each member's Ed25519 signature over both. Nothing in it is trusted by
itself: a node counts only endorsements by members of the set it already trusts.
"""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("trainers", help="admit a trainer to the trainer set, or inspect an admission",
                       description="Sign a new trainer into a run's trainer set (k-of-n member endorsements), "
                       "or show what an admission file holds and whether it verifies.")
    verbs = p.add_subparsers(dest="verb", metavar="VERB", required=True)
    admit = verbs.add_parser("admit", help="add this member's endorsement of KEY to an admission file")
    admit.add_argument("key", metavar="KEY", help="the new trainer's Ed25519 public key (hex)")
    admit.add_argument("--run-id", required=True)
    admit.add_argument("--identity", required=True, help="this member trainer's identity key file")
    admit.add_argument("--file", required=True, help="admission file (created if missing, endorsement added)")
    show = verbs.add_parser("show", help="print an admission file and check it against trainer keys")
    show.add_argument("file", metavar="FILE")
    show.add_argument("--trusted", nargs="*", default=[], metavar="KEY", help="member keys to verify against")
    show.add_argument("--quorum", type=int, default=0, help="endorsements needed (0 = a majority of --trusted)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from pulse_node.chain.admission import Admission, check_key
    from pulse_node.chain.identity import Identity, key_id_of
    from pulse_node.errors import ConfigError, IntegrityError, WireError
    from pulse_node.fsutil import write_atomic
    from pulse_node.peers.trainerset import TrainerSet

    path = Path(args.file)
    try:
        if args.verb == "admit":
            key = check_key(args.key)
            adm = Admission.decode(path.read_bytes()) if path.exists() else Admission(args.run_id, key)
            if (adm.run_id, adm.key) != (args.run_id, key):
                raise ConfigError(f"{path} admits {key_id_of(adm.key)} to run {adm.run_id!r}, not this key and run")
            adm = adm.endorse(Identity.load(Path(args.identity)))
            write_atomic(path, adm.encode())
        else:
            adm = Admission.decode(path.read_bytes())
    except (OSError, ValueError, WireError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    print(f"run {adm.run_id}\nkey {adm.key}\nendorsed by {len(adm.endorsements)}: "
          f"{', '.join(key_id_of(k) for k, _ in adm.endorsements)}")
    if args.verb == "show" and args.trusted:
        members = TrainerSet(run_id=adm.run_id, keys=args.trusted, quorum=args.quorum)
        if members.is_member(adm.key):
            print("the key is already one of the given keys (no admission needed)")
            return 0
        try:
            members.check(adm)
        except (IntegrityError, ValueError) as exc:
            print(f"does NOT verify: {exc}")
            return 1
        print("verifies against the given keys")
    return 0
