"""The dashboard's reads: request filters validated, then one parameterised query per chart over the v_dash_* views."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# A query the dashboard runs: SQL with %s placeholders and its parameters -> rows as dicts.
Fetch = Callable[[str, Sequence[Any]], list[dict[str, Any]]]

LABELS = ("positive", "negative", "neutral", "mixed")
MAX_DAYS = 3660  # ten years a request: the trend is one point a day
LANG = re.compile(r"^[A-Za-z0-9_-]{1,8}$")
HOTEL_MAX = 64  # hotel_id is VARCHAR(64)


class BadRequest(ValueError):
    """A request parameter the dashboard refuses (HTTP 400 with this reason)."""


class NotFound(LookupError):
    """A hotel or review the results do not hold (HTTP 404)."""


@dataclass(frozen=True)
class Filters:
    """What every chart is filtered by: a date range (inclusive), optionally one hotel and one language."""

    start: dt.date
    end: dt.date
    hotel: str | None = None
    lang: str | None = None  # '' = reviews with no language

    def conditions(self, *, hotel: bool = True) -> tuple[str, list[Any]]:
        """' AND ...' conditions on hotel (unless hotel=False) and language, and their parameters."""
        sql, params = "", list[Any]()
        if hotel and self.hotel is not None:
            sql, params = sql + " AND hotel_id = %s", [*params, self.hotel]
        if self.lang is not None:
            sql, params = sql + " AND lang = %s", [*params, self.lang]
        return sql, params


def _month(day: dt.date) -> dt.date:
    return day.replace(day=1)


def _next_month(day: dt.date) -> dt.date | None:
    """The first day of the month after day's (None past 9999-12)."""
    if day.month < 12:
        return dt.date(day.year, day.month + 1, 1)
    return dt.date(day.year + 1, 1, 1) if day.year < dt.MAXYEAR else None


def split(start: dt.date, end: dt.date) -> tuple[list[tuple[dt.date, dt.date]], tuple[dt.date, dt.date] | None]:
    """A range as the whole months in it (first and last month, from the monthly rollups) and the day ranges left
    at its edges (from the daily rows); no months when it holds no whole month."""
    first = start if start.day == 1 else _next_month(start)
    after_end = _next_month(end)
    last = _month(end) if after_end is not None and end == after_end - dt.timedelta(days=1) else None
    if last is None:  # end is not a month's last day: the months end before end's month
        before = _month(end) - dt.timedelta(days=1) if _month(end) > dt.date.min else None
        last = _month(before) if before is not None else None
    if first is None or last is None or first > last:
        return [(start, end)], None
    edges = []
    if start < first:
        edges.append((start, first - dt.timedelta(days=1)))
    after = _next_month(last)
    if after is not None and after <= end:
        edges.append((after, end))
    return edges, (first, last)


def _rows(f: Filters, columns: str, *, aspects: bool = False, hotel: bool = True, bucket: bool = False,
          among: list[str] | None = None) -> tuple[str, list[Any]]:
    """A derived table of f's rows from the daily and the monthly views (UNION ALL), with `columns`; bucket=True
    adds the month of each row as `bucket`; among limits it to these hotels. Whole months are read from the
    monthly rollups: a long range reads a row per hotel, language and month instead of one per day."""
    daily, monthly = ("v_dash_aspects", "v_dash_aspects_monthly") if aspects else ("v_dash_daily", "v_dash_monthly")
    extra, extra_params = f.conditions(hotel=hotel)
    if among:
        extra, extra_params = extra + f" AND hotel_id IN ({', '.join(['%s'] * len(among))})", [*extra_params, *among]
    edges, months = split(f.start, f.end)
    parts, params = [], []
    day_bucket = "day - INTERVAL (DAYOFMONTH(day) - 1) DAY AS bucket, " if bucket else ""
    for lo, hi in edges:
        parts.append(f"SELECT {day_bucket}{columns} FROM {daily} WHERE day BETWEEN %s AND %s{extra}")
        params += [lo, hi, *extra_params]
    if months is not None:
        month_bucket = "month AS bucket, " if bucket else ""
        parts.append(f"SELECT {month_bucket}{columns} FROM {monthly} WHERE month BETWEEN %s AND %s{extra}")
        params += [*months, *extra_params]
    return "(" + " UNION ALL ".join(parts) + ") AS r", params


def _date(name: str, raw: str) -> dt.date:
    try:
        return dt.date.fromisoformat(raw)
    except ValueError:
        raise BadRequest(f"{name}: expected a date as YYYY-MM-DD, got {raw[:40]!r}") from None


