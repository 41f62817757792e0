-- 0.5.0 -> 0.6.0: the configuration table of durability classes is
-- guarded (only delayed_durability_set_table_class() changes it, whatever
-- the grants); the view delayed_durability_settings (what is in force, per
-- database); pg_monitor reads the crash report; CREATE/ALTER EXTENSION warn
-- when the library is not preloaded.
\echo Use "ALTER EXTENSION delayed_durability UPDATE TO '0.6.0'" to load this file. \quit

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

GRANT SELECT ON delayed_durability_crashes, delayed_durability_lost_commits TO pg_monitor;
