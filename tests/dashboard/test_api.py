"""The dashboard's JSON API on the test MariaDB, as the read-only account: each chart's figures from known rows,
400 for bad parameters, 404 for unknown hotels, 503 (not a trace) for a database that is gone, no writes."""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator

import mysql.connector
import pytest
from starlette.testclient import TestClient

from qwenspark.config import QwenSparkConfig
from qwenspark.dashboard.app import Pool, create_app
from tests.dashboard.conftest import BIGINT_MAX, HOSTILE_SUMMARY, dashboard_cfg, insert_results
from tests.spark.conftest import reset_tables

RANGE = "from=2026-03-01&to=2026-03-05"


@pytest.fixture
def client(known: QwenSparkConfig) -> Iterator[TestClient]:
    with TestClient(create_app(known), raise_server_exceptions=False) as c:
        yield c


def get(client: TestClient, path: str, status: int = 200) -> dict:  # type: ignore[type-arg]
    r = client.get(path)
    assert r.status_code == status, (path, r.status_code, r.text)
    assert r.headers["content-type"].startswith("application/json")
    return r.json()  # type: ignore[no-any-return]


def test_mix_counts_every_label_and_the_selected_hotel(client: TestClient) -> None:
    mix = get(client, f"/api/mix?{RANGE}")
    assert mix["overall"] == {"reviews": 6, "analysed": 5, "positive": 2, "negative": 2, "neutral": 0, "mixed": 1,
                              "errors": 1}
    assert mix["hotel"] is None
    assert {x["lang"]: x["reviews"] for x in mix["langs"]} == {"en": 3, "zh": 2, "": 1}
    one = get(client, f"/api/mix?{RANGE}&hotel=H01")
    assert one["hotel"] == {"reviews": 3, "analysed": 3, "positive": 1, "negative": 1, "neutral": 0, "mixed": 1,
                            "errors": 0}
    assert one["overall"]["reviews"] == 6
    zh = get(client, f"/api/mix?{RANGE}&lang=zh")
    assert zh["overall"]["positive"] == 1 and zh["overall"]["negative"] == 1 and zh["overall"]["reviews"] == 2
    none = get(client, f"/api/mix?{RANGE}&lang=none")
    assert none["overall"]["errors"] == 1 and none["overall"]["reviews"] == 1


def test_trend_has_every_day_of_the_range_and_no_share_on_empty_days(client: TestClient) -> None:
    t = get(client, f"/api/trend?{RANGE}")
    assert t["days"] == ["2026-03-01", "2026-03-02", "2026-03-03", "2026-03-04", "2026-03-05"]
    assert t["reviews"] == [3, 1, 2, 0, 0]
    assert t["share_positive"] == [round(1 / 3, 4), 0.0, 1.0, None, None]
    assert t["share_negative"] == [round(2 / 3, 4), 0.0, 0.0, None, None]
    assert get(client, f"/api/trend?{RANGE}&hotel=H02")["reviews"] == [1, 0, 1, 0, 0]


def test_default_range_ends_on_the_last_day_with_results(client: TestClient) -> None:
    meta = get(client, "/api/meta")
    assert (meta["first_day"], meta["last_day"], meta["default_to"]) == ("2026-03-01", "2026-03-03", "2026-03-03")
    assert meta["default_from"] == "2026-03-01"  # not before the first day with results
    assert get(client, "/api/trend")["days"] == ["2026-03-01", "2026-03-02", "2026-03-03"]


def test_ranking_orders_by_net_sentiment_and_counts_the_others(known: QwenSparkConfig) -> None:
    cfg = known.model_copy(update={"dashboard": known.dashboard.model_copy(update={"top_hotels": 3})})
    with TestClient(create_app(cfg)) as client:
        r = get(client, f"/api/ranking?{RANGE}")
    # H02: +1 -1 of 2 -> 0; H01: +1 -1 of 3 -> 0 (more reviews first on a tie); H03: nothing analysed -> last.
    assert [(h["hotel_id"], h["net"]) for h in r["hotels"]] == [("H01", 0.0), ("H02", 0.0), ("H03", None)]
    assert r["others"] is None and r["hotel_count"] == 3
    insert_results(known, [(100 + i, f"X{i:02d}", "2026-03-02 10:00:00", "en", "positive", "ok", [], None, "ok")
                           for i in range(5)])
    with TestClient(create_app(cfg)) as client:
        r = get(client, f"/api/ranking?{RANGE}&hotel=H03")
    assert len(r["hotels"]) == 3 and "H03" in [h["hotel_id"] for h in r["hotels"]]  # the selected one is kept
    assert r["hotel_count"] == 8
    assert r["others"]["hotels"] == 5
    assert sum(h["reviews"] for h in r["hotels"]) + r["others"]["reviews"] == 11