def parse_filters(args: dict[str, str], bounds: tuple[dt.date | None, dt.date | None], default_days: int) -> Filters:
    """Filters from query parameters from, to, hotel, lang; a missing range is the last default_days with data."""
    unknown = sorted(set(args) - {"from", "to", "hotel", "lang"})
    if unknown:
        raise BadRequest(f"unknown parameter {unknown[0][:40]!r}: expected from, to, hotel, lang")
    last = bounds[1] or dt.datetime.now(dt.UTC).date()
    end = _date("to", args["to"]) if args.get("to") else last
    start = _date("from", args["from"]) if args.get("from") else default_start(bounds, end, default_days)
    if start > end:
        raise BadRequest(f"from ({start}) is after to ({end})")
    if (end - start).days + 1 > MAX_DAYS:
        raise BadRequest(f"the range spans {(end - start).days + 1} days; at most {MAX_DAYS}")
    hotel = args.get("hotel") or None
    if hotel is not None and len(hotel) > HOTEL_MAX:
        raise BadRequest(f"hotel: at most {HOTEL_MAX} characters")
    lang = args.get("lang")
    if lang in (None, "", "all"):
        lang = None
    elif lang == "none":
        lang = ""
    elif not LANG.match(lang):
        raise BadRequest("lang: expected a language code (letters, digits, - or _; at most 8), 'none' or 'all'")
    return Filters(start, end, hotel, lang)


def default_start(bounds: tuple[dt.date | None, dt.date | None], end: dt.date, days: int) -> dt.date:
    """The first day of the default range: `days` days up to end, not before the first day with results."""
    start = end - dt.timedelta(days=min(days - 1, (end - dt.date.min).days))
    return max(start, bounds[0]) if bounds[0] is not None and bounds[0] <= end else start


def bounds(fetch: Fetch) -> tuple[dt.date | None, dt.date | None]:
    """The first and last day that have results (None, None on an empty database)."""
    row = fetch("SELECT MIN(day) AS first, MAX(day) AS last FROM v_dash_daily", [])[0]
    return row["first"], row["last"]


def require_hotel(fetch: Fetch, hotel: str | None) -> None:
    """Raise NotFound when a hotel is named that has no results at all."""
    if hotel is not None and not fetch("SELECT 1 AS found FROM v_dash_daily WHERE hotel_id = %s LIMIT 1", [hotel]):
        raise NotFound(f"no results for hotel {hotel[:64]!r}")


def _counts(row: dict[str, Any] | None) -> dict[str, int]:
    keys = ("reviews", "analysed", *LABELS, "errors")
    return {k: int((row or {}).get(k) or 0) for k in keys}


def _sum(rows: list[dict[str, int]]) -> dict[str, int]:
    return {k: sum(r[k] for r in rows) for k in _counts(None)}


COUNTS = "reviews, analysed, positive, negative, neutral, mixed, errors"
_SUMS = ("SUM(reviews) AS reviews, SUM(analysed) AS analysed, SUM(positive) AS positive, SUM(negative) AS negative, "
         "SUM(neutral) AS neutral, SUM(mixed) AS mixed, SUM(errors) AS errors")


def _by(fetch: Fetch, f: Filters, key: str, *, hotel: bool = True) -> list[dict[str, Any]]:
    """Counts of f's range grouped by key (lang or hotel_id)."""
    table, params = _rows(f, f"{key}, {COUNTS}", hotel=hotel)
    return fetch(f"SELECT {key}, {_SUMS} FROM {table} GROUP BY {key}", params)


def mix(fetch: Fetch, f: Filters) -> dict[str, Any]:
    """Sentiment mix over all hotels and for the selected hotel, and the review count per language (every
    language: the filter's choices)."""
    every_lang = Filters(f.start, f.end)
    langs = _by(fetch, every_lang, "lang")
    chosen = [r for r in langs if f.lang is None or r["lang"] == f.lang]
    hotel = _sum([_counts(r) for r in _by(fetch, f, "lang")]) if f.hotel is not None else None
    by_lang = sorted(({"lang": r["lang"], "reviews": int(r["reviews"])} for r in langs),
                     key=lambda x: (-x["reviews"], x["lang"]))
    return {"overall": _sum([_counts(r) for r in chosen]), "hotel": hotel, "langs": by_lang}


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


# Longer ranges are drawn per month (from the monthly rollups): a daily line of years is unreadable anyway.
DAILY_TREND_DAYS = 184


