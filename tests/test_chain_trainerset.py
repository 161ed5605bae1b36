"""The trainer set: who may sign versions, how a new trainer is admitted (k-of-n member
signatures, verified against the set a node already trusts), and that a peer speaks only for
the key its peer id encodes."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pulse_node.chain.admission import MAX_ENDORSEMENTS, Admission, read_key_file
from pulse_node.chain.identity import Identity, peer_id_of_key
from pulse_node.cli import main
from pulse_node.errors import ConfigError, IntegrityError, WireError
from pulse_node.peers.trainerset import TrainerSet, bound_key, sender_key

RUN = "run-t"
A, B, C, NEW, EVE = (Identity.generate() for _ in range(5))


@dataclass
class Peer:
    """What the trainer set reads of a discovery record."""

    peer_id: str
    role: str = "trainer"
    node_key: str = ""
    admission: bytes | None = None

    @property
    def record(self) -> Peer:
        return self  # the record's fields: its admission


def peer_of(ident: Identity, *, admission: Admission | None = None, role: str = "trainer") -> Peer:
    return Peer(peer_id_of_key(ident.public_key_hex), role, ident.public_key_hex,
                admission.encode() if admission else None)


def keyed(quorum: int = 0) -> TrainerSet:
    return TrainerSet(run_id=RUN, keys=[A.public_key_hex, B.public_key_hex, C.public_key_hex], quorum=quorum)


def test_only_configured_keys_are_members_and_a_peer_speaks_for_its_own_key_only() -> None:
    members = keyed()
    assert members.is_member(A.public_key_hex) and not members.is_member(EVE.public_key_hex)
    assert not members.open and members.quorum == 2  # a majority of 3
    honest = peer_of(A)
    assert bound_key(honest) == A.public_key_hex and members.is_member(bound_key(honest))
    thief = Peer(peer_id_of_key(EVE.public_key_hex), "trainer", A.public_key_hex)  # announces A's key
    assert bound_key(thief) == "" and not members.is_member(bound_key(thief))
    assert sender_key(thief.peer_id, [thief]) == EVE.public_key_hex  # a push's sender: the id's own key
    members.mark_observed([thief, peer_of(EVE)])  # announcing the role adds nobody to a keyed set
    assert members.members == {A.public_key_hex, B.public_key_hex, C.public_key_hex}


def test_an_open_set_trusts_exactly_the_announced_trainers() -> None:
    members = TrainerSet(run_id=RUN)
    assert members.open and not members.members
    members.mark_observed([peer_of(A), peer_of(B, role="inference"), Peer(peer_id_of_key(EVE.public_key_hex),
                                                                   "trainer", C.public_key_hex)])
    assert members.members == {A.public_key_hex}  # not the inference node, not a stolen key
    with pytest.raises(IntegrityError, match="open"):
        members.mark_admitted(Admission(RUN, NEW.public_key_hex).endorse(A))


def test_admission_needs_a_quorum_of_distinct_valid_member_signatures_of_this_run() -> None:
    members = keyed()
    one = Admission(RUN, NEW.public_key_hex).endorse(A)
    with pytest.raises(IntegrityError, match="1 valid member endorsement"):
        members.mark_admitted(one)
    with pytest.raises(IntegrityError, match="1 valid"):  # the same member twice is one endorsement
        members.mark_admitted(one.endorse(A))
    with pytest.raises(IntegrityError, match="1 valid"):  # a non-member's endorsement counts for nothing
        members.mark_admitted(one.endorse(EVE))
    forged = Admission(RUN, NEW.public_key_hex, ((A.public_key_hex, one.endorsements[0][1]),
                                                 (B.public_key_hex, one.endorsements[0][1])))
    with pytest.raises(IntegrityError, match="1 valid"):  # B's name on A's signature
        members.mark_admitted(forged)
    other_run = Admission("elsewhere", NEW.public_key_hex).endorse(A).endorse(B)
    with pytest.raises(IntegrityError, match="run 'elsewhere'"):
        members.mark_admitted(other_run)
    assert not members.is_member(NEW.public_key_hex)
    members.mark_admitted(one.endorse(B))
    assert members.is_member(NEW.public_key_hex) and NEW.public_key_hex in members.admitted


def test_nodes_learn_admissions_from_the_admitted_trainers_own_records_in_any_order() -> None:
    """NEW is admitted by A and B; THIRD by A and NEW (an admitted member may endorse within
    ``depth`` 2). A node learns both from discovery records, whatever their order; an admission
    carried by a peer whose id is another key, one not endorsed enough, or one endorsed by
    members at the depth limit, admits nobody."""
    third, fourth = Identity.generate(), Identity.generate()
    new_adm = Admission(RUN, NEW.public_key_hex).endorse(A).endorse(B)
    third_adm = Admission(RUN, third.public_key_hex).endorse(A).endorse(NEW)
    weak = Admission(RUN, EVE.public_key_hex).endorse(A)
    carried_by_other = Peer(peer_id_of_key(C.public_key_hex), "trainer", admission=new_adm.encode())
    members = TrainerSet(run_id=RUN, keys=[A.public_key_hex, B.public_key_hex, C.public_key_hex], depth=2)
    members.mark_observed([peer_of(third, admission=third_adm), carried_by_other, peer_of(EVE, admission=weak),
                     peer_of(NEW, admission=new_adm)])
    assert set(members.admitted) == {NEW.public_key_hex, third.public_key_hex}
    assert (members.depth_of(NEW.public_key_hex), members.depth_of(third.public_key_hex)) == (1, 2)
    assert not members.is_member(EVE.public_key_hex)
    members.mark_observed([peer_of(fourth, admission=Admission(RUN, fourth.public_key_hex).endorse(NEW).endorse(third))])
    assert not members.is_member(fourth.public_key_hex), "members at the depth limit endorsed"
    roots_only = keyed()  # the default depth: the configured keys endorse, nobody else
    roots_only.mark_observed([peer_of(third, admission=third_adm), peer_of(NEW, admission=new_adm)])
    assert set(roots_only.admitted) == {NEW.public_key_hex}
    garbage = Peer(peer_id_of_key(EVE.public_key_hex), "trainer", admission=b"\x93junk")
    members.mark_observed([garbage])  # hostile bytes: ignored, never raised
    assert not members.is_member(EVE.public_key_hex)


def test_admission_bytes_are_decoded_as_hostile_input() -> None:
    good = Admission(RUN, NEW.public_key_hex).endorse(A)
    assert Admission.decode(good.encode()) == good
    too_many = Admission(RUN, NEW.public_key_hex, tuple((A.public_key_hex, b"s" * 64)
                                                      for _ in range(MAX_ENDORSEMENTS + 1)))
    for bad in (b"", b"\xc1", b"x" * 5000, too_many.encode(), good.encode()[:-3],
                Admission(RUN, "zz" * 32).encode(), Admission("has space", NEW.public_key_hex).encode()):
        with pytest.raises(WireError):
            Admission.decode(bad)


def test_key_files_and_directories(tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "t0.pub").write_text(A.public_key_hex + "\n")
    (tmp_path / "keys" / "t1.pub").write_text(f"# trainer-1\n{B.public_key_hex.upper()}  # upper case is fine\n")
    (tmp_path / "keys" / ".t2.tmp").write_text("not a key")  # half-written: not a *.pub file
    assert read_key_file(tmp_path / "keys") == [A.public_key_hex, B.public_key_hex]
    (tmp_path / "bad.txt").write_text(f"{A.public_key_hex}\nnot-a-key\n")
    with pytest.raises(ConfigError, match="bad.txt:2"):
        read_key_file(tmp_path / "bad.txt")


def test_admit_command_collects_endorsements_and_show_verifies_them(tmp_path: Path, capsys) -> None:
    keys = {}
    for name, ident in (("a", A), ("b", B)):
        path = tmp_path / f"{name}.key"
        path.write_bytes(ident.private_pem())
        path.chmod(0o600)
        keys[name] = path
    adm = tmp_path / "admission.bin"
    for name in ("a", "b"):
        assert main(["trainers", "admit", NEW.public_key_hex, "--run-id", RUN, "--identity", str(keys[name]),
                     "--file", str(adm)]) == 0
    assert Admission.decode(adm.read_bytes()).key == NEW.public_key_hex
    trusted = [A.public_key_hex, B.public_key_hex, C.public_key_hex]
    assert main(["trainers", "show", str(adm), "--trusted", *trusted]) == 0
    assert "verifies" in capsys.readouterr().out
    assert main(["trainers", "show", str(adm), "--trusted", *trusted, "--quorum", "3"]) == 1
    assert main(["trainers", "admit", EVE.public_key_hex, "--run-id", RUN, "--identity", str(keys["a"]),
                 "--file", str(adm)]) == 1  # the file admits another key: refused, file untouched
    assert Admission.decode(adm.read_bytes()).key == NEW.public_key_hex
