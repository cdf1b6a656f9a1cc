"""The dashboard's split of a date range into whole months (monthly rollups) and edge days (daily rows)."""

from __future__ import annotations

import datetime as dt
import random

from qwenspark.dashboard.queries import split

D = dt.date


def _days(lo: dt.date, hi: dt.date) -> list[dt.date]:
    return [lo + dt.timedelta(days=i) for i in range((hi - lo).days + 1)]


def _covered(start: dt.date, end: dt.date) -> list[dt.date]:
    """Every day the split reads, once per time it reads it (edges per day, months as all their days)."""
    edges, months = split(start, end)
    out = [d for lo, hi in edges for d in _days(lo, hi)]
    if months is not None:
        first, last = months
        assert first.day == 1 and last.day == 1, months
        month = first
        while month <= last:
            nxt = D(month.year + month.month // 12, month.month % 12 + 1, 1) if month < D(9999, 12, 1) else None
            out += _days(month, (nxt - dt.timedelta(days=1)) if nxt else D.max)
            if nxt is None:
                break
            month = nxt
    return out


def _ranges() -> list[tuple[dt.date, dt.date]]:
    rng = random.Random(7)
    fixed = [(D(2026, 1, 1), D(2026, 1, 31)), (D(2026, 1, 2), D(2026, 1, 30)), (D(2026, 1, 31), D(2026, 2, 1)),
             (D(2025, 12, 15), D(2026, 3, 14)), (D(2024, 2, 1), D(2024, 2, 29)), (D(2026, 5, 5), D(2026, 5, 5)),
             (D(9999, 11, 20), D(9999, 12, 31)), (D(9999, 12, 1), D(9999, 12, 31)), (D.min, D(1, 3, 3)),
             (D.min, D(1, 1, 31)), (D(2024, 1, 1), D(2026, 12, 31))]
    random_ones = []
    for _ in range(300):
        start = D(2020, 1, 1) + dt.timedelta(days=rng.randrange(3000))
        random_ones.append((start, start + dt.timedelta(days=rng.choice([0, 1, 27, 30, 59, 200, 1000]))))
    return fixed + random_ones


def test_the_split_reads_every_day_of_the_range_exactly_once() -> None:
    for start, end in _ranges():  # no day missed, none outside, none twice
        assert sorted(_covered(start, end)) == _days(start, end), (start, end)


def test_whole_months_come_from_the_rollups() -> None:
    assert split(D(2024, 1, 1), D(2026, 12, 31)) == ([], (D(2024, 1, 1), D(2026, 12, 1)))
    assert split(D(2025, 12, 15), D(2026, 3, 14)) == (
        [(D(2025, 12, 15), D(2025, 12, 31)), (D(2026, 3, 1), D(2026, 3, 14))], (D(2026, 1, 1), D(2026, 2, 1)))
    assert split(D(2026, 1, 2), D(2026, 1, 30)) == ([(D(2026, 1, 2), D(2026, 1, 30))], None)