def trend(fetch: Fetch, f: Filters) -> dict[str, Any]:
    """Per day of the range, or per month past DAILY_TREND_DAYS days (periods without reviews included, with no
    share): volume, errors, positive and negative share."""
    if (f.end - f.start).days + 1 <= DAILY_TREND_DAYS:
        extra, extra_params = f.conditions()
        rows = {r["day"]: _counts(r) for r in fetch(
            f"SELECT day, {_SUMS} FROM v_dash_daily WHERE day BETWEEN %s AND %s{extra} GROUP BY day",
            [f.start, f.end, *extra_params])}
        periods = [f.start + dt.timedelta(days=i) for i in range((f.end - f.start).days + 1)]
        labels = [d.isoformat() for d in periods]
        granularity = "day"
    else:
        table, params = _rows(f, COUNTS, bucket=True)
        rows = {r["bucket"]: _counts(r) for r in fetch(f"SELECT bucket, {_SUMS} FROM {table} GROUP BY bucket", params)}
        periods, month = [], _month(f.start)
        while month is not None and month <= f.end:
            periods.append(month)
            month = _next_month(month)  # type: ignore[assignment]
        labels = [m.strftime("%Y-%m") for m in periods]
        granularity = "month"
    out: dict[str, Any] = {"granularity": granularity, "days": labels, "reviews": [], "errors": [],
                           "share_positive": [], "share_negative": []}
    for period in periods:
        c = rows.get(period, _counts(None))
        out["reviews"].append(c["reviews"])
        out["errors"].append(c["errors"])
        out["share_positive"].append(_share(c["positive"], c["analysed"]))
        out["share_negative"].append(_share(c["negative"], c["analysed"]))
    return out


