-- 0.3.0 -> 0.4.0: bounded and known loss. The loss budget's counter
-- (commits_budget_flushed), the age of the oldest unflushed acknowledged
-- commit in delayed_durability_status(), durability receipts
-- (last_commit_lsn, is_durable, wait_durable) and the crash report
-- (delayed_durability_crashes, delayed_durability_lost_commits).
-- delayed_durability_status().wal_flushes reads PostgreSQL's WAL fsync count
-- through a function that knows where each server version keeps it.
\echo Use "ALTER EXTENSION delayed_durability UPDATE TO '0.4.0'" to load this file. \quit

-- The statistics function gains a column: the view over it is replaced.
DROP VIEW delayed_durability_stats;
DROP FUNCTION delayed_durability_stats_per_database();

CREATE FUNCTION "delayed_durability_stats_per_database"() RETURNS TABLE (
	"datid" oid,
	"commits_durable" bigint,
	"commits_delayed" bigint,
	"delayed_requests_ignored" bigint,
	"commits_forced_durable" bigint,
	"flush_log_calls" bigint,
	"sequence_values" bigint,
	"sequence_recovery_writes" bigint,
	"sequence_flushes" bigint,
	"commits_budget_flushed" bigint,
	"stats_reset" timestamp with time zone
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'delayed_durability_stats_per_database_wrapper';

CREATE VIEW delayed_durability_stats AS
    SELECT d.oid AS datid,
           d.datname,
           coalesce(s.commits_durable, 0) AS commits_durable,
           coalesce(s.commits_delayed, 0) AS commits_delayed,
           coalesce(s.delayed_requests_ignored, 0) AS delayed_requests_ignored,
           coalesce(s.commits_forced_durable, 0) AS commits_forced_durable,
           coalesce(s.commits_budget_flushed, 0) AS commits_budget_flushed,
           coalesce(s.flush_log_calls, 0) AS flush_log_calls,
           coalesce(s.sequence_values, 0) AS sequence_values,
           coalesce(s.sequence_recovery_writes, 0) AS sequence_recovery_writes,
           coalesce(s.sequence_flushes, 0) AS sequence_flushes,
           s.stats_reset
      FROM pg_catalog.pg_database AS d
      LEFT JOIN delayed_durability_stats_per_database() AS s ON s.datid = d.oid;

GRANT SELECT ON delayed_durability_stats TO PUBLIC;

CREATE FUNCTION "delayed_durability_oldest_unflushed_commit_age"() RETURNS interval
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'delayed_durability_oldest_unflushed_commit_age_wrapper';

-- PostgreSQL's WAL fsync count, read where the server version keeps it
-- (pg_stat_wal up to 17, pg_stat_io from 18).
CREATE FUNCTION "delayed_durability_wal_fsyncs"() RETURNS bigint
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c
AS 'MODULE_PATHNAME', 'delayed_durability_wal_fsyncs_wrapper';

-- Its OUT parameters change, so it is replaced, not altered.
DROP FUNCTION delayed_durability_status();

CREATE FUNCTION delayed_durability_status(
    OUT insert_lsn pg_lsn,
    OUT flush_lsn pg_lsn,
    OUT bytes_at_risk bigint,
    OUT wal_flushes bigint,
    OUT wal_buffer_is_pmem boolean,
    OUT wal_buffer_bytes_persisted bigint,
    OUT wal_buffer_fsyncs_avoided bigint,
    OUT wal_buffer_drains bigint,
    OUT wal_buffer_restored_bytes bigint,
    OUT oldest_unflushed_commit_age interval)
RETURNS record
LANGUAGE sql VOLATILE PARALLEL RESTRICTED
AS $$
    SELECT '0/0'::pg_lsn + p.insert_end::numeric,
           '0/0'::pg_lsn + p.flush_end::numeric,
           greatest(p.insert_end - p.flush_end, 0),
           delayed_durability_wal_fsyncs(),
           b.is_pmem, b.bytes_persisted, b.fsyncs_avoided, b.drains, b.restored_bytes,
           delayed_durability_oldest_unflushed_commit_age()
      FROM delayed_durability_wal_positions() AS p,
           delayed_durability_wal_buffer_state() AS b
$$;

CREATE FUNCTION last_commit_lsn() RETURNS pg_lsn
    VOLATILE PARALLEL RESTRICTED
    LANGUAGE c AS 'MODULE_PATHNAME', 'last_commit_lsn_wrapper';

CREATE FUNCTION is_durable(lsn pg_lsn) RETURNS boolean
    VOLATILE PARALLEL SAFE STRICT
    LANGUAGE c AS 'MODULE_PATHNAME', 'is_durable_wrapper';

CREATE FUNCTION wait_durable(lsn pg_lsn, timeout interval DEFAULT NULL) RETURNS boolean
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'wait_durable_wrapper';

CREATE FUNCTION "delayed_durability_crash_rows"() RETURNS TABLE (
	"crash_recovered_at" timestamp with time zone,
	"recovered_end" bigint,
	"lost_commits" bigint,
	"summarized_commits" bigint,
	"exact" bool,
	"detail" TEXT
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'delayed_durability_crash_rows_wrapper';

CREATE FUNCTION "delayed_durability_lost_commit_rows"() RETURNS TABLE (
	"xid" bigint,
	"datid" oid,
	"commit_end" bigint,
	"acknowledged_at" timestamp with time zone,
	"crash_recovered_at" timestamp with time zone
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'delayed_durability_lost_commit_rows_wrapper';

CREATE FUNCTION "delayed_durability_lost_commits_reset"() RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'delayed_durability_lost_commits_reset_wrapper';

CREATE VIEW delayed_durability_crashes AS
    SELECT c.crash_recovered_at,
           '0/0'::pg_lsn + c.recovered_end::numeric AS recovered_end_lsn,
           c.lost_commits,
           c.summarized_commits,
           c.exact,
           c.detail
      FROM delayed_durability_crash_rows() AS c;

CREATE VIEW delayed_durability_lost_commits AS
    SELECT l.xid::text::xid8 AS xid,
           l.datid,
           d.datname,
           '0/0'::pg_lsn + l.commit_end::numeric AS commit_lsn,
           l.acknowledged_at,
           l.crash_recovered_at
      FROM delayed_durability_lost_commit_rows() AS l
      LEFT JOIN pg_catalog.pg_database AS d ON d.oid = l.datid;

REVOKE ALL ON delayed_durability_crashes, delayed_durability_lost_commits FROM PUBLIC;
REVOKE ALL ON FUNCTION delayed_durability_lost_commits_reset() FROM PUBLIC;
