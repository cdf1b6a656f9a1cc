-- The aggregates recomputed from review_sentiment (a migration that changes how keys compare, or adds an aggregate,
-- runs it; commit_chunk keeps them in step incrementally, to the same figures, afterwards; tests compare the two).
-- Each section is one migration's tables (Migrator.script runs a section; the whole script runs every one):
-- by_hotel: hotel_sentiment_daily and aspect_sentiment (v001, recomputed by v002); by_lang: sentiment_daily_lang
-- and aspect_daily_lang (v006), per language, lang '' where review_sentiment.lang is NULL, grouped as bytes as the
-- tables' exact collation compares it; by_month: the same per month (v007's sentiment_monthly_lang and
-- aspect_monthly_lang; month = the first day of the review's month).

-- @by_hotel
DELETE FROM hotel_sentiment_daily;
INSERT INTO hotel_sentiment_daily (hotel_id, day, reviews, analysed, positive, negative, neutral, mixed, errors,
  share_positive, share_negative, share_neutral, share_mixed)
SELECT hotel_id, DATE(review_created_at), COUNT(*), SUM(error IS NULL), SUM(sentiment <=> 'positive'),
  SUM(sentiment <=> 'negative'), SUM(sentiment <=> 'neutral'), SUM(sentiment <=> 'mixed'), SUM(error IS NOT NULL),
  SUM(sentiment <=> 'positive') / NULLIF(SUM(error IS NULL), 0), SUM(sentiment <=> 'negative') / NULLIF(SUM(error IS NULL), 0),
  SUM(sentiment <=> 'neutral') / NULLIF(SUM(error IS NULL), 0), SUM(sentiment <=> 'mixed') / NULLIF(SUM(error IS NULL), 0)
FROM review_sentiment
WHERE hotel_id IS NOT NULL AND review_created_at IS NOT NULL
GROUP BY hotel_id, DATE(review_created_at);
DELETE FROM aspect_sentiment;
INSERT INTO aspect_sentiment (hotel_id, day, aspect, mentions, positive, negative, neutral, share_positive,
  share_negative)
SELECT r.hotel_id, DATE(r.review_created_at), jt.aspect, COUNT(*), SUM(jt.sentiment <=> 'positive'),
  SUM(jt.sentiment <=> 'negative'), SUM(jt.sentiment <=> 'neutral'),
  COALESCE(SUM(jt.sentiment <=> 'positive') / COUNT(*), 0), COALESCE(SUM(jt.sentiment <=> 'negative') / COUNT(*), 0)
FROM review_sentiment r
JOIN JSON_TABLE(r.aspects, '$[*]' COLUMNS (aspect VARCHAR(32) PATH '$.aspect',
  sentiment VARCHAR(16) PATH '$.sentiment')) jt
WHERE r.error IS NULL AND jt.aspect IS NOT NULL AND r.hotel_id IS NOT NULL AND r.review_created_at IS NOT NULL
GROUP BY r.hotel_id, DATE(r.review_created_at), jt.aspect;

-- @by_lang
DELETE FROM sentiment_daily_lang;
INSERT INTO sentiment_daily_lang (day, hotel_id, lang, reviews, analysed, positive, negative, neutral, mixed, errors)
SELECT DATE(review_created_at), hotel_id, CAST(COALESCE(lang, '') AS BINARY), COUNT(*), SUM(error IS NULL),
  SUM(sentiment <=> 'positive'), SUM(sentiment <=> 'negative'), SUM(sentiment <=> 'neutral'),
  SUM(sentiment <=> 'mixed'), SUM(error IS NOT NULL)
FROM review_sentiment
WHERE hotel_id IS NOT NULL AND review_created_at IS NOT NULL
GROUP BY DATE(review_created_at), hotel_id, CAST(COALESCE(lang, '') AS BINARY);
DELETE FROM aspect_daily_lang;
INSERT INTO aspect_daily_lang (day, hotel_id, lang, aspect, mentions, positive, negative, neutral)
SELECT DATE(r.review_created_at), r.hotel_id, CAST(COALESCE(r.lang, '') AS BINARY), jt.aspect, COUNT(*),
  SUM(jt.sentiment <=> 'positive'), SUM(jt.sentiment <=> 'negative'), SUM(jt.sentiment <=> 'neutral')
FROM review_sentiment r
JOIN JSON_TABLE(r.aspects, '$[*]' COLUMNS (aspect VARCHAR(32) PATH '$.aspect',
  sentiment VARCHAR(16) PATH '$.sentiment')) jt
WHERE r.error IS NULL AND jt.aspect IS NOT NULL AND r.hotel_id IS NOT NULL AND r.review_created_at IS NOT NULL
GROUP BY DATE(r.review_created_at), r.hotel_id, CAST(COALESCE(r.lang, '') AS BINARY), jt.aspect;

-- @by_month
DELETE FROM sentiment_monthly_lang;
INSERT INTO sentiment_monthly_lang (month, hotel_id, lang, reviews, analysed, positive, negative, neutral, mixed,
  errors)
SELECT DATE(review_created_at) - INTERVAL (DAYOFMONTH(review_created_at) - 1) DAY, hotel_id,
  CAST(COALESCE(lang, '') AS BINARY), COUNT(*), SUM(error IS NULL), SUM(sentiment <=> 'positive'),
  SUM(sentiment <=> 'negative'), SUM(sentiment <=> 'neutral'), SUM(sentiment <=> 'mixed'), SUM(error IS NOT NULL)
FROM review_sentiment
WHERE hotel_id IS NOT NULL AND review_created_at IS NOT NULL
GROUP BY 1, hotel_id, CAST(COALESCE(lang, '') AS BINARY);
DELETE FROM aspect_monthly_lang;
INSERT INTO aspect_monthly_lang (month, hotel_id, lang, aspect, mentions, positive, negative, neutral)
SELECT DATE(r.review_created_at) - INTERVAL (DAYOFMONTH(r.review_created_at) - 1) DAY, r.hotel_id,
  CAST(COALESCE(r.lang, '') AS BINARY), jt.aspect, COUNT(*), SUM(jt.sentiment <=> 'positive'),
  SUM(jt.sentiment <=> 'negative'), SUM(jt.sentiment <=> 'neutral')
FROM review_sentiment r
JOIN JSON_TABLE(r.aspects, '$[*]' COLUMNS (aspect VARCHAR(32) PATH '$.aspect',
  sentiment VARCHAR(16) PATH '$.sentiment')) jt
WHERE r.error IS NULL AND jt.aspect IS NOT NULL AND r.hotel_id IS NOT NULL AND r.review_created_at IS NOT NULL
GROUP BY 1, r.hotel_id, CAST(COALESCE(r.lang, '') AS BINARY), jt.aspect;
