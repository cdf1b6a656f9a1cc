-- Moves one run's staged rows into review_sentiment and refreshes the aggregates they touch.
-- Run in ONE transaction with %(run_id)s bound; job_runs is updated in the same transaction, so a run
-- is either fully visible with its bookkeeping or not at all. Replaying it changes 0 rows.

-- The (hotel, day) keys this run touches: where its reviews are now and where they were before.
CREATE TEMPORARY TABLE IF NOT EXISTS tmp_touched_keys (hotel_id VARCHAR(64) NOT NULL, day DATE NOT NULL, PRIMARY KEY (hotel_id, day));
DELETE FROM tmp_touched_keys;
INSERT IGNORE INTO tmp_touched_keys
SELECT DISTINCT hotel_id, DATE(review_created_at) FROM review_sentiment_stage
WHERE run_id = %(run_id)s AND hotel_id IS NOT NULL AND review_created_at IS NOT NULL;
INSERT IGNORE INTO tmp_touched_keys
SELECT DISTINCT r.hotel_id, DATE(r.review_created_at) FROM review_sentiment r
JOIN review_sentiment_stage s ON s.review_id = r.review_id AND s.run_id = %(run_id)s
WHERE r.hotel_id IS NOT NULL AND r.review_created_at IS NOT NULL;

-- The upsert: VALUES() works on MySQL 8 and MariaDB alike. Identical values count as 0 changed rows.
INSERT INTO review_sentiment (
  review_id, hotel_id, review_created_at, lang, input_key, sentiment, summary, aspects, truncated, error,
  model, prompt_version, tokens_in, tokens_out, latency_ms, analysed_at, run_id)
SELECT review_id, hotel_id, review_created_at, lang, input_key, sentiment, summary, aspects, truncated, error,
  model, prompt_version, tokens_in, tokens_out, latency_ms, analysed_at, run_id
FROM review_sentiment_stage WHERE run_id = %(run_id)s
ON DUPLICATE KEY UPDATE
  hotel_id = VALUES(hotel_id), review_created_at = VALUES(review_created_at), lang = VALUES(lang),
  input_key = VALUES(input_key), sentiment = VALUES(sentiment), summary = VALUES(summary),
  aspects = VALUES(aspects), truncated = VALUES(truncated), error = VALUES(error), model = VALUES(model),
  prompt_version = VALUES(prompt_version), tokens_in = VALUES(tokens_in), tokens_out = VALUES(tokens_out),
  latency_ms = VALUES(latency_ms), analysed_at = VALUES(analysed_at), run_id = VALUES(run_id);

-- Per hotel and day: recomputed from review_sentiment for the touched keys only.
INSERT INTO hotel_sentiment_daily (hotel_id, day, reviews, analysed, positive, negative, neutral, mixed, errors,
  share_positive, share_negative, share_neutral, share_mixed)
SELECT hotel_id, day, reviews, analysed, positive, negative, neutral, mixed, errors,
  positive / NULLIF(analysed, 0), negative / NULLIF(analysed, 0), neutral / NULLIF(analysed, 0), mixed / NULLIF(analysed, 0)
FROM (
  SELECT r.hotel_id, DATE(r.review_created_at) AS day, COUNT(*) AS reviews, SUM(r.error IS NULL) AS analysed,
    SUM(r.sentiment <=> 'positive') AS positive, SUM(r.sentiment <=> 'negative') AS negative,
    SUM(r.sentiment <=> 'neutral') AS neutral, SUM(r.sentiment <=> 'mixed') AS mixed, SUM(r.error IS NOT NULL) AS errors
  FROM review_sentiment r
  JOIN tmp_touched_keys k ON k.hotel_id = r.hotel_id AND r.review_created_at >= k.day
    AND r.review_created_at < k.day + INTERVAL 1 DAY
  GROUP BY r.hotel_id, DATE(r.review_created_at)
) agg
ON DUPLICATE KEY UPDATE reviews = VALUES(reviews), analysed = VALUES(analysed), positive = VALUES(positive),
  negative = VALUES(negative), neutral = VALUES(neutral), mixed = VALUES(mixed), errors = VALUES(errors),
  share_positive = VALUES(share_positive), share_negative = VALUES(share_negative),
  share_neutral = VALUES(share_neutral), share_mixed = VALUES(share_mixed);

-- Keys whose reviews all moved elsewhere.
DELETE d FROM hotel_sentiment_daily d JOIN tmp_touched_keys k ON k.hotel_id = d.hotel_id AND k.day = d.day
WHERE NOT EXISTS (SELECT 1 FROM review_sentiment r WHERE r.hotel_id = d.hotel_id
  AND r.review_created_at >= d.day AND r.review_created_at < d.day + INTERVAL 1 DAY);

-- Per hotel, day and aspect, from the aspects JSON of each analysed review.
CREATE TEMPORARY TABLE IF NOT EXISTS tmp_aspects (hotel_id VARCHAR(64) NOT NULL, day DATE NOT NULL,
  aspect VARCHAR(32) NOT NULL, mentions INT NOT NULL, positive INT NOT NULL, negative INT NOT NULL,
  neutral INT NOT NULL, PRIMARY KEY (hotel_id, day, aspect));
DELETE FROM tmp_aspects;
INSERT INTO tmp_aspects
SELECT r.hotel_id, DATE(r.review_created_at), jt.aspect, COUNT(*), SUM(jt.sentiment <=> 'positive'),
  SUM(jt.sentiment <=> 'negative'), SUM(jt.sentiment <=> 'neutral')
FROM review_sentiment r
JOIN tmp_touched_keys k ON k.hotel_id = r.hotel_id AND r.review_created_at >= k.day
  AND r.review_created_at < k.day + INTERVAL 1 DAY
JOIN JSON_TABLE(r.aspects, '$[*]' COLUMNS (aspect VARCHAR(32) PATH '$.aspect',
  sentiment VARCHAR(16) PATH '$.sentiment')) jt
WHERE r.error IS NULL AND jt.aspect IS NOT NULL
GROUP BY r.hotel_id, DATE(r.review_created_at), jt.aspect;
DELETE a FROM aspect_sentiment a JOIN tmp_touched_keys k ON k.hotel_id = a.hotel_id AND k.day = a.day
WHERE NOT EXISTS (SELECT 1 FROM tmp_aspects t WHERE t.hotel_id = a.hotel_id AND t.day = a.day AND t.aspect = a.aspect);
INSERT INTO aspect_sentiment (hotel_id, day, aspect, mentions, positive, negative, neutral, share_positive, share_negative)
SELECT hotel_id, day, aspect, mentions, positive, negative, neutral, positive / mentions, negative / mentions
FROM tmp_aspects
ON DUPLICATE KEY UPDATE mentions = VALUES(mentions), positive = VALUES(positive), negative = VALUES(negative),
  neutral = VALUES(neutral), share_positive = VALUES(share_positive), share_negative = VALUES(share_negative);

-- The staged rows are spent.
DELETE FROM review_sentiment_stage WHERE run_id = %(run_id)s;
