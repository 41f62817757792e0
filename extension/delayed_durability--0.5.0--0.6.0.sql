-- 0.5.0 -> 0.6.0: the configuration table of durability classes is
-- guarded (only delayed_durability_set_table_class() changes it, whatever
-- the grants); the view delayed_durability_settings (what is in force, per
-- database); CREATE/ALTER EXTENSION warn when the library is not
-- preloaded; receipts across promotions (last_commit_receipt(),
-- receipt_status()); failovers reported like crashes
-- (delayed_durability_failovers, delayed_durability_import_failover_record(),
-- delayed_durability_receive_failover_record() for a rejoined old primary,
-- lost_in in delayed_durability_lost_commits); what promoting each standby
-- would lose (delayed_durability_standby_exposure); pg_monitor reads the
-- crash report.
\echo Use "ALTER EXTENSION delayed_durability UPDATE TO '0.6.0'" to load this file. \quit

-- The lost commits view gains a column: replaced.
DROP VIEW delayed_durability_lost_commits;

CREATE FUNCTION "delayed_durability_table_class_config_guard"()
	RETURNS TRIGGER
	LANGUAGE c
	AS 'MODULE_PATHNAME', 'delayed_durability_table_class_config_guard_wrapper';

REVOKE ALL ON FUNCTION delayed_durability_table_class_config_guard() FROM PUBLIC;
-- Ordinary triggers (not ALWAYS): a logical replication apply worker
-- writes replicated classes past them.
CREATE TRIGGER delayed_durability_table_class_config_guard
    BEFORE INSERT OR UPDATE OR DELETE ON delayed_durability_table_class_config
    FOR EACH ROW EXECUTE FUNCTION delayed_durability_table_class_config_guard();
CREATE TRIGGER delayed_durability_table_class_config_guard_truncate
    BEFORE TRUNCATE ON delayed_durability_table_class_config
    FOR EACH STATEMENT EXECUTE FUNCTION delayed_durability_table_class_config_guard();

