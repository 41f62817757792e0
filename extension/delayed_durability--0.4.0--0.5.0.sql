-- 0.4.0 -> 0.5.0: durability per table. Table classes (durable, delayed)
-- kept in a configuration table that pg_dump keeps, set with
-- delayed_durability_set_table_class() and shown by
-- delayed_durability_table_classes; the counters commits_durable_by_table
-- and commits_delayed_by_table.
\echo Use "ALTER EXTENSION delayed_durability UPDATE TO '0.5.0'" to load this file. \quit

-- The statistics function gains two columns: the view over it is replaced.
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
	"commits_durable_by_table" bigint,
	"commits_delayed_by_table" bigint,
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

CREATE FUNCTION delayed_durability_set_table_class(tbl regclass, class text) RETURNS void
VOLATILE PARALLEL UNSAFE LANGUAGE c
AS 'MODULE_PATHNAME', 'delayed_durability_set_table_class_wrapper';

CREATE FUNCTION "delayed_durability_table_classes_changed"() RETURNS void
STRICT VOLATILE PARALLEL UNSAFE
LANGUAGE c
AS 'MODULE_PATHNAME', 'delayed_durability_table_classes_changed_wrapper';

CREATE TABLE delayed_durability_table_class_config (
    relid regclass PRIMARY KEY,
    class text NOT NULL CHECK (class IN ('durable', 'delayed'))
);
-- Rows naming a dropped table (a DROP the event trigger did not see) are
-- not dumped: restored, their OID could name another table.
SELECT pg_catalog.pg_extension_config_dump('delayed_durability_table_class_config',
    'WHERE relid::oid IN (SELECT oid FROM pg_catalog.pg_class)');
REVOKE ALL ON delayed_durability_table_class_config FROM PUBLIC;
REVOKE ALL ON FUNCTION delayed_durability_table_classes_changed() FROM PUBLIC;

CREATE FUNCTION delayed_durability_table_class_config_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM @extschema@.delayed_durability_table_classes_changed();
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION delayed_durability_table_class_config_changed() FROM PUBLIC;
-- Row triggers, as logical replication's apply fires no statement trigger
-- for INSERT, UPDATE and DELETE; TRUNCATE has only a statement trigger.
-- Enabled always: also when rows arrive by logical replication or with
-- session_replication_role = replica.
CREATE TRIGGER delayed_durability_table_class_config_changed
    AFTER INSERT OR UPDATE OR DELETE ON delayed_durability_table_class_config
    FOR EACH ROW EXECUTE FUNCTION delayed_durability_table_class_config_changed();
CREATE TRIGGER delayed_durability_table_class_config_truncated
    AFTER TRUNCATE ON delayed_durability_table_class_config
    FOR EACH STATEMENT EXECUTE FUNCTION delayed_durability_table_class_config_changed();
ALTER TABLE delayed_durability_table_class_config
    ENABLE ALWAYS TRIGGER delayed_durability_table_class_config_changed,
    ENABLE ALWAYS TRIGGER delayed_durability_table_class_config_truncated;

CREATE FUNCTION delayed_durability_forget_dropped_tables() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- Only when a classified table was dropped: a change of the classes
    -- makes every session read them again.
    IF EXISTS (SELECT FROM @extschema@.delayed_durability_table_class_config
                WHERE relid::oid IN (SELECT objid FROM pg_event_trigger_dropped_objects()
                                      WHERE classid = 'pg_class'::regclass AND objsubid = 0)) THEN
        DELETE FROM @extschema@.delayed_durability_table_class_config
         WHERE relid::oid IN (SELECT objid FROM pg_event_trigger_dropped_objects()
                               WHERE classid = 'pg_class'::regclass AND objsubid = 0);
    END IF;
END $$;
REVOKE ALL ON FUNCTION delayed_durability_forget_dropped_tables() FROM PUBLIC;
CREATE EVENT TRIGGER delayed_durability_forget_dropped_tables ON sql_drop
    EXECUTE FUNCTION delayed_durability_forget_dropped_tables();
ALTER EVENT TRIGGER delayed_durability_forget_dropped_tables ENABLE ALWAYS;

CREATE VIEW delayed_durability_table_classes AS
    SELECT n.nspname AS schema, c.relname AS "table", t.class
      FROM delayed_durability_table_class_config AS t
      JOIN pg_catalog.pg_class AS c ON c.oid = t.relid
      JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace;
GRANT SELECT ON delayed_durability_table_classes TO PUBLIC;