def _busiest(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per-hotel rows, most reviews first (then by id)."""
    return sorted(rows, key=lambda r: (-int(r["reviews"] or 0), r["hotel_id"]))


def _net(c: dict[str, int]) -> float | None:
    return round((c["positive"] - c["negative"]) / c["analysed"], 4) if c["analysed"] else None


def ranking(fetch: Fetch, f: Filters, top: int) -> dict[str, Any]:
    """The `top` hotels by volume, ranked by net sentiment ((positive - negative) / analysed), and the rest as one
    'others' entry; the selected hotel is always among them. Also the 200 busiest hotels, for the hotel picker."""
    per_hotel = _busiest(_by(fetch, f, "hotel_id", hotel=False))
    chosen = per_hotel[:top]
    if f.hotel is not None and all(r["hotel_id"] != f.hotel for r in chosen):
        chosen = chosen[: top - 1] + [r for r in per_hotel if r["hotel_id"] == f.hotel]
    hotels = [{"hotel_id": r["hotel_id"], **_counts(r), "net": _net(_counts(r))} for r in chosen]
    hotels.sort(key=lambda h: (h["net"] is None, -(h["net"] or 0), -h["reviews"], h["hotel_id"]))
    total = _sum([_counts(r) for r in per_hotel])
    rest = {k: total[k] - sum(h[k] for h in hotels) for k in total}
    others = ({"hotels": len(per_hotel) - len(hotels), **rest, "net": _net(rest)}
              if len(per_hotel) > len(hotels) else None)
    return {"hotels": hotels, "others": others, "hotel_count": len(per_hotel),
            "picker": [{"hotel_id": r["hotel_id"], "reviews": int(r["reviews"])} for r in per_hotel[:200]]}


def heatmap(fetch: Fetch, f: Filters, top: int) -> dict[str, Any]:
    """Share of negative mentions per aspect (rows) and hotel (columns: the busiest `top`, the selected hotel, then
    'others'), with the mention counts."""
    hotels = [r["hotel_id"] for r in _busiest(_by(fetch, f, "hotel_id", hotel=False))[:top]]
    if f.hotel is not None and f.hotel not in hotels:
        hotels = [*hotels[:top - 1], f.hotel]
    cells: dict[tuple[str, str], tuple[int, int]] = {}
    totals: dict[str, tuple[int, int]] = {}
    table, params = _rows(f, "aspect, mentions, negative", aspects=True, hotel=False)
    for r in fetch(f"SELECT aspect, SUM(mentions) AS mentions, SUM(negative) AS negative FROM {table} "
                   "GROUP BY aspect", params):
        totals[r["aspect"]] = (int(r["mentions"]), int(r["negative"]))
    if hotels:
        table, params = _rows(f, "hotel_id, aspect, mentions, negative", aspects=True, hotel=False, among=hotels)
        for r in fetch(f"SELECT hotel_id, aspect, SUM(mentions) AS mentions, SUM(negative) AS negative FROM {table} "
                       "GROUP BY hotel_id, aspect", params):
            cells[(r["hotel_id"], r["aspect"])] = (int(r["mentions"]), int(r["negative"]))
    aspects = sorted(totals, key=lambda a: (-totals[a][0], a))
    others = {a: (totals[a][0] - sum(cells.get((h, a), (0, 0))[0] for h in hotels),
                  totals[a][1] - sum(cells.get((h, a), (0, 0))[1] for h in hotels)) for a in aspects}
    has_others = any(m for m, _ in others.values())
    data = []  # [column index, aspect index, share negative, mentions]
    for x, hotel in enumerate(hotels):
        for y, aspect in enumerate(aspects):
            m, n = cells.get((hotel, aspect), (0, 0))
            if m:
                data.append([x, y, round(n / m, 4), m])
    if has_others:
        for y, aspect in enumerate(aspects):
            m, n = others[aspect]
            if m:
                data.append([len(hotels), y, round(n / m, 4), m])
    return {"hotels": hotels, "others": has_others, "aspects": aspects, "cells": data}


def _aspects(raw: Any) -> list[dict[str, str]]:
    try:
        items = json.loads(raw) if isinstance(raw, (str, bytes)) else raw
    except ValueError:
        return []
    return [{"aspect": str(a.get("aspect")), "sentiment": str(a.get("sentiment"))}
            for a in items or [] if isinstance(a, dict) and a.get("aspect")]


def _review(r: dict[str, Any]) -> dict[str, Any]:
    created = r["review_created_at"]
    return {"review_id": str(r["review_id"]),  # a string: BIGINT ids pass JavaScript's 2^53
            "hotel_id": r["hotel_id"], "created_at": created.isoformat(sep=" ") if created else None,
            "lang": r["lang"], "sentiment": r["sentiment"], "summary": r["summary"],
            "aspects": _aspects(r["aspects"]), "text": r["text"]}


def latest_reviews(fetch: Fetch, f: Filters, limit: int) -> list[dict[str, Any]]:
    """The newest negative and mixed reviews of the range, with their summary, aspects and text."""
    start = dt.datetime.combine(f.start, dt.time())
    end = dt.datetime.combine(f.end + dt.timedelta(days=1), dt.time()) if f.end < dt.date.max else dt.datetime.max
    sql = ("SELECT review_id, hotel_id, review_created_at, lang, sentiment, summary, aspects, text FROM v_dash_reviews "
           "WHERE review_created_at >= %s AND review_created_at < %s AND sentiment IN ('negative', 'mixed')")
    params: list[Any] = [start, end]
    if f.hotel is not None:
        sql, params = sql + " AND hotel_id = %s", [*params, f.hotel]
    if f.lang is not None:
        sql, params = sql + " AND lang = %s", [*params, f.lang]
    rows = fetch(sql + " ORDER BY review_created_at DESC, review_id DESC LIMIT %s", [*params, limit])
    return [_review(r) for r in rows]


def review(fetch: Fetch, review_id: str) -> dict[str, Any]:
    """One review's result and text (NotFound when there is none)."""
    if not re.fullmatch(r"-?[0-9]{1,19}", review_id):
        raise BadRequest("review id: expected an integer")
    value = int(review_id)
    if not -(2**63) <= value < 2**63:
        raise BadRequest("review id: out of the BIGINT range")
    rows = fetch("SELECT review_id, hotel_id, review_created_at, lang, sentiment, summary, aspects, text, failed, "
                 "analysed_at FROM v_dash_reviews WHERE review_id = %s", [value])
    if not rows:
        raise NotFound(f"no result for review {value}")
    r = rows[0]
    return {**_review(r), "failed": bool(r["failed"]), "analysed_at": r["analysed_at"].isoformat(sep=" ")}


def runs(fetch: Fetch, limit: int = 20) -> dict[str, Any]:
    """The last runs of the jobs (newest first) with their throughput, and the error rate over them."""
    rows = fetch("SELECT run_id, job, status, started_at, finished_at, rows_selected, rows_analysed, rows_ok, "
                 "rows_error, rows_changed, seconds_total, seconds_analyse, model, prompt_version, message "
                 "FROM v_dash_runs ORDER BY started_at DESC LIMIT %s", [limit])
    out = []
    for r in rows:
        analysed, seconds = int(r["rows_analysed"] or 0), r["seconds_total"]
        out.append({
            "run_id": r["run_id"], "job": r["job"], "status": r["status"],
            "started_at": r["started_at"].isoformat(sep=" ", timespec="seconds"),
            "finished_at": r["finished_at"].isoformat(sep=" ", timespec="seconds") if r["finished_at"] else None,
            "rows_selected": r["rows_selected"], "rows_analysed": analysed, "rows_error": int(r["rows_error"] or 0),
            "rows_changed": r["rows_changed"],
            "rows_per_s": round(analysed / seconds, 2) if seconds and analysed else None,
            "model": r["model"], "prompt_version": r["prompt_version"], "message": r["message"],
        })
    analysed = sum(r["rows_analysed"] for r in out)
    errors = sum(r["rows_error"] for r in out)
    finished = [r["finished_at"] for r in out if r["status"] == "succeeded" and r["finished_at"]]
    return {"runs": out, "error_rate": _share(errors, analysed), "rows_analysed": analysed, "rows_error": errors,
            "last_success": max(finished) if finished else None}