CREATE  FUNCTION "delayed_durability_cluster_settings"() RETURNS TABLE (
	"mode" TEXT,  /* Option < & '_ str > */
	"max_loss_bytes" bigint,  /* Option < i64 > */
	"max_loss_time_ms" bigint,  /* Option < i64 > */
	"track_lost_commits" bool,  /* Option < bool > */
	"library_preloaded" bool  /* bool */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'delayed_durability_cluster_settings_wrapper';

CREATE  FUNCTION "delayed_durability_warn_if_not_preloaded"() RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'delayed_durability_warn_if_not_preloaded_wrapper';

CREATE  FUNCTION "delayed_durability_exposure"(
	"lsn" bigint /* i64 */
) RETURNS TABLE (
	"commits" bigint,  /* Option < i64 > */
	"wal_bytes" bigint,  /* i64 */
	"oldest_acknowledged_at" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'delayed_durability_exposure_wrapper';

CREATE  FUNCTION "delayed_durability_failover_lost_rows"() RETURNS TABLE (
	"xid" bigint,  /* i64 */
	"datid" oid,  /* pg_sys :: Oid */
	"commit_end" bigint,  /* i64 */
	"acknowledged_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"failover_at" timestamp with time zone  /* Option < TimestampWithTimeZone > */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'delayed_durability_failover_lost_rows_wrapper';

CREATE  FUNCTION "delayed_durability_failover_rows"() RETURNS TABLE (
	"failover_at" timestamp with time zone,  /* Option < TimestampWithTimeZone > */
	"old_timeline" bigint,  /* i64 */
	"new_timeline" bigint,  /* i64 */
	"switch_end" bigint,  /* i64 */
	"lost_commits" bigint,  /* Option < i64 > */
	"exact" bool,  /* bool */
	"detail" TEXT  /* String */
)
STRICT VOLATILE PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'delayed_durability_failover_rows_wrapper';

CREATE  FUNCTION "delayed_durability_import_failover_record"(
	"path" TEXT, /* & str */
	"old_timeline" INT DEFAULT NULL /* Option < i32 > */
) RETURNS bigint /* i64 */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'delayed_durability_import_failover_record_wrapper';

CREATE  FUNCTION "delayed_durability_receive_failover_record"(
	"record" bytea, /* Option < & [u8] > */
	"sender" TEXT, /* Option < & str > */
	"old_timeline" INT DEFAULT NULL /* Option < i32 > */
) RETURNS bigint /* i64 */
VOLATILE PARALLEL UNSAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'delayed_durability_receive_failover_record_wrapper';

CREATE  FUNCTION "delayed_durability_standby_budget_state"() RETURNS TABLE (
	"slot_name" TEXT,  /* Option < String > */
	"streaming" bool,  /* Option < bool > */
	"confirmed_flush" bigint,  /* Option < i64 > */
	"wal_bytes_past" bigint,  /* Option < i64 > */
	"commits_waited" bigint,  /* i64 */
	"commits_fallen_back" bigint,  /* i64 */
	"waits_canceled" bigint  /* i64 */
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'delayed_durability_standby_budget_state_wrapper';

CREATE  FUNCTION "last_commit_receipt"() RETURNS TEXT /* Option < String > */
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'last_commit_receipt_wrapper';

CREATE  FUNCTION "receipt_status"(
	"receipt" TEXT /* & str */
) RETURNS TABLE (
	"status" TEXT,  /* String */
	"detail" TEXT  /* String */
)
STRICT VOLATILE PARALLEL RESTRICTED
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'receipt_status_wrapper';

-- What is in force, per database: its own setting (ALTER DATABASE ... SET)
-- over the cluster's (postgresql.conf, ALTER SYSTEM). Settings of roles
-- (ALTER ROLE ... SET) apply on top, per session: counted, not resolved.
CREATE VIEW delayed_durability_settings AS
    SELECT d.datname,
           coalesce(db.mode, c.mode) AS mode,
           CASE WHEN db.mode IS NOT NULL THEN 'database' WHEN c.library_preloaded THEN 'cluster' END AS mode_source,
           coalesce(pg_catalog.pg_size_bytes(db.max_loss_bytes), c.max_loss_bytes) AS max_loss_bytes,
           coalesce(CASE WHEN db.max_loss_time ~ '^[0-9]+$' THEN (db.max_loss_time || 'ms')::interval
                         ELSE db.max_loss_time::interval END,
                    c.max_loss_time_ms * interval '1 ms') AS max_loss_time,
           coalesce(db.track_lost_commits::boolean, c.track_lost_commits) AS track_lost_commits,
           (SELECT count(*) FROM pg_catalog.pg_db_role_setting r, unnest(r.setconfig) AS s
             WHERE r.setrole <> 0 AND r.setdatabase IN (0, d.oid) AND s LIKE 'delayed\_durability.%') AS role_settings,
           CASE WHEN d.datname = pg_catalog.current_database()
                THEN (SELECT count(*) FROM @extschema@.delayed_durability_table_class_config) END AS table_classes,
           c.library_preloaded
      FROM pg_catalog.pg_database AS d
     CROSS JOIN @extschema@.delayed_durability_cluster_settings() AS c
      LEFT JOIN LATERAL (
            SELECT max(split_part(s, '=', 2)) FILTER (WHERE s LIKE 'delayed\_durability.mode=%') AS mode,
                   max(split_part(s, '=', 2)) FILTER (WHERE s LIKE 'delayed\_durability.max\_loss\_bytes=%') AS max_loss_bytes,
                   max(split_part(s, '=', 2)) FILTER (WHERE s LIKE 'delayed\_durability.max\_loss\_time=%') AS max_loss_time,
                   max(split_part(s, '=', 2)) FILTER (WHERE s LIKE 'delayed\_durability.track\_lost\_commits=%') AS track_lost_commits
              FROM pg_catalog.pg_db_role_setting r, unnest(r.setconfig) AS s
             WHERE r.setdatabase = d.oid AND r.setrole = 0) AS db ON true
     WHERE d.datallowconn;
GRANT SELECT ON delayed_durability_settings TO PUBLIC;

SELECT @extschema@.delayed_durability_warn_if_not_preloaded();

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
REVOKE ALL ON FUNCTION delayed_durability_receive_failover_record(bytea, text, integer) FROM PUBLIC;
