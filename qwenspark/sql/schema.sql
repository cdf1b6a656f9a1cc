-- qwenspark tables (MySQL 8 / MariaDB 10.6+). Idempotent: every statement can run again.
-- The column lists of review_sentiment and review_sentiment_stage follow qwenspark.schemas.RESULT_SCHEMA
-- (a test holds them to it). utf8mb4 everywhere: reviews are Chinese and English, with emoji.

-- hotel_reviews.updated_at (the change watermark the nightly run selects on) and job_runs.rows_purged come from
-- migration v004 (qwenspark/io/migrations/v004_change_watermark.py): this file is the frozen v001 baseline.
CREATE TABLE IF NOT EXISTS hotel_reviews (
  review_id   BIGINT       NOT NULL PRIMARY KEY,
  hotel_id    VARCHAR(64)  NOT NULL,
  created_at  DATETIME     NOT NULL,
  lang        VARCHAR(8)   NULL,
  rating      TINYINT      NULL,
  text        MEDIUMTEXT   NULL,
  KEY ix_hotel_reviews_created (created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS review_sentiment (
  review_id         BIGINT       NOT NULL PRIMARY KEY,
  hotel_id          VARCHAR(64)  NULL,
  review_created_at DATETIME     NULL,
  lang              VARCHAR(8)   NULL,
  input_key         CHAR(64)     NOT NULL COMMENT 'sha256 of model, prompt version and text: unchanged -> skipped',
  sentiment         VARCHAR(16)  NULL COMMENT 'positive|negative|neutral|mixed; NULL when error is set',
  summary           VARCHAR(400) NULL,
  aspects           JSON         NULL COMMENT '[{"aspect": ..., "sentiment": ...}]',
  truncated         BOOLEAN      NOT NULL,
  error             TEXT         NULL,
  model             VARCHAR(255) NOT NULL,
  prompt_version    VARCHAR(32)  NOT NULL,
  tokens_in         INT          NOT NULL,
  tokens_out        INT          NOT NULL,
  latency_ms        INT          NOT NULL COMMENT 'wall time of the engine call that produced the row',
  analysed_at       DATETIME(3)  NOT NULL,
  run_id            CHAR(36)     NOT NULL,
  KEY ix_review_sentiment_hotel_day (hotel_id, review_created_at)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- Spark appends here, then the commit moves a run's rows in chunks (qwenspark.io.mysql.commit_run).
-- No unique key on (run_id, review_id) on purpose: a Spark write task retried after part of its rows were
-- committed (isolationLevel NONE commits every JDBC batch) stages those reviews again, and the commit keeps the
-- latest copy of each review (highest stage_seq). Spark inserts only its own columns: stage_seq fills itself
-- from UUID_SHORT(), which increases with every call on a server (an AUTO_INCREMENT column would need a second
-- index, and every staged row is written and deleted once: one index keeps both cheap). Clustered on
-- (run_id, review_id): a chunk of a run is one range of the primary key, read and deleted in key order.
-- The older layout (PRIMARY KEY (run_id, review_id), no stage_seq) is migrated by mysql.migrate_stage (schema v001).
CREATE TABLE IF NOT EXISTS review_sentiment_stage (
  run_id            CHAR(36)     NOT NULL,
  review_id         BIGINT       NOT NULL,
  hotel_id          VARCHAR(64)  NULL,
  review_created_at DATETIME     NULL,
  lang              VARCHAR(8)   NULL,
  input_key         CHAR(64)     NOT NULL,
  sentiment         VARCHAR(16)  NULL,
  summary           VARCHAR(400) NULL,
  aspects           TEXT         NULL,
  truncated         BOOLEAN      NOT NULL,
  error             TEXT         NULL,
  model             VARCHAR(255) NOT NULL,
  prompt_version    VARCHAR(32)  NOT NULL,
  tokens_in         INT          NOT NULL,
  tokens_out        INT          NOT NULL,
  latency_ms        INT          NOT NULL,
  analysed_at       DATETIME(3)  NOT NULL,
  stage_seq         BIGINT UNSIGNED NOT NULL DEFAULT (UUID_SHORT()) COMMENT 'arrival order: the latest copy wins',
  PRIMARY KEY (run_id, review_id, stage_seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS job_runs (
  run_id          CHAR(36)     NOT NULL PRIMARY KEY,
  job             VARCHAR(32)  NOT NULL,
  status          VARCHAR(16)  NOT NULL COMMENT 'running|succeeded|failed',
  config_hash     CHAR(16)     NOT NULL,
  model           VARCHAR(255) NOT NULL,
  prompt_version  VARCHAR(32)  NOT NULL,
  started_at      DATETIME(3)  NOT NULL,
  finished_at     DATETIME(3)  NULL,
  rows_selected   INT          NULL COMMENT 'reviews in the requested range',
  rows_skipped    INT          NULL COMMENT 'already analysed with the same model, prompt and text',
  rows_analysed   INT          NULL COMMENT 'rows sent through the pipeline (= rows out, checked)',
  rows_ok         INT          NULL,
  rows_error      INT          NULL,
  rows_truncated  INT          NULL,
  rows_changed    INT          NULL COMMENT 'review_sentiment rows inserted or changed',
  tokens_in       BIGINT       NULL,
  tokens_out      BIGINT       NULL,
  engine_loads    INT          NULL,
  engine_batches  INT          NULL,
  seconds_total   DOUBLE       NULL,
  seconds_analyse DOUBLE       NULL,
  message         TEXT         NULL
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS hotel_sentiment_daily (
  hotel_id       VARCHAR(64)  NOT NULL,
  day            DATE         NOT NULL,
  reviews        INT          NOT NULL,
  analysed       INT          NOT NULL COMMENT 'reviews with a result (reviews - errors)',
  positive       INT          NOT NULL,
  negative       INT          NOT NULL,
  neutral        INT          NOT NULL,
  mixed          INT          NOT NULL,
  errors         INT          NOT NULL,
  share_positive DECIMAL(5,4) NULL COMMENT 'share of analysed reviews; NULL when none',
  share_negative DECIMAL(5,4) NULL,
  share_neutral  DECIMAL(5,4) NULL,
  share_mixed    DECIMAL(5,4) NULL,
  PRIMARY KEY (hotel_id, day)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

CREATE TABLE IF NOT EXISTS aspect_sentiment (
  hotel_id       VARCHAR(64)  NOT NULL,
  day            DATE         NOT NULL,
  aspect         VARCHAR(32)  NOT NULL,
  mentions       INT          NOT NULL,
  positive       INT          NOT NULL,
  negative       INT          NOT NULL,
  neutral        INT          NOT NULL,
  share_positive DECIMAL(5,4) NOT NULL,
  share_negative DECIMAL(5,4) NOT NULL,
  PRIMARY KEY (hotel_id, day, aspect)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- The streaming job's exactly-once ledger: one row per committed micro-batch, written in the same
-- transaction as its results. A replayed batch (same query id and batch id) finds its row and is skipped.
CREATE TABLE IF NOT EXISTS stream_commits (
  query_id        CHAR(36)     NOT NULL COMMENT 'Spark StreamingQuery.id: kept in the checkpoint, new with a new one',
  batch_id        BIGINT       NOT NULL,
  query_name      VARCHAR(64)  NOT NULL,
  run_id          CHAR(36)     NOT NULL COMMENT 'job_runs row of the batch',
  rows_in         INT          NOT NULL COMMENT 'rows the micro-batch delivered = rows_selected + rows_rejected',
  rows_selected   INT          NOT NULL,
  rows_analysed   INT          NOT NULL,
  rows_rejected   INT          NOT NULL COMMENT 'rows without a usable review_id (see stream_rejects)',
  first_review_id BIGINT       NULL,
  last_review_id  BIGINT       NULL,
  committed_at    DATETIME(3)  NOT NULL,
  PRIMARY KEY (query_id, batch_id)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;

-- Rows a micro-batch delivered that cannot be keyed (no review_id, or a review_id twice in one batch):
-- kept whole, so nothing is lost silently.
CREATE TABLE IF NOT EXISTS stream_rejects (
  query_id   CHAR(36)     NOT NULL,
  batch_id   BIGINT       NOT NULL,
  seq        INT          NOT NULL,
  reason     VARCHAR(64)  NOT NULL,
  raw        MEDIUMTEXT   NOT NULL COMMENT 'the row as JSON',
  PRIMARY KEY (query_id, batch_id, seq)
) ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_unicode_ci;
