//! delayed_durability: SQL Server's delayed durability model for PostgreSQL.
//!
//! This file only wires the modules together: GUCs, hooks and shared memory
//! are set up in `_PG_init`, the way contrib modules such as
//! pg_stat_statements do it.

use pgrx::prelude::*;

mod commit;
mod commit_requests;
mod errors;
mod flush;
mod guc;
mod loss;
mod nothrow;
mod preload;
mod receipts;
mod sequence;
mod settings;
mod shmem;
mod stats;
mod table_class;
mod timeline;
mod walbuf;

pgrx::pg_module_magic!();

/// Runs when the library is loaded. Everything that needs the postmaster
/// (shared memory, hooks inherited by every backend) only happens when the
/// library is listed in `shared_preload_libraries`; otherwise the SQL
/// functions refuse to run and say how to fix it (see `preload.rs`).
#[pg_guard]
pub extern "C-unwind" fn _PG_init() {
    errors::disable_backtraces();
    // SAFETY: reading a postmaster-set global from the single backend thread.
    let preloading = unsafe { pg_sys::process_shared_preload_libraries_in_progress };
    if !preloading {
        return;
    }
    guc::define();
    sequence::define_gucs();
    walbuf::define_gucs();
    loss::define_gucs();
    stats::define_guc();
    guc::reserve_prefix();
    shmem::register(shmem::Region { request: stats::request_shared_memory, attach: stats::attach_shared_memory });
    shmem::register(shmem::Region { request: sequence::request_shared_memory, attach: sequence::attach_shared_memory });
    shmem::register(shmem::Region { request: walbuf::request_shared_memory, attach: walbuf::attach_shared_memory });
    // After the WAL buffer: its restore runs before the ring is compared.
    shmem::register(shmem::Region { request: loss::request_shared_memory, attach: loss::attach_shared_memory });
    shmem::register(shmem::Region { request: settings::request_shared_memory, attach: settings::attach_shared_memory });
    shmem::register(shmem::Region {
        request: table_class::request_shared_memory,
        attach: table_class::attach_shared_memory,
    });
    shmem::install_hooks();
    loss::register_worker();
    sequence::register_callbacks();
    table_class::register_callbacks();
    commit::install_hooks();
    preload::mark_preloaded();
}

// The objects CREATE EXTENSION makes beyond the functions pgrx generates:
// the statistics view and the SQL-level wrappers.
pgrx::extension_sql!(
    r#"
CREATE VIEW delayed_durability_stats AS
    SELECT d.oid AS datid,
           d.datname,
           coalesce(s.commits_durable, 0) AS commits_durable,
           coalesce(s.commits_delayed, 0) AS commits_delayed,
           coalesce(s.delayed_requests_ignored, 0) AS delayed_requests_ignored,
           coalesce(s.commits_forced_durable, 0) AS commits_forced_durable,
           coalesce(s.commits_budget_flushed, 0) AS commits_budget_flushed,
           coalesce(s.commits_durable_by_table, 0) AS commits_durable_by_table,
           coalesce(s.commits_delayed_by_table, 0) AS commits_delayed_by_table,
           coalesce(s.flush_log_calls, 0) AS flush_log_calls,
           coalesce(s.sequence_values, 0) AS sequence_values,
           coalesce(s.sequence_recovery_writes, 0) AS sequence_recovery_writes,
           coalesce(s.sequence_flushes, 0) AS sequence_flushes,
           s.stats_reset
      FROM pg_catalog.pg_database AS d
      LEFT JOIN delayed_durability_stats_per_database() AS s ON s.datid = d.oid;

GRANT SELECT ON delayed_durability_stats TO PUBLIC;

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

REVOKE ALL ON FUNCTION delayed_durability_stats_reset() FROM PUBLIC;

-- The crash report: readable by superusers and the roles granted SELECT on
-- the views (the functions under them check that privilege).
CREATE VIEW delayed_durability_crashes AS
    SELECT c.crash_recovered_at,
           '0/0'::pg_lsn + c.recovered_end::numeric AS recovered_end_lsn,
           c.lost_commits,
           c.summarized_commits,
           c.exact,
           c.detail
      FROM delayed_durability_crash_rows() AS c;

-- Lost in a crash, or in a failover (the old primary's record imported):
-- crash_recovered_at is then when the failover was recorded.
CREATE VIEW delayed_durability_lost_commits AS
    SELECT l.xid::text::xid8 AS xid,
           l.datid,
           d.datname,
           '0/0'::pg_lsn + l.commit_end::numeric AS commit_lsn,
           l.acknowledged_at,
           l.crash_recovered_at,
           'crash'::text AS lost_in
      FROM delayed_durability_lost_commit_rows() AS l
      LEFT JOIN pg_catalog.pg_database AS d ON d.oid = l.datid
    UNION ALL
    SELECT f.xid::text::xid8,
           f.datid,
           d.datname,
           '0/0'::pg_lsn + f.commit_end::numeric,
           f.acknowledged_at,
           f.failover_at,
           'failover'
      FROM delayed_durability_failover_lost_rows() AS f
      LEFT JOIN pg_catalog.pg_database AS d ON d.oid = f.datid;

-- Failovers this server went through (promotions), reported like crashes.
CREATE VIEW delayed_durability_failovers AS
    SELECT f.failover_at,
           f.old_timeline,
           f.new_timeline,
           '0/0'::pg_lsn + f.switch_end::numeric AS switch_lsn,
           f.lost_commits,
           f.exact,
           f.detail
      FROM delayed_durability_failover_rows() AS f;

-- What promoting each connected standby now would lose.
CREATE VIEW delayed_durability_standby_exposure AS
    SELECT s.application_name,
           s.client_addr,
           s.flush_lsn,
           e.commits AS delayed_commits,
           e.wal_bytes,
           now() - e.oldest_acknowledged_at AS oldest_commit_age
      FROM pg_catalog.pg_stat_replication AS s
      LEFT JOIN LATERAL delayed_durability_exposure((s.flush_lsn - '0/0'::pg_lsn)::bigint) AS e ON true;

-- The byte loss budget kept against a standby (budget_standby_slot).
CREATE VIEW delayed_durability_standby_budget AS
    SELECT b.slot_name,
           b.streaming,
           '0/0'::pg_lsn + b.confirmed_flush::numeric AS confirmed_flush_lsn,
           b.wal_bytes_past,
           b.commits_waited,
           b.commits_fallen_back,
           b.waits_canceled
      FROM delayed_durability_standby_budget_state() AS b;
GRANT SELECT ON delayed_durability_standby_budget TO PUBLIC;

REVOKE ALL ON delayed_durability_crashes, delayed_durability_lost_commits, delayed_durability_failovers,
    delayed_durability_standby_exposure FROM PUBLIC;
-- Read-only monitoring, as PostgreSQL grants its own monitoring views.
GRANT SELECT ON delayed_durability_crashes, delayed_durability_lost_commits, delayed_durability_failovers,
    delayed_durability_standby_exposure TO pg_monitor;
REVOKE ALL ON FUNCTION delayed_durability_import_failover_record(text, integer) FROM PUBLIC;
-- Granted by a superuser to the role a rejoined old primary delivers its record as.
REVOKE ALL ON FUNCTION delayed_durability_receive_failover_record(bytea, text, integer) FROM PUBLIC;
REVOKE ALL ON FUNCTION delayed_durability_lost_commits_reset() FROM PUBLIC;
"#,
    name = "views_and_wrappers",
    finalize,
);
