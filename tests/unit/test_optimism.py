"""The service's choice of optimism per request: on while learning and while enough first answers fit, off below
the share but for probes, and on again once the probes show the answers fitting."""

from __future__ import annotations

from qwenspark.optimism import PROBE_EVERY, Optimism


def test_optimism_follows_the_share_of_fitting_first_answers_both_ways() -> None:
    rule = Optimism(min_fit=0.6, window=8)
    assert rule.share() is None and rule.choose()
    rule.record(False)
    assert rule.choose(), "a quarter of the window (2) is not yet seen: still learning"
    rule.record(False)
    choices = [rule.choose() for _ in range(2 * PROBE_EVERY)]
    assert rule.share() == 0.0
    assert [i for i, c in enumerate(choices) if c] == [PROBE_EVERY - 1, 2 * PROBE_EVERY - 1], "probes only"
    for _ in range(8):  # the probes' answers fit (another model, other reviews): the window fills with them
        rule.record(True)
    assert rule.share() == 1.0 and all(rule.choose() for _ in range(PROBE_EVERY))
    for n in range(1, 9):  # each misfit pushes a fitting answer out of the window
        rule.record(False)
        assert rule.share() == (8 - n) / 8


def test_a_share_at_the_bound_stays_optimistic_and_zero_never_turns_it_off() -> None:
    rule = Optimism(min_fit=0.5, window=4)
    for fitted in (True, False, True, False):
        rule.record(fitted)
    assert rule.share() == 0.5 and rule.choose()
    never = Optimism(min_fit=0.0, window=4)
    for _ in range(4):
        never.record(False)
    assert all(never.choose() for _ in range(50))
