-- Removes the results of reviews that no longer exist in the source table (hard deletes), ONE CHUNK per
-- transaction, with their contributions to the aggregates (qwenspark.io.mysql.purge_deleted runs it: first
-- upsert.sql's tmp_chunk DDL (from @changes) and @delta_tables, then @select here, upsert.sql's @old, @delete here
-- and upsert.sql's @apply). Given aggregates that matched review_sentiment before, they match it after, as for a
-- commit: @old subtracts exactly the rows @delete removes.
-- Parameters: %(lo)s and %(hi)s, the review_id range still to scan (inclusive); %(limit)s, most reviews per chunk;
-- %(input_seq)s, an input sequence value taken when the purge started (mysql.INPUT_SEQ).
-- {source} is source.table (a configured name, as in the job's reads).

-- @select
-- The next chunk's gone reviews, in review_id order (the caller continues after the last). tmp_chunk's is_new = 0
-- makes @old read their stored versions; stage_seq is unused here.
INSERT INTO tmp_chunk (review_id, stage_seq, is_new)
SELECT r.review_id, 0, FALSE
FROM review_sentiment r
WHERE r.review_id BETWEEN %(lo)s AND %(hi)s
  AND NOT EXISTS (SELECT 1 FROM {source} h WHERE h.review_id = r.review_id)
ORDER BY r.review_id
LIMIT %(limit)s;

-- @delete
-- A tombstone per purged review: a run that read the review before it was deleted (its input_seq is below the
-- purge's) and commits later must not write it back (upsert.sql's @changes skips it). A run that reads the
-- review after it is inserted again has a higher input_seq and writes it as usual. The DELETE comes last: its
-- row count is the number purged.
INSERT INTO review_tombstones (review_id, input_seq, purged_at)
SELECT review_id, %(input_seq)s, UTC_TIMESTAMP(3) FROM tmp_chunk
ON DUPLICATE KEY UPDATE input_seq = GREATEST(input_seq, VALUES(input_seq)), purged_at = VALUES(purged_at);
DELETE r FROM review_sentiment r JOIN tmp_chunk c ON c.review_id = r.review_id;
