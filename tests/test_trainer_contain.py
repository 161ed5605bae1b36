"""A trainer survives what it did not expect (issue 34): a pushed input whose handling raises an
exception no check anticipated is refused, its sender struck and named in the status, and the
trainer goes on with the next input (``RoleContext.take_events``, ``peers/contain.py``). On
fe579b4 the exception left ``_drain_events`` and ended the trainer's loop."""

from __future__ import annotations

from test_node_resync_trust import trainer  # noqa: F401 (fixture: a trainer at version 3 on a hub)

from pulse_node.testing.adversaries import peer_id


def test_a_pushed_payload_whose_handling_breaks_strikes_its_sender_and_the_trainer_goes_on(trainer, contained):  # noqa: F811
    role, hub, rogue = trainer
    handled: list[str] = []

    def offer_payload(sender: str, data: bytes) -> None:  # a payload decoder with a bug in it
        if data == b"boom":
            raise KeyError("a decoder nobody finished")
        handled.append(sender)

    role.agreement.offer_payload = offer_payload
    me = next(p for p in hub.records.values() if p.peer_id == role.ctx.transport.peer_id)
    sender = hub.join(peer_id(rogue), lambda request: None)
    before = contained.total
    sender.push(me, "loco", b"boom", timeout=1.0)
    sender.push(me, "loco", b"fine", timeout=1.0)
    role._drain_events(wait_s=1.0)
    assert handled == [peer_id(rogue)], "the trainer did not go on past the broken input"
    assert role.ctx.book.strikes[peer_id(rogue)] == 1 and contained.total == before + 1
    status = role.ctx.status.snapshot()
    assert status.counters.unexpected == 1
    assert any(peer_id(rogue)[:12] in e.message and "KeyError" in e.message for e in status.recent_errors)
