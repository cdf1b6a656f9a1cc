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