def test_heatmap_shares_negative_per_aspect_and_hotel(client: TestClient) -> None:
    h = get(client, f"/api/heatmap?{RANGE}")
    cells = {(h["hotels"][x], h["aspects"][y]): (share, mentions) for x, y, share, mentions in h["cells"]}
    assert cells[("H02", "service")] == (1.0, 1)
    assert cells[("H01", "service")] == (0.0, 1)
    assert cells[("H01", "cleanliness")] == (1.0, 1)
    assert h["aspects"][0] == "service"  # the most mentioned aspect first
    assert h["others"] is False


def test_latest_reviews_are_negative_or_mixed_newest_first_with_text(client: TestClient) -> None:
    rows = get(client, f"/api/reviews?{RANGE}")
    assert [r["review_id"] for r in rows] == ["3", "2", str(BIGINT_MAX)]  # ids as strings: past 2^53
    hostile = rows[2]
    assert hostile["summary"] == HOSTILE_SUMMARY and hostile["aspects"] == [{"aspect": "service",
                                                                           "sentiment": "negative"}]
    assert hostile["text"].startswith("<script>")
    assert get(client, f"/api/reviews?{RANGE}&lang=zh")[0]["summary"] == "房间很脏"
    one = get(client, f"/api/review/{BIGINT_MAX}")
    assert one["hotel_id"] == "H02" and one["failed"] is False


def test_runs_report_status_throughput_and_error_rate(client: TestClient) -> None:
    h = get(client, "/api/runs")
    assert [r["status"] for r in h["runs"]] == ["succeeded", "failed"]
    assert h["runs"][0]["rows_per_s"] == 2.0 and h["error_rate"] == round(1 / 6, 4)
    assert h["last_success"] == "2026-03-04 01:01:30"


@pytest.mark.parametrize(("path", "status", "reason"), [
    ("/api/mix?from=2026-13-01", 400, "from: expected a date"),
    ("/api/mix?from=2026-03-05&to=2026-03-01", 400, "is after"),
    ("/api/trend?from=1000-01-01&to=9999-12-31", 400, "at most 3660"),
    ("/api/mix?lang=%3Cscript%3E", 400, "lang"),
    ("/api/mix?hotel=" + "x" * 65, 400, "at most 64"),
    ("/api/mix?hotel=NOPE", 404, "no results for hotel"),
    ("/api/mix?limit=5", 400, "unknown parameter"),
    ("/api/review/abc", 400, "integer"),
    ("/api/review/99999999999999999999", 400, "integer"),
    ("/api/review/42", 404, "no result for review 42"),
    ("/api/nothing", 404, "not found"),
])
def test_bad_parameters_get_a_reason_not_a_500(client: TestClient, path: str, status: int, reason: str) -> None:
    body = get(client, path, status)
    assert reason in body["error"]
    assert "Traceback" not in body["error"]


def test_extreme_dates_are_answered(client: TestClient) -> None:
    assert get(client, "/api/trend?from=9999-12-01&to=9999-12-31")["reviews"] == [0] * 31
    assert get(client, "/api/reviews?from=9999-12-01&to=9999-12-31") == []
    assert get(client, "/api/mix?from=1000-01-01&to=1000-01-31")["overall"]["reviews"] == 0


def test_an_empty_database_answers_every_endpoint(empty: QwenSparkConfig) -> None:
    with TestClient(create_app(empty)) as client:
        meta = get(client, "/api/meta")
        assert meta["last_day"] is None
        for name in ("mix", "trend", "ranking", "heatmap", "reviews", "runs"):
            get(client, f"/api/{name}")
        assert get(client, "/api/ranking")["hotels"] == []
        assert get(client, "/api/heatmap")["cells"] == []


def test_ten_thousand_hotels_are_top_n_and_others(mariadb: dict[str, object]) -> None:
    cfg = dashboard_cfg(mariadb)
    reset_tables(cfg)
    insert_results(cfg, [(i, f"hotel-{i:05d}", f"2026-03-{1 + i % 28:02d} 10:00:00", "en" if i % 3 else "zh",
                          "negative" if i % 4 == 0 else "positive", "s", [("room", "negative" if i % 4 == 0
                          else "positive")], None, "t") for i in range(1, 10_001)])
    with TestClient(create_app(cfg)) as client:
        r = get(client, "/api/ranking?from=2026-03-01&to=2026-03-28")
        h = get(client, "/api/heatmap?from=2026-03-01&to=2026-03-28")
    assert len(r["hotels"]) == 20 and r["others"]["hotels"] == 9_980 and r["hotel_count"] == 10_000
    assert len(r["picker"]) == 200
    assert len(h["hotels"]) == 20 and h["others"] is True
    assert max(x for x, *_ in h["cells"]) == 20  # the 'others' column


