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

    def where(self, *, hotel: bool = True, day: str = "day") -> tuple[str, list[Any]]:
        """The WHERE clause and its parameters (the hotel condition left out when hotel=False)."""
        params: list[Any]
        sql, params = f"{day} BETWEEN %s AND %s", [self.start, self.end]  # list[Any]: mixed types follow
        if hotel and self.hotel is not None:
            sql, params = sql + " AND hotel_id = %s", [*params, self.hotel]
        if self.lang is not None:
            sql, params = sql + " AND lang = %s", [*params, self.lang]
        return sql, params


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


_SUMS = ("SUM(reviews) AS reviews, SUM(analysed) AS analysed, SUM(positive) AS positive, SUM(negative) AS negative, "
         "SUM(neutral) AS neutral, SUM(mixed) AS mixed, SUM(errors) AS errors")


def mix(fetch: Fetch, f: Filters) -> dict[str, Any]:
    """Sentiment mix over all hotels and for the selected hotel, and the review count per language."""
    where, params = f.where(hotel=False)
    overall = _counts(fetch(f"SELECT {_SUMS} FROM v_dash_daily WHERE {where}", params)[0])
    hotel = None
    if f.hotel is not None:
        where_h, params_h = f.where()
        hotel = _counts(fetch(f"SELECT {_SUMS} FROM v_dash_daily WHERE {where_h}", params_h)[0])
    # Languages over the range for every language (the filter's choices), not only the selected one.
    langs = fetch(
        "SELECT lang, SUM(reviews) AS reviews FROM v_dash_daily WHERE day BETWEEN %s AND %s GROUP BY lang "
        "ORDER BY reviews DESC", [f.start, f.end])
    by_lang = [{"lang": r["lang"], "reviews": int(r["reviews"])} for r in langs]
    return {"overall": overall, "hotel": hotel, "langs": by_lang}


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def trend(fetch: Fetch, f: Filters) -> dict[str, Any]:
    """Per day of the range (days without reviews included, with no share): volume, positive and negative share."""
    where, params = f.where()
    rows = {r["day"]: _counts(r) for r in fetch(
        f"SELECT day, {_SUMS} FROM v_dash_daily WHERE {where} GROUP BY day", params)}
    days = [f.start + dt.timedelta(days=i) for i in range((f.end - f.start).days + 1)]
    out: dict[str, list[Any]] = {"days": [], "reviews": [], "errors": [], "share_positive": [], "share_negative": []}
    for day in days:
        c = rows.get(day, _counts(None))
        out["days"].append(day.isoformat())
        out["reviews"].append(c["reviews"])
        out["errors"].append(c["errors"])
        out["share_positive"].append(_share(c["positive"], c["analysed"]))
        out["share_negative"].append(_share(c["negative"], c["analysed"]))
    return out


def _top_hotels(fetch: Fetch, f: Filters, limit: int) -> list[dict[str, Any]]:
    """The hotels with the most reviews in the range (and language), with their counts, most first."""
    where, params = f.where(hotel=False)
    return fetch(
        f"SELECT hotel_id, {_SUMS} FROM v_dash_daily WHERE {where} GROUP BY hotel_id "
        "ORDER BY reviews DESC, hotel_id LIMIT %s", [*params, limit])


def _net(c: dict[str, int]) -> float | None:
    return round((c["positive"] - c["negative"]) / c["analysed"], 4) if c["analysed"] else None


def ranking(fetch: Fetch, f: Filters, top: int) -> dict[str, Any]:
    """The `top` hotels by volume, ranked by net sentiment ((positive - negative) / analysed), and the rest as one
    'others' entry; the selected hotel is always among them. Also the 200 busiest hotels, for the hotel picker."""
    where, params = f.where(hotel=False)
    row = fetch(f"SELECT {_SUMS}, COUNT(DISTINCT hotel_id) AS hotels FROM v_dash_daily WHERE {where}", params)[0]
    total, hotels_total = _counts(row), int(row["hotels"] or 0)
    busiest = _top_hotels(fetch, f, max(top, 200))
    chosen = busiest[:top]
    if f.hotel is not None and all(r["hotel_id"] != f.hotel for r in chosen):
        sel_where, sel_params = f.where()
        selected = fetch(f"SELECT hotel_id, {_SUMS} FROM v_dash_daily WHERE {sel_where} GROUP BY hotel_id",
                         sel_params)
        chosen = chosen[: top - 1] + selected
    hotels = []
    for r in chosen:
        c = _counts(r)
        hotels.append({"hotel_id": r["hotel_id"], **c, "net": _net(c)})
    hotels.sort(key=lambda h: (h["net"] is None, -(h["net"] or 0), -h["reviews"], h["hotel_id"]))
    rest = {k: total[k] - sum(h[k] for h in hotels) for k in total}
    others = {"hotels": hotels_total - len(hotels), **rest, "net": _net(rest)} if hotels_total > len(hotels) else None
    return {"hotels": hotels, "others": others, "hotel_count": hotels_total,
            "picker": [{"hotel_id": r["hotel_id"], "reviews": int(r["reviews"])} for r in busiest]}


def heatmap(fetch: Fetch, f: Filters, top: int) -> dict[str, Any]:
    """Share of negative mentions per aspect (rows) and hotel (columns: the busiest `top`, the selected hotel, then
    'others'), with the mention counts."""
    where, params = f.where(hotel=False)
    hotels = [r["hotel_id"] for r in _top_hotels(fetch, f, top)]
    if f.hotel is not None and f.hotel not in hotels:
        hotels = [*hotels[:top - 1], f.hotel]
    cells: dict[tuple[str, str], tuple[int, int]] = {}
    totals: dict[str, tuple[int, int]] = {}
    for r in fetch(f"SELECT aspect, SUM(mentions) AS mentions, SUM(negative) AS negative FROM v_dash_aspects "
                   f"WHERE {where} GROUP BY aspect", params):
        totals[r["aspect"]] = (int(r["mentions"]), int(r["negative"]))
    if hotels:
        marks = ", ".join(["%s"] * len(hotels))
        for r in fetch(f"SELECT hotel_id, aspect, SUM(mentions) AS mentions, SUM(negative) AS negative "
                       f"FROM v_dash_aspects WHERE {where} AND hotel_id IN ({marks}) GROUP BY hotel_id, aspect",
                       [*params, *hotels]):
            cells[(r["hotel_id"], r["aspect"])] = (int(r["mentions"]), int(r["negative"]))
    aspects = sorted(totals, key=lambda a: (-totals[a][0], a))
    columns = list(hotels)
    others = {a: (totals[a][0] - sum(cells.get((h, a), (0, 0))[0] for h in hotels),
                  totals[a][1] - sum(cells.get((h, a), (0, 0))[1] for h in hotels)) for a in aspects}
    has_others = any(m for m, _ in others.values())
    data = []  # [column index, aspect index, share negative, mentions]
    for x, hotel in enumerate(columns):
        for y, aspect in enumerate(aspects):
            m, n = cells.get((hotel, aspect), (0, 0))
            if m:
                data.append([x, y, round(n / m, 4), m])
    if has_others:
        for y, aspect in enumerate(aspects):
            m, n = others[aspect]
            if m:
                data.append([len(columns), y, round(n / m, 4), m])
    return {"hotels": columns, "others": has_others, "aspects": aspects, "cells": data}


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
