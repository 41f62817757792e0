-- 0.6.0 -> 0.6.1: the view delayed_durability_settings reads a database's
-- max_loss_bytes and max_loss_time as the settings themselves read them
-- (delayed_durability_setting_value()): a value written '8192B' or
-- '0x4000' made the whole view fail. The mode is shown in lower case;
-- track_lost_commits is the cluster's (a database cannot set it: text
-- stored while the library was not loaded made the view fail).
\echo Use "ALTER EXTENSION delayed_durability UPDATE TO '0.6.1'" to load this file. \quit

CREATE  FUNCTION "delayed_durability_setting_value"(
	"name" TEXT, /* &str */
	"value" TEXT /* &str */
) RETURNS bigint /* Option < i64 > */
IMMUTABLE STRICT PARALLEL SAFE
LANGUAGE c /* Rust */
AS 'MODULE_PATHNAME', 'delayed_durability_setting_value_wrapper';

CREATE OR REPLACE VIEW delayed_durability_settings AS
    SELECT d.datname,
           coalesce(pg_catalog.lower(db.mode), c.mode) AS mode,
           CASE WHEN db.mode IS NOT NULL THEN 'database' WHEN c.library_preloaded THEN 'cluster' END AS mode_source,
           coalesce(@extschema@.delayed_durability_setting_value('delayed_durability.max_loss_bytes', db.max_loss_bytes),
                    c.max_loss_bytes) AS max_loss_bytes,
           coalesce(@extschema@.delayed_durability_setting_value('delayed_durability.max_loss_time', db.max_loss_time),
                    c.max_loss_time_ms) * interval '1 ms' AS max_loss_time,
           c.track_lost_commits,
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
                   max(split_part(s, '=', 2)) FILTER (WHERE s LIKE 'delayed\_durability.max\_loss\_time=%') AS max_loss_time
              FROM pg_catalog.pg_db_role_setting r, unnest(r.setconfig) AS s
             WHERE r.setdatabase = d.oid AND r.setrole = 0) AS db ON true
     WHERE d.datallowconn;
