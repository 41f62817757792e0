-- flush_log() and delayed_durability_status(): WAL positions.
CREATE EXTENSION IF NOT EXISTS delayed_durability;
CREATE TABLE f (id int);
SET delayed_durability.mode = 'forced';

-- A delayed commit leaves WAL unflushed; flush_log() hardens it.
INSERT INTO f VALUES (1);
SELECT pg_current_wal_insert_lsn() AS after_commit \gset
SELECT flush_lsn < :'after_commit'::pg_lsn AS behind_commit,
       bytes_at_risk > 0 AS at_risk
  FROM delayed_durability_status();
SELECT flush_log() >= :'after_commit'::pg_lsn AS flushed_past_commit;
SELECT pg_current_wal_flush_lsn() >= :'after_commit'::pg_lsn AS flushed_past_commit;
SELECT flush_lsn >= :'after_commit'::pg_lsn AS flushed, bytes_at_risk = 0 AS nothing_at_risk
  FROM delayed_durability_status();

-- The status columns and their types.
SELECT pg_typeof(insert_lsn), pg_typeof(flush_lsn), pg_typeof(bytes_at_risk), pg_typeof(wal_flushes)
  FROM delayed_durability_status();
SELECT insert_lsn >= flush_lsn AS ordered FROM delayed_durability_status();
-- wal_flushes is PostgreSQL's own count of WAL fsyncs: pg_stat_wal.wal_sync
-- up to 17; PostgreSQL 18 dropped that column for pg_stat_io's WAL rows.
SELECT CASE WHEN current_setting('server_version_num')::int >= 180000
            THEN '(SELECT sum(fsyncs) FROM pg_stat_io WHERE object = ''wal'' AND context = ''normal'')'
            ELSE '(SELECT wal_sync FROM pg_stat_wal)' END AS postgresql_wal_fsyncs \gset
SELECT s.wal_flushes = :postgresql_wal_fsyncs AS same_as_postgresql_count
  FROM delayed_durability_status() AS s;

-- That the count grows with durable commits is checked in t/002 (the
-- function) and t/014 (this column).
-- Right after a segment switch the insert position sits after the next
-- segment's page header: flush_log() must not ask for bytes nobody wrote.
INSERT INTO f VALUES (2);
SELECT pg_switch_wal() AS switched_at \gset
SELECT flush_log() = pg_current_wal_flush_lsn() AS flushed_to_boundary;
SELECT flush_log() = pg_current_wal_flush_lsn() AS repeatable;
SELECT flush_log() - '0/0'::pg_lsn >= (div(:'switched_at'::pg_lsn - '0/0'::pg_lsn,
         pg_size_bytes(current_setting('wal_segment_size'))) + 1)
         * pg_size_bytes(current_setting('wal_segment_size')) AS reached_next_segment;

-- At a page boundary: fill WAL until the insert position is right after a
-- page header, then flush.
DO $$
DECLARE
  pos pg_lsn;
  tries int := 0;
BEGIN
  LOOP
    PERFORM pg_logical_emit_message(false, 'dd', repeat('x', 10 + (tries % 200)));
    pos := pg_current_wal_insert_lsn();
    EXIT WHEN (pos - '0/0'::pg_lsn) % 8192 = 24 OR tries > 200000;
    tries := tries + 1;
  END LOOP;
  IF flush_log() < pos - 24 THEN
    RAISE EXCEPTION 'flush_log() stopped short of %', pos;
  END IF;
END $$;
SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn) % 8192 AS page_offset;
SELECT flush_log() >= pg_current_wal_insert_lsn() - 24 AS flushed_to_page_boundary;

-- Callable by any user; counted per database.
SELECT flush_log_calls AS calls FROM delayed_durability_stats
 WHERE datname = current_database() \gset
CREATE ROLE dd_flusher;
SET ROLE dd_flusher;
SELECT flush_log() IS NOT NULL AS flushed;
SELECT insert_lsn IS NOT NULL AS readable FROM delayed_durability_status();
RESET ROLE;
DROP ROLE dd_flusher;
SELECT flush_log_calls - :calls AS new_calls FROM delayed_durability_stats
 WHERE datname = current_database();

-- Inside a transaction block it flushes what was inserted so far,
-- including the open transaction's own records.
BEGIN;
INSERT INTO f VALUES (3);
SELECT flush_log() >= pg_current_wal_insert_lsn() - 24 AS flushed_in_block;
COMMIT;

DROP TABLE f;

-- Without delayed_durability.wal_buffer_path the buffer columns say "off".
SELECT wal_buffer_is_pmem IS NULL AS buffer_off,
       wal_buffer_bytes_persisted + wal_buffer_fsyncs_avoided
         + wal_buffer_drains + wal_buffer_restored_bytes AS buffer_counters
  FROM delayed_durability_status();

-- The buffer's settings: defaults, and only at server start.
SHOW delayed_durability.wal_buffer_path;
SHOW delayed_durability.wal_buffer_size;
SET delayed_durability.wal_buffer_size = '32MB';
SHOW delayed_durability.wal_buffer_allow_volatile;
SET delayed_durability.wal_buffer_allow_volatile = on;
