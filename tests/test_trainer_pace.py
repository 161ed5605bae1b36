"""An open trainer's pace (``trainer/pace.OpenPace``): fewer inner steps after a round its
commitment missed, more after one it made, never below one nor above ``inner_steps``."""

from __future__ import annotations

from pulse_node.trainer.pace import OpenPace


def test_a_late_open_trainer_halves_its_steps_down_to_one():
    pace = OpenPace(10)
    assert pace.steps == 10
    seen = []
    for _ in range(5):
        pace.saw(in_time=False)
        seen.append(pace.steps)
    assert seen == [5, 2, 1, 1, 1]


def test_an_open_trainer_in_time_takes_one_more_step_each_round_up_to_inner_steps():
    pace = OpenPace(4)
    pace.saw(in_time=False)
    pace.saw(in_time=False)
    assert pace.steps == 1
    seen = []
    for _ in range(5):
        pace.saw(in_time=True)
        seen.append(pace.steps)
    assert seen == [2, 3, 4, 4, 4]