def test_the_dashboard_account_cannot_write(known: QwenSparkConfig) -> None:
    pool = Pool(known.db.dashboard(), 1)
    assert pool.fetch("SELECT COUNT(*) AS n FROM v_dash_reviews", [])[0]["n"] == 6
    for sql in ("INSERT INTO review_sentiment (review_id) VALUES (7)", "INSERT INTO v_dash_daily (day) VALUES (NULL)",
                "UPDATE v_dash_daily SET reviews = 0", "DELETE FROM v_dash_reviews"):
        with pytest.raises(mysql.connector.Error) as err:
            pool.fetch(sql, [])
        assert err.value.errno in (1142, 1792), (sql, err.value)  # denied, or refused by the read-only session
    pool.close()


def test_a_database_that_is_gone_gives_503_without_details(mariadb: dict[str, object]) -> None:
    cfg = dashboard_cfg(mariadb, "db.port=1")  # nothing listens there
    with TestClient(create_app(cfg)) as client:
        r = client.get("/api/mix")
    assert r.status_code == 503 and r.json() == {"error": "database unavailable", "status": 503}


def test_the_page_and_echarts_are_served_with_a_strict_policy(client: TestClient) -> None:
    page = client.get("/")
    assert page.status_code == 200 and "static/vendor/echarts-6.1.0.min.js" in page.text
    assert "script-src 'self'" in page.headers["content-security-policy"]
    js = client.get("/static/vendor/echarts-6.1.0.min.js")
    assert js.status_code == 200 and len(js.content) > 500_000
    assert client.get("/static/vendor/ECHARTS-LICENSE").status_code == 200




def test_long_ranges_read_whole_months_from_the_rollups_with_the_same_figures(mariadb: dict[str, object]) -> None:
    """Ranges of months and years (whole months from the monthly rollups, edge days from the daily rows): every
    chart's figures equal those counted here from the rows written, and a trend past 184 days is per month."""
    cfg = dashboard_cfg(mariadb)
    reset_tables(cfg)
    labels = ["positive", "negative", "neutral", "mixed", "positive"]
    rows = [(i, f"M{i % 4}", f"{dt.date(2025, 1, 1) + dt.timedelta(days=(i * 7) % 420)} 10:00:00",
             ("en", "zh", None)[i % 3], labels[i % 5], f"s{i}", [("room", labels[(i + 1) % 5])], None, "t")
            for i in range(1, 241)]
    insert_results(cfg, rows)

    def expected(lo: dt.date, hi: dt.date, hotel: str | None = None) -> dict[str, int]:
        picked = [r for r in rows if lo <= dt.date.fromisoformat(r[2][:10]) <= hi and hotel in (None, r[1])]
        return {"reviews": len(picked), "analysed": len(picked),
                **{label: sum(r[4] == label for r in picked) for label in ("positive", "negative", "neutral", "mixed")},
                "errors": 0}

    with TestClient(create_app(cfg)) as client:
        for lo, hi in [(dt.date(2025, 1, 10), dt.date(2026, 2, 13)), (dt.date(2025, 1, 1), dt.date(2025, 12, 31)),
                       (dt.date(2024, 12, 31), dt.date(2026, 3, 1))]:
            q = f"from={lo}&to={hi}"
            assert get(client, f"/api/mix?{q}")["overall"] == expected(lo, hi), q
            assert get(client, f"/api/mix?{q}&hotel=M1")["hotel"] == expected(lo, hi, "M1"), q
            ranking = {h["hotel_id"]: h["reviews"] for h in get(client, f"/api/ranking?{q}")["hotels"]}
            assert ranking == {f"M{k}": expected(lo, hi, f"M{k}")["reviews"] for k in range(4)}, q
            heat = get(client, f"/api/heatmap?{q}")
            mentions = {heat["hotels"][x]: m for x, _, _, m in heat["cells"]}
            assert mentions == {f"M{k}": expected(lo, hi, f"M{k}")["reviews"] for k in range(4)}, q
        trend = get(client, "/api/trend?from=2025-01-10&to=2026-02-13")
    assert trend["granularity"] == "month" and trend["days"][0] == "2025-01" and trend["days"][-1] == "2026-02"
    assert trend["reviews"][0] == expected(dt.date(2025, 1, 10), dt.date(2025, 1, 31))["reviews"]
    assert trend["reviews"][6] == expected(dt.date(2025, 7, 1), dt.date(2025, 7, 31))["reviews"]
    assert sum(trend["reviews"]) == expected(dt.date(2025, 1, 10), dt.date(2026, 2, 13))["reviews"]
