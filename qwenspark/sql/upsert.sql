-- Moves ONE CHUNK of a run's staged rows into review_sentiment and keeps the aggregates in step, in the
-- caller's transaction (qwenspark.io.mysql.commit_chunk; commit_run has the semantics of chunks and failures).
-- Parameters: %(run_id)s; %(lo)s and %(hi)s, the chunk's review_id range (inclusive); %(dedupe)s, 1 when the
-- run staged some review more than once (a retried Spark write task), else 0; %(heap_bytes)s, room for the
-- chunk's review ids in a MEMORY table (64 bytes a staged row); %(input_seq)s, the run's job_runs.input_seq (the
-- version of the input it read; NULL counts as older than any). Replaying a run changes 0 rows.
--
-- Many writers (the nightly batch, the stream): a stored result is replaced only by one of a run whose input is at
-- least as new (staged input_seq >= stored input_seq, or the stored row has none); a run that read its input
-- before another run that stored the review neither writes nor counts it (it counts it in @stale_rows).
--
-- The aggregates are maintained from the reviews that change, not recomputed from every review of a touched
-- (hotel, day): per (hotel, day, lang) and (hotel, day, lang, aspect) the chunk adds the contributions of the new
-- versions of its changed reviews and subtracts those of their old versions, then applies them to
-- hotel_sentiment_daily and aspect_sentiment (summed over lang) and to the dashboard's per-language summaries
-- sentiment_daily_lang and aspect_daily_lang (schema v006; lang '' for NULL) and their monthly rollups
-- sentiment_monthly_lang and aspect_monthly_lang (v007; month = the first day of the day's month). Given
-- aggregates that matched review_sentiment before, they match it after: every table holds the figures of sql/recompute_aggregates.sql, the
-- first two also those of the full recompute of earlier releases (tests/spark/test_sink_commit.py holds them to
-- both), at a cost proportional to the reviews that change rather than to all the reviews stored for the touched
-- keys, and with no JSON parsed for reviews that did not change.
--
-- Sections (`-- @name`) run in this order: @changes, then, unless no review of the chunk changes, the
-- sections @delta_tables, @deltas, @old (skipped when every changed review is new), @upsert and @apply; then
-- the section @spent. The purge of deleted reviews (sql/purge.sql, mysql.purge_deleted) reuses three of them:
-- the temporary tables of @delta_tables, the subtraction of @old and the application of @apply.

-- @delta_tables
-- 0. The aggregates' deltas, per (hotel, day, lang) and per (hotel, day, lang, aspect): filled by @deltas (+ new
--    versions) and @old (- stored versions), applied by @apply. hotel_id and lang (COALESCE(lang, ''): '' for
--    NULL) are held as bytes: they compare exactly (schema v002, v006), on MySQL and MariaDB alike, whatever the
--    session's collation.
DROP TEMPORARY TABLE IF EXISTS tmp_daily_delta;
CREATE TEMPORARY TABLE tmp_daily_delta (
  hotel_id VARBINARY(256) NOT NULL, day DATE NOT NULL, lang VARBINARY(32) NOT NULL, reviews INT NOT NULL,
  analysed INT NOT NULL, positive INT NOT NULL, negative INT NOT NULL, neutral INT NOT NULL, mixed INT NOT NULL,
  errors INT NOT NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
DROP TEMPORARY TABLE IF EXISTS tmp_aspect_delta;
CREATE TEMPORARY TABLE tmp_aspect_delta (
  hotel_id VARBINARY(256) NOT NULL, day DATE NOT NULL, lang VARBINARY(32) NOT NULL, aspect VARCHAR(32) NOT NULL,
  mentions INT NOT NULL,
  positive INT NOT NULL, negative INT NOT NULL, neutral INT NOT NULL, KEY (hotel_id, day, aspect)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- @changes
-- 1. The chunk's reviews that change review_sentiment: the latest staged copy of each review (highest
--    stage_seq), kept when the review is new or any column differs in any byte from the stored row (an identical
--    row is what a replay stages: it is neither written nor counted), and the stored row is not newer (the
--    staleness guard), and the review was not purged after the run read it (review_tombstones: the run read it
--    before it was deleted from the source; writing it back would resurrect a deleted review). Chunks run at READ COMMITTED; the stored rows are locked first, so what is read here stays
--    as read until the upsert, even beside a writer that does not take commit_run's named lock. (A row INSERTED
--    meanwhile by such a writer cannot be locked in advance: commit_chunk sees it in the upsert's affected rows
--    and the chunk is rolled back and tried again.)
--    The ids are read into a temporary table first: the locking read then locks review_sentiment rows only
--    (locking the staged rows too made parallel chunks of one run deadlock on each other's ranges).
SET SESSION max_heap_table_size = GREATEST(@@max_heap_table_size, %(heap_bytes)s);
DROP TEMPORARY TABLE IF EXISTS tmp_chunk_ids;
CREATE TEMPORARY TABLE tmp_chunk_ids (review_id BIGINT NOT NULL PRIMARY KEY) ENGINE=MEMORY;
INSERT IGNORE INTO tmp_chunk_ids (review_id)
SELECT review_id FROM review_sentiment_stage WHERE run_id = %(run_id)s AND review_id BETWEEN %(lo)s AND %(hi)s;
SELECT COUNT(*) FROM tmp_chunk_ids t JOIN review_sentiment r ON r.review_id = t.review_id FOR UPDATE;
SET @stale_rows = (SELECT COUNT(*) FROM tmp_chunk_ids t
  LEFT JOIN review_sentiment r ON r.review_id = t.review_id
  LEFT JOIN review_tombstones d ON d.review_id = t.review_id
  WHERE r.input_seq > COALESCE(%(input_seq)s, 0) OR d.input_seq > COALESCE(%(input_seq)s, 0));
DROP TEMPORARY TABLE IF EXISTS tmp_chunk;
CREATE TEMPORARY TABLE tmp_chunk (
  review_id BIGINT          NOT NULL PRIMARY KEY,
  stage_seq BIGINT UNSIGNED NOT NULL,
  is_new    BOOLEAN         NOT NULL
) ENGINE=MEMORY;
INSERT INTO tmp_chunk (review_id, stage_seq, is_new)
SELECT s.review_id, s.stage_seq, r.review_id IS NULL
FROM review_sentiment_stage s
LEFT JOIN review_sentiment r ON r.review_id = s.review_id
WHERE s.run_id = %(run_id)s AND s.review_id BETWEEN %(lo)s AND %(hi)s
  AND (%(dedupe)s = 0 OR s.stage_seq = (SELECT MAX(d.stage_seq) FROM review_sentiment_stage d
                                       WHERE d.run_id = s.run_id AND d.review_id = s.review_id))
  AND (r.review_id IS NULL OR r.input_seq IS NULL OR COALESCE(%(input_seq)s, 0) >= r.input_seq)
  AND NOT EXISTS (SELECT 1 FROM review_tombstones d WHERE d.review_id = s.review_id
                  AND d.input_seq > COALESCE(%(input_seq)s, 0))
  AND (r.review_id IS NULL OR NOT (
    CAST(r.hotel_id AS BINARY) <=> CAST(s.hotel_id AS BINARY) AND r.review_created_at <=> s.review_created_at
    AND CAST(r.lang AS BINARY) <=> CAST(s.lang AS BINARY) AND CAST(r.input_key AS BINARY) <=> CAST(s.input_key AS BINARY)
    AND CAST(r.sentiment AS BINARY) <=> CAST(s.sentiment AS BINARY)
    AND CAST(r.summary AS BINARY) <=> CAST(s.summary AS BINARY)
    AND CAST(r.aspects AS BINARY) <=> CAST(s.aspects AS BINARY) AND r.truncated <=> s.truncated
    AND CAST(r.error AS BINARY) <=> CAST(s.error AS BINARY) AND CAST(r.model AS BINARY) <=> CAST(s.model AS BINARY)
    AND CAST(r.prompt_version AS BINARY) <=> CAST(s.prompt_version AS BINARY)
    AND r.tokens_in <=> s.tokens_in AND r.tokens_out <=> s.tokens_out AND r.latency_ms <=> s.latency_ms
    AND r.analysed_at <=> s.analysed_at AND CAST(r.run_id AS BINARY) <=> CAST(s.run_id AS BINARY)));

-- @deltas
-- 2. Contributions to the aggregates (tables of @delta_tables), per (hotel, day, lang) and per (hotel, day, lang,
--    aspect) from the aspects JSON of analysed reviews (error IS NULL): + the new versions here, - the old versions
--    in @old.
INSERT INTO tmp_daily_delta (hotel_id, day, lang, reviews, analysed, positive, negative, neutral, mixed, errors)
SELECT s.hotel_id, DATE(s.review_created_at), CAST(COALESCE(s.lang, '') AS BINARY), COUNT(*), SUM(s.error IS NULL),
  SUM(s.sentiment <=> 'positive'), SUM(s.sentiment <=> 'negative'), SUM(s.sentiment <=> 'neutral'),
  SUM(s.sentiment <=> 'mixed'), SUM(s.error IS NOT NULL)
FROM tmp_chunk c
JOIN review_sentiment_stage s ON s.run_id = %(run_id)s AND s.review_id = c.review_id AND s.stage_seq = c.stage_seq
  AND s.review_id BETWEEN %(lo)s AND %(hi)s
WHERE s.hotel_id IS NOT NULL AND s.review_created_at IS NOT NULL
GROUP BY s.hotel_id, DATE(s.review_created_at), CAST(COALESCE(s.lang, '') AS BINARY);
INSERT INTO tmp_aspect_delta (hotel_id, day, lang, aspect, mentions, positive, negative, neutral)
SELECT s.hotel_id, DATE(s.review_created_at), CAST(COALESCE(s.lang, '') AS BINARY), jt.aspect, COUNT(*),
  SUM(jt.sentiment <=> 'positive'), SUM(jt.sentiment <=> 'negative'), SUM(jt.sentiment <=> 'neutral')
FROM tmp_chunk c
JOIN review_sentiment_stage s ON s.run_id = %(run_id)s AND s.review_id = c.review_id AND s.stage_seq = c.stage_seq
  AND s.review_id BETWEEN %(lo)s AND %(hi)s
JOIN JSON_TABLE(s.aspects, '$[*]' COLUMNS (aspect VARCHAR(32) PATH '$.aspect',
  sentiment VARCHAR(16) PATH '$.sentiment')) jt
WHERE s.error IS NULL AND jt.aspect IS NOT NULL AND s.hotel_id IS NOT NULL AND s.review_created_at IS NOT NULL
GROUP BY s.hotel_id, DATE(s.review_created_at), CAST(COALESCE(s.lang, '') AS BINARY), jt.aspect;
-- @old
-- 3. The stored versions of the changed reviews, read before the upsert overwrites them.
INSERT INTO tmp_daily_delta (hotel_id, day, lang, reviews, analysed, positive, negative, neutral, mixed, errors)
SELECT r.hotel_id, DATE(r.review_created_at), CAST(COALESCE(r.lang, '') AS BINARY), -COUNT(*), -SUM(r.error IS NULL),
  -SUM(r.sentiment <=> 'positive'), -SUM(r.sentiment <=> 'negative'), -SUM(r.sentiment <=> 'neutral'),
  -SUM(r.sentiment <=> 'mixed'), -SUM(r.error IS NOT NULL)
FROM tmp_chunk c
JOIN review_sentiment r ON r.review_id = c.review_id
WHERE c.is_new = 0 AND r.hotel_id IS NOT NULL AND r.review_created_at IS NOT NULL
GROUP BY r.hotel_id, DATE(r.review_created_at), CAST(COALESCE(r.lang, '') AS BINARY);
INSERT INTO tmp_aspect_delta (hotel_id, day, lang, aspect, mentions, positive, negative, neutral)
SELECT r.hotel_id, DATE(r.review_created_at), CAST(COALESCE(r.lang, '') AS BINARY), jt.aspect, -COUNT(*),
  -SUM(jt.sentiment <=> 'positive'), -SUM(jt.sentiment <=> 'negative'), -SUM(jt.sentiment <=> 'neutral')
FROM tmp_chunk c
JOIN review_sentiment r ON r.review_id = c.review_id
JOIN JSON_TABLE(r.aspects, '$[*]' COLUMNS (aspect VARCHAR(32) PATH '$.aspect',
  sentiment VARCHAR(16) PATH '$.sentiment')) jt
WHERE c.is_new = 0 AND r.error IS NULL AND jt.aspect IS NOT NULL AND r.hotel_id IS NOT NULL
  AND r.review_created_at IS NOT NULL
GROUP BY r.hotel_id, DATE(r.review_created_at), CAST(COALESCE(r.lang, '') AS BINARY), jt.aspect;

-- @upsert
-- 4. The upsert of the changed reviews (tmp_chunk: the guard of @changes passed, on locked rows), each stamped with
--    the run's input_seq: VALUES() works on MySQL 8 and MariaDB alike. Affected rows: 1 per insert, 2 per changed
--    row; commit_chunk checks them against tmp_chunk (a review counted new that was inserted meanwhile by another
--    writer makes the chunk roll back and run again, where the guard sees that row).
INSERT INTO review_sentiment (
  review_id, hotel_id, review_created_at, lang, input_key, sentiment, summary, aspects, truncated, error,
  model, prompt_version, tokens_in, tokens_out, latency_ms, analysed_at, run_id, input_seq)
SELECT s.review_id, s.hotel_id, s.review_created_at, s.lang, s.input_key, s.sentiment, s.summary, s.aspects,
  s.truncated, s.error, s.model, s.prompt_version, s.tokens_in, s.tokens_out, s.latency_ms, s.analysed_at, s.run_id,
  %(input_seq)s
FROM tmp_chunk c
JOIN review_sentiment_stage s ON s.run_id = %(run_id)s AND s.review_id = c.review_id AND s.stage_seq = c.stage_seq
  AND s.review_id BETWEEN %(lo)s AND %(hi)s
ON DUPLICATE KEY UPDATE
  hotel_id = VALUES(hotel_id), review_created_at = VALUES(review_created_at), lang = VALUES(lang),
  input_key = VALUES(input_key), sentiment = VALUES(sentiment), summary = VALUES(summary),
  aspects = VALUES(aspects), truncated = VALUES(truncated), error = VALUES(error), model = VALUES(model),
  prompt_version = VALUES(prompt_version), tokens_in = VALUES(tokens_in), tokens_out = VALUES(tokens_out),
  latency_ms = VALUES(latency_ms), analysed_at = VALUES(analysed_at), run_id = VALUES(run_id),
  input_seq = VALUES(input_seq);

-- @apply
-- 5. Apply the deltas, an INSERT .. ON DUPLICATE KEY UPDATE and a DELETE per table: hotel_sentiment_daily and
--    aspect_sentiment sum them over lang (per (hotel, day) and (hotel, day, aspect)), sentiment_daily_lang and
--    aspect_daily_lang take them per lang, sentiment_monthly_lang and aspect_monthly_lang per lang and month.
--    Shares (the first two tables only) are computed from the resulting counts exactly as a recompute does (count / NULLIF(analysed, 0), DECIMAL(5,4)); keys and aspects left with no review
--    (reviews = 0, mentions = 0) are deleted. (The shares in the SELECT only serve new keys, whose delta is their
--    whole count; the NULLIF guards the rows that go to the UPDATE branch, where an unchanged count is a zero
--    delta.)
INSERT INTO hotel_sentiment_daily (hotel_id, day, reviews, analysed, positive, negative, neutral, mixed, errors,
  share_positive, share_negative, share_neutral, share_mixed)
SELECT hotel_id, day, d_reviews, d_analysed, d_positive, d_negative, d_neutral, d_mixed, d_errors,
  d_positive / NULLIF(d_analysed, 0), d_negative / NULLIF(d_analysed, 0), d_neutral / NULLIF(d_analysed, 0),
  d_mixed / NULLIF(d_analysed, 0)
FROM (
  SELECT hotel_id, day, SUM(reviews) AS d_reviews, SUM(analysed) AS d_analysed, SUM(positive) AS d_positive,
    SUM(negative) AS d_negative, SUM(neutral) AS d_neutral, SUM(mixed) AS d_mixed, SUM(errors) AS d_errors
  FROM tmp_daily_delta GROUP BY hotel_id, day
) delta
WHERE d_reviews <> 0 OR d_analysed <> 0 OR d_positive <> 0 OR d_negative <> 0 OR d_neutral <> 0 OR d_mixed <> 0
  OR d_errors <> 0
ON DUPLICATE KEY UPDATE
  reviews = hotel_sentiment_daily.reviews + VALUES(reviews),
  analysed = hotel_sentiment_daily.analysed + VALUES(analysed),
  positive = hotel_sentiment_daily.positive + VALUES(positive),
  negative = hotel_sentiment_daily.negative + VALUES(negative),
  neutral = hotel_sentiment_daily.neutral + VALUES(neutral),
  mixed = hotel_sentiment_daily.mixed + VALUES(mixed),
  errors = hotel_sentiment_daily.errors + VALUES(errors),
  share_positive = hotel_sentiment_daily.positive / NULLIF(hotel_sentiment_daily.analysed, 0),
  share_negative = hotel_sentiment_daily.negative / NULLIF(hotel_sentiment_daily.analysed, 0),
  share_neutral = hotel_sentiment_daily.neutral / NULLIF(hotel_sentiment_daily.analysed, 0),
  share_mixed = hotel_sentiment_daily.mixed / NULLIF(hotel_sentiment_daily.analysed, 0);
DELETE d FROM hotel_sentiment_daily d
JOIN tmp_daily_delta t ON t.hotel_id = d.hotel_id AND t.day = d.day
WHERE d.reviews = 0;
INSERT INTO aspect_sentiment (hotel_id, day, aspect, mentions, positive, negative, neutral, share_positive,
  share_negative)
SELECT hotel_id, day, aspect, d_mentions, d_positive, d_negative, d_neutral,
  COALESCE(d_positive / NULLIF(d_mentions, 0), 0), COALESCE(d_negative / NULLIF(d_mentions, 0), 0)
FROM (
  SELECT hotel_id, day, aspect, SUM(mentions) AS d_mentions, SUM(positive) AS d_positive,
    SUM(negative) AS d_negative, SUM(neutral) AS d_neutral
  FROM tmp_aspect_delta GROUP BY hotel_id, day, aspect
) delta
WHERE d_mentions <> 0 OR d_positive <> 0 OR d_negative <> 0 OR d_neutral <> 0
ON DUPLICATE KEY UPDATE
  mentions = aspect_sentiment.mentions + VALUES(mentions),
  positive = aspect_sentiment.positive + VALUES(positive),
  negative = aspect_sentiment.negative + VALUES(negative),
  neutral = aspect_sentiment.neutral + VALUES(neutral),
  share_positive = COALESCE(aspect_sentiment.positive / NULLIF(aspect_sentiment.mentions, 0), 0),
  share_negative = COALESCE(aspect_sentiment.negative / NULLIF(aspect_sentiment.mentions, 0), 0);
DELETE a FROM aspect_sentiment a
JOIN tmp_aspect_delta t ON t.hotel_id = a.hotel_id AND t.day = a.day AND t.aspect = a.aspect
WHERE a.mentions = 0;
INSERT INTO sentiment_daily_lang (day, hotel_id, lang, reviews, analysed, positive, negative, neutral, mixed, errors)
SELECT day, hotel_id, lang, d_reviews, d_analysed, d_positive, d_negative, d_neutral, d_mixed, d_errors
FROM (
  SELECT day, hotel_id, lang, SUM(reviews) AS d_reviews, SUM(analysed) AS d_analysed, SUM(positive) AS d_positive,
    SUM(negative) AS d_negative, SUM(neutral) AS d_neutral, SUM(mixed) AS d_mixed, SUM(errors) AS d_errors
  FROM tmp_daily_delta GROUP BY day, hotel_id, lang
) delta
WHERE d_reviews <> 0 OR d_analysed <> 0 OR d_positive <> 0 OR d_negative <> 0 OR d_neutral <> 0 OR d_mixed <> 0
  OR d_errors <> 0
ON DUPLICATE KEY UPDATE
  reviews = sentiment_daily_lang.reviews + VALUES(reviews),
  analysed = sentiment_daily_lang.analysed + VALUES(analysed),
  positive = sentiment_daily_lang.positive + VALUES(positive),
  negative = sentiment_daily_lang.negative + VALUES(negative),
  neutral = sentiment_daily_lang.neutral + VALUES(neutral),
  mixed = sentiment_daily_lang.mixed + VALUES(mixed),
  errors = sentiment_daily_lang.errors + VALUES(errors);
DELETE d FROM sentiment_daily_lang d
JOIN tmp_daily_delta t ON t.day = d.day AND t.hotel_id = d.hotel_id AND t.lang = d.lang
WHERE d.reviews = 0;
INSERT INTO aspect_daily_lang (day, hotel_id, lang, aspect, mentions, positive, negative, neutral)
SELECT day, hotel_id, lang, aspect, d_mentions, d_positive, d_negative, d_neutral
FROM (
  SELECT day, hotel_id, lang, aspect, SUM(mentions) AS d_mentions, SUM(positive) AS d_positive,
    SUM(negative) AS d_negative, SUM(neutral) AS d_neutral
  FROM tmp_aspect_delta GROUP BY day, hotel_id, lang, aspect
) delta
WHERE d_mentions <> 0 OR d_positive <> 0 OR d_negative <> 0 OR d_neutral <> 0
ON DUPLICATE KEY UPDATE
  mentions = aspect_daily_lang.mentions + VALUES(mentions),
  positive = aspect_daily_lang.positive + VALUES(positive),
  negative = aspect_daily_lang.negative + VALUES(negative),
  neutral = aspect_daily_lang.neutral + VALUES(neutral);
DELETE a FROM aspect_daily_lang a
JOIN tmp_aspect_delta t ON t.day = a.day AND t.hotel_id = a.hotel_id AND t.lang = a.lang AND t.aspect = a.aspect
WHERE a.mentions = 0;
INSERT INTO sentiment_monthly_lang (month, hotel_id, lang, reviews, analysed, positive, negative, neutral, mixed,
  errors)
SELECT month, hotel_id, lang, d_reviews, d_analysed, d_positive, d_negative, d_neutral, d_mixed, d_errors
FROM (
  SELECT day - INTERVAL (DAYOFMONTH(day) - 1) DAY AS month, hotel_id, lang, SUM(reviews) AS d_reviews,
    SUM(analysed) AS d_analysed, SUM(positive) AS d_positive, SUM(negative) AS d_negative, SUM(neutral) AS d_neutral,
    SUM(mixed) AS d_mixed, SUM(errors) AS d_errors
  FROM tmp_daily_delta GROUP BY 1, hotel_id, lang
) delta
WHERE d_reviews <> 0 OR d_analysed <> 0 OR d_positive <> 0 OR d_negative <> 0 OR d_neutral <> 0 OR d_mixed <> 0
  OR d_errors <> 0
ON DUPLICATE KEY UPDATE
  reviews = sentiment_monthly_lang.reviews + VALUES(reviews),
  analysed = sentiment_monthly_lang.analysed + VALUES(analysed),
  positive = sentiment_monthly_lang.positive + VALUES(positive),
  negative = sentiment_monthly_lang.negative + VALUES(negative),
  neutral = sentiment_monthly_lang.neutral + VALUES(neutral),
  mixed = sentiment_monthly_lang.mixed + VALUES(mixed),
  errors = sentiment_monthly_lang.errors + VALUES(errors);
DELETE m FROM sentiment_monthly_lang m
JOIN tmp_daily_delta t ON t.day - INTERVAL (DAYOFMONTH(t.day) - 1) DAY = m.month AND t.hotel_id = m.hotel_id
  AND t.lang = m.lang
WHERE m.reviews = 0;
INSERT INTO aspect_monthly_lang (month, hotel_id, lang, aspect, mentions, positive, negative, neutral)
SELECT month, hotel_id, lang, aspect, d_mentions, d_positive, d_negative, d_neutral
FROM (
  SELECT day - INTERVAL (DAYOFMONTH(day) - 1) DAY AS month, hotel_id, lang, aspect, SUM(mentions) AS d_mentions,
    SUM(positive) AS d_positive, SUM(negative) AS d_negative, SUM(neutral) AS d_neutral
  FROM tmp_aspect_delta GROUP BY 1, hotel_id, lang, aspect
) delta
WHERE d_mentions <> 0 OR d_positive <> 0 OR d_negative <> 0 OR d_neutral <> 0
ON DUPLICATE KEY UPDATE
  mentions = aspect_monthly_lang.mentions + VALUES(mentions),
  positive = aspect_monthly_lang.positive + VALUES(positive),
  negative = aspect_monthly_lang.negative + VALUES(negative),
  neutral = aspect_monthly_lang.neutral + VALUES(neutral);
DELETE a FROM aspect_monthly_lang a
JOIN tmp_aspect_delta t ON t.day - INTERVAL (DAYOFMONTH(t.day) - 1) DAY = a.month AND t.hotel_id = a.hotel_id
  AND t.lang = a.lang AND t.aspect = a.aspect
WHERE a.mentions = 0;

-- @spent
-- 6. The chunk's staged rows are spent (every copy of its reviews, changed or not).
DELETE FROM review_sentiment_stage WHERE run_id = %(run_id)s AND review_id BETWEEN %(lo)s AND %(hi)s;
