-- 0.1.0 -> 0.2.0: the persistent WAL buffer's state in delayed_durability_status().
\echo Use "ALTER EXTENSION delayed_durability UPDATE TO '0.2.0'" to load this file. \quit

CREATE FUNCTION "delayed_durability_wal_buffer_state"() RETURNS TABLE (
	"is_pmem" bool,
	"bytes_persisted" bigint,
	"fsyncs_avoided" bigint,
	"drains" bigint,
	"restored_bytes" bigint
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'delayed_durability_wal_buffer_state_wrapper';

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
    OUT wal_buffer_restored_bytes bigint)
RETURNS record
LANGUAGE sql VOLATILE PARALLEL SAFE
AS $$
    SELECT '0/0'::pg_lsn + p.insert_end::numeric,
           '0/0'::pg_lsn + p.flush_end::numeric,
           greatest(p.insert_end - p.flush_end, 0),
           (SELECT w.wal_sync FROM pg_catalog.pg_stat_wal AS w),
           b.is_pmem, b.bytes_persisted, b.fsyncs_avoided, b.drains, b.restored_bytes
      FROM delayed_durability_wal_positions() AS p,
           delayed_durability_wal_buffer_state() AS b
$$;
