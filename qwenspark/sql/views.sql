-- Read-only views for the ECharts dashboard (grant the dashboard user SELECT on these only).

-- Pie chart: the sentiment mix over everything analysed.
CREATE OR REPLACE VIEW v_sentiment_mix AS
SELECT sentiment, COUNT(*) AS reviews, ROUND(COUNT(*) / SUM(COUNT(*)) OVER (), 4) AS share
FROM review_sentiment
WHERE error IS NULL
GROUP BY sentiment;

-- Line chart: per day, all hotels together.
CREATE OR REPLACE VIEW v_sentiment_trend_daily AS
SELECT day, SUM(reviews) AS reviews, SUM(analysed) AS analysed,
       SUM(positive) AS positive, SUM(negative) AS negative, SUM(neutral) AS neutral, SUM(mixed) AS mixed,
       SUM(errors) AS errors,
       ROUND(SUM(positive) / NULLIF(SUM(analysed), 0), 4) AS share_positive,
       ROUND(SUM(negative) / NULLIF(SUM(analysed), 0), 4) AS share_negative
FROM hotel_sentiment_daily
GROUP BY day;

-- Bar chart / table: per hotel, all days together.
CREATE OR REPLACE VIEW v_hotel_sentiment AS
SELECT hotel_id, SUM(reviews) AS reviews, SUM(analysed) AS analysed,
       SUM(positive) AS positive, SUM(negative) AS negative, SUM(neutral) AS neutral, SUM(mixed) AS mixed,
       SUM(errors) AS errors,
       ROUND(SUM(positive) / NULLIF(SUM(analysed), 0), 4) AS share_positive,
       ROUND(SUM(negative) / NULLIF(SUM(analysed), 0), 4) AS share_negative,
       MIN(day) AS first_day, MAX(day) AS last_day
FROM hotel_sentiment_daily
GROUP BY hotel_id;

-- Radar / stacked bars: per hotel and aspect, all days together.
CREATE OR REPLACE VIEW v_aspect_sentiment AS
SELECT hotel_id, aspect, SUM(mentions) AS mentions,
       SUM(positive) AS positive, SUM(negative) AS negative, SUM(neutral) AS neutral,
       ROUND(SUM(positive) / SUM(mentions), 4) AS share_positive,
       ROUND(SUM(negative) / SUM(mentions), 4) AS share_negative
FROM aspect_sentiment
GROUP BY hotel_id, aspect;

-- The web dashboard's views (qwenspark/dashboard): plain projections with no GROUP BY, so that the server merges
-- the dashboard's filters (date range, hotel, language) into them and uses the tables' keys; the dashboard
-- aggregates what it selects. Language '' stands for reviews with no language.
CREATE OR REPLACE VIEW v_dash_daily AS
SELECT day, hotel_id, lang, reviews, analysed, positive, negative, neutral, mixed, errors
FROM sentiment_daily_lang;

CREATE OR REPLACE VIEW v_dash_aspects AS
SELECT day, hotel_id, lang, aspect, mentions, positive, negative, neutral
FROM aspect_daily_lang;

-- The same per month (month = its first day): whole months of a long range are read from these.
CREATE OR REPLACE VIEW v_dash_monthly AS
SELECT month, hotel_id, lang, reviews, analysed, positive, negative, neutral, mixed, errors
FROM sentiment_monthly_lang;

CREATE OR REPLACE VIEW v_dash_aspects_monthly AS
SELECT month, hotel_id, lang, aspect, mentions, positive, negative, neutral
FROM aspect_monthly_lang;

-- One row per analysed review, with the first 600 characters of its text (NULL once it left the source table).
CREATE OR REPLACE VIEW v_dash_reviews AS
SELECT r.review_id, r.hotel_id, r.review_created_at, COALESCE(r.lang, '') AS lang, r.sentiment, r.summary,
       r.aspects, r.error IS NOT NULL AS failed, r.analysed_at, LEFT(h.text, 600) AS text
FROM review_sentiment r
LEFT JOIN hotel_reviews h ON h.review_id = r.review_id;

-- Run health: the jobs' ledger without the configuration hash.
CREATE OR REPLACE VIEW v_dash_runs AS
SELECT run_id, job, status, started_at, finished_at, rows_selected, rows_skipped, rows_analysed, rows_ok,
       rows_error, rows_truncated, rows_changed, tokens_out, seconds_total, seconds_analyse, model, prompt_version,
       LEFT(message, 300) AS message
FROM job_runs;
