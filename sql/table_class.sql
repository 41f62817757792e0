-- Durability per table: each class x each mode x each way a transaction
-- modifies a table, read from the WAL flush position and the counters;
-- precedence, partitions, TOAST, temporary and unlogged tables, privileges,
-- DROP/RENAME/SET SCHEMA. Crashes, pg_dump and logical replication are in
-- t/024_table_class.pl.
CREATE EXTENSION IF NOT EXISTS delayed_durability;

-- Independent of the counters: is PostgreSQL's WAL flush position at or past
-- the end of this session's last commit record (its receipt)? WAL written
-- after the commit (a running-transactions record, hint-bit images) does not
-- matter.
CREATE FUNCTION tc_flushed() RETURNS boolean LANGUAGE sql VOLATILE AS $$
  SELECT pg_current_wal_flush_lsn() >= last_commit_lsn() $$;
CREATE FUNCTION tc_counters(OUT by_table_durable bigint, OUT by_table_delayed bigint, OUT ignored bigint)
LANGUAGE sql AS $$
  SELECT commits_durable_by_table, commits_delayed_by_table, delayed_requests_ignored
    FROM delayed_durability_stats WHERE datname = current_database() $$;

-- tgt is the table under test; dly (class delayed) is written beside it
-- where a case needs a second table, fkp is the foreign-key parent.
CREATE TABLE dly (i int);
CREATE TABLE fkp (id int PRIMARY KEY);
CREATE TABLE tgt (id serial PRIMARY KEY, v int, p int REFERENCES fkp ON DELETE CASCADE);
SELECT delayed_durability_set_table_class('dly', 'delayed');
SELECT delayed_durability_set_table_class('fkp', 'delayed');
-- Writes into tgt that the statement itself does not name.
CREATE VIEW tgt_trigger_view AS SELECT v FROM tgt;
CREATE FUNCTION tgt_trigger_view_insert() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN INSERT INTO tgt (v) VALUES (NEW.v); RETURN NEW; END $$;
CREATE TRIGGER tgt_trigger_view_insert INSTEAD OF INSERT ON tgt_trigger_view
  FOR EACH ROW EXECUTE FUNCTION tgt_trigger_view_insert();
CREATE VIEW tgt_rule_view AS SELECT v FROM tgt WHERE false;
CREATE RULE tgt_rule_view_insert AS ON INSERT TO tgt_rule_view DO INSTEAD INSERT INTO tgt (v) VALUES (NEW.v);
CREATE FUNCTION insert_into_tgt() RETURNS void LANGUAGE sql AS $$ INSERT INTO tgt (v) VALUES (8) $$;
CREATE PROCEDURE insert_into_tgt_proc() LANGUAGE sql AS $$ INSERT INTO tgt (v) VALUES (9) $$;
CREATE FUNCTION insert_into_tgt_in_subtransaction(fail boolean) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
  BEGIN
    INSERT INTO tgt (v) VALUES (10);
    IF fail THEN RAISE EXCEPTION 'roll the subtransaction back'; END IF;
  EXCEPTION WHEN raise_exception THEN NULL;
  END;
END $$;

CREATE TABLE tc_cases (ord int, kind text, sql text);
INSERT INTO tc_cases VALUES
  (1, 'insert', 'INSERT INTO tgt (v) VALUES (1)'),
  (2, 'update', 'UPDATE tgt SET v = v + 1 WHERE id = (SELECT min(id) FROM tgt)'),
  (3, 'delete', 'DELETE FROM tgt WHERE id = (SELECT max(id) FROM tgt)'),
  (4, 'merge', 'MERGE INTO tgt USING (SELECT min(id) AS id FROM tgt) AS s ON tgt.id = s.id WHEN MATCHED THEN UPDATE SET v = tgt.v + 1'),
  (5, 'copy from', 'COPY tgt (v) FROM PROGRAM ''echo 7'''),
  (6, 'insert on conflict', 'INSERT INTO tgt (id, v) SELECT min(id), 0 FROM tgt ON CONFLICT (id) DO UPDATE SET v = tgt.v + 1'),
  (7, 'trigger', 'INSERT INTO tgt_trigger_view VALUES (5)'),
  (8, 'rule', 'INSERT INTO tgt_rule_view VALUES (6)'),
  (9, 'function', 'SELECT insert_into_tgt()'),
  (10, 'procedure', 'CALL insert_into_tgt_proc()'),
  (11, 'released subtransaction', 'SELECT insert_into_tgt_in_subtransaction(false)'),
  (12, 'rolled-back subtransaction (+dly)', 'INSERT INTO dly VALUES (1); SELECT insert_into_tgt_in_subtransaction(true)'),
  (13, 'foreign-key cascade (+fkp)', 'DELETE FROM fkp WHERE id = (SELECT max(p) FROM tgt)'),
  (14, 'truncate', 'TRUNCATE tgt');

-- One transaction per case, committed inside the procedure; the outcome is
-- read right after each commit from PostgreSQL's positions: durable when
-- the flush position passed the insert position taken inside the
-- transaction just before COMMIT (the commit record lies beyond it). The
-- receipt (tc_flushed()) must agree. The WAL writer flushes at most every
-- 10 s and never by volume here (regress.conf).
CREATE PROCEDURE tc_run(tgt_class text) LANGUAGE plpgsql AS $$
DECLARE
  m text;
  c record;
  b record;
  a record;
  g int := 0;
  before_commit pg_lsn;
  durable boolean;
BEGIN
  PERFORM delayed_durability_set_table_class('tgt', tgt_class);
  COMMIT;
  FOREACH m IN ARRAY ARRAY['disabled', 'allowed', 'forced'] LOOP
    -- Fresh rows for this mode's cases (not checked).
    g := g + 1;
    DELETE FROM tgt;
    INSERT INTO fkp VALUES ((SELECT coalesce(max(id), 0) + 1 FROM fkp));
    INSERT INTO tgt (v, p) SELECT i, (SELECT max(id) FROM fkp) FROM generate_series(1, 10) AS i;
    COMMIT;
    PERFORM set_config('delayed_durability.mode', m, false);
    FOR c IN SELECT * FROM tc_cases ORDER BY ord LOOP
      SELECT * INTO b FROM tc_counters();
      EXECUTE c.sql;
      before_commit := pg_current_wal_insert_lsn();
      COMMIT;
      durable := pg_current_wal_flush_lsn() > before_commit;
      SELECT * INTO a FROM tc_counters();
      RAISE NOTICE '% % %: %, by_table_durable +%, by_table_delayed +%, ignored +%',
        coalesce(tgt_class, 'none'), m, c.kind,
        CASE WHEN durable THEN 'durable' ELSE 'delayed' END
          || CASE WHEN durable <> tc_flushed() THEN ' (the receipt disagrees)' ELSE '' END,
        a.by_table_durable - b.by_table_durable, a.by_table_delayed - b.by_table_delayed, a.ignored - b.ignored;
    END LOOP;
  END LOOP;
  PERFORM set_config('delayed_durability.mode', 'allowed', false);
END $$;

-- durable: every commit that modified tgt is durable. A rolled-back
-- subtransaction's write does not count: that commit modified only dly.
-- Under forced, counted in by_table_durable (the mode would have delayed it).
CALL tc_run('durable');
-- delayed: delayed under allowed and forced, durable under disabled (the
-- DBA's word wins, counted as an ignored request). TRUNCATE drops a file
-- (PostgreSQL always flushes that commit) and writes pg_class, a table
-- without a class.
CALL tc_run('delayed');
-- No class: the mode decides (allowed makes a plain commit durable), except
-- where the commit modified only dly.
CALL tc_run(NULL);

CREATE TABLE payments (id int, note text);
-- Setting a class is itself a durable commit, even forced.
SET delayed_durability.mode = 'forced';
SELECT delayed_durability_set_table_class('payments', 'durable');
SELECT tc_flushed() AS class_change_is_durable;
-- A durable and a delayed table in one transaction: durable, even forced.
BEGIN;
INSERT INTO dly VALUES (1);
INSERT INTO payments VALUES (1);
COMMIT;
SELECT tc_flushed() AS durable_and_delayed_is_durable;
-- With track_counts off PostgreSQL counts no write, so what a transaction
-- modified is unknown: while any table is durable, every commit is, and
-- none is delayed by its class.
SELECT * FROM tc_counters() \gset b_
SET track_counts = off;
INSERT INTO dly VALUES (1);
SELECT tc_flushed() AS untracked_forced_is_durable;
RESET track_counts;
SELECT by_table_durable - :b_by_table_durable AS by_table_durable,
       by_table_delayed - :b_by_table_delayed AS by_table_delayed FROM tc_counters();
SET delayed_durability.mode = 'allowed';
-- The durable class wins over commit_delayed() and synchronous_commit = off.
BEGIN;
SELECT commit_delayed();
SET LOCAL synchronous_commit = off;
INSERT INTO payments VALUES (2);
COMMIT;
SELECT tc_flushed() AS durable_over_commit_delayed;
-- A read-only transaction and a transaction that wrote nothing classified.
SELECT count(*) FROM payments;
CREATE TABLE plain (i int);
INSERT INTO plain VALUES (1);
SELECT tc_flushed() AS unclassified_allowed_is_durable;
-- Delayed with temporary and unlogged tables: still delayed; with an
-- unclassified permanent table: durable under allowed.
CREATE TEMP TABLE tmp (i int);
CREATE UNLOGGED TABLE unl (i int);
BEGIN; INSERT INTO dly VALUES (2); INSERT INTO tmp VALUES (1); INSERT INTO unl VALUES (1); COMMIT;
SELECT tc_flushed() AS delayed_with_temp_and_unlogged_is_durable;
BEGIN; INSERT INTO dly VALUES (3); INSERT INTO plain VALUES (2); COMMIT;
SELECT tc_flushed() AS delayed_with_unclassified_is_durable;
-- TOAST: a large value goes to the TOAST table, which follows its table.
CREATE TABLE dly_wide (t text);
SELECT delayed_durability_set_table_class('dly_wide', 'delayed');
INSERT INTO dly_wide SELECT string_agg(md5(i::text), '') FROM generate_series(1, 2000) AS i;
SELECT tc_flushed() AS toasted_delayed_is_durable,
       (SELECT pg_relation_size(reltoastrelid) > 0 FROM pg_class WHERE relname = 'dly_wide') AS toast_written;
-- Setting the class a table already has writes nothing (the row keeps its
-- xmin); setting another one rewrites it.
SELECT xmin AS class_row_xmin FROM delayed_durability_table_class_config WHERE relid = 'dly_wide'::regclass \gset
SELECT delayed_durability_set_table_class('dly_wide', 'delayed');
SELECT xmin::text = :'class_row_xmin' AS same_class_unchanged
  FROM delayed_durability_table_class_config WHERE relid = 'dly_wide'::regclass;
SELECT delayed_durability_set_table_class('dly_wide', 'durable');
SELECT delayed_durability_set_table_class('dly_wide', 'delayed');
SELECT xmin::text <> :'class_row_xmin' AS other_class_rewritten
  FROM delayed_durability_table_class_config WHERE relid = 'dly_wide'::regclass;

-- Partitions: a partitioned table's class applies to every partition, at
-- any depth, whether the rows go through the parent or straight into the
-- partition, including partitions created or attached after the class was
-- set; a partition's own class wins over its ancestors'.
CREATE TABLE events (k int, v text) PARTITION BY RANGE (k);
CREATE TABLE events_1 PARTITION OF events FOR VALUES FROM (0) TO (100);
SELECT delayed_durability_set_table_class('events', 'durable');
SET delayed_durability.mode = 'forced';
INSERT INTO events VALUES (1, 'through the parent');
SELECT tc_flushed() AS partition_via_parent_durable;
INSERT INTO events_1 VALUES (2, 'straight into the partition');
SELECT tc_flushed() AS partition_direct_durable;
CREATE TABLE events_2 PARTITION OF events FOR VALUES FROM (100) TO (200) PARTITION BY RANGE (k);
CREATE TABLE events_2a PARTITION OF events_2 FOR VALUES FROM (100) TO (150);
INSERT INTO events_2a VALUES (101, 'created after the class, two levels down');
SELECT tc_flushed() AS new_subpartition_durable;
CREATE TABLE events_3 (k int, v text);
INSERT INTO events_3 VALUES (250, 'before attach');
SELECT tc_flushed() AS unattached_delayed_under_forced;
ALTER TABLE events ATTACH PARTITION events_3 FOR VALUES FROM (200) TO (300);
INSERT INTO events_3 VALUES (251, 'attached');
SELECT tc_flushed() AS attached_durable;
SELECT delayed_durability_set_table_class('events_2', 'delayed');
SET delayed_durability.mode = 'allowed';
INSERT INTO events_2a VALUES (102, 'nearest class is delayed');
SELECT tc_flushed() AS nearest_ancestor_wins;
SET delayed_durability.mode = 'forced';
ALTER TABLE events DETACH PARTITION events_3;
INSERT INTO events_3 VALUES (252, 'detached');
SELECT tc_flushed() AS detached_follows_mode;
SET delayed_durability.mode = 'allowed';

-- The view, and what DDL does to classes: RENAME and SET SCHEMA keep them
-- (the class belongs to the table), DROP removes them.
CREATE SCHEMA archive;
CREATE TABLE renamed_me (i int);
CREATE TABLE moved_me (i int);
CREATE TABLE dropped_me (i int);
SELECT delayed_durability_set_table_class('renamed_me', 'durable');
SELECT delayed_durability_set_table_class('moved_me', 'delayed');
SELECT delayed_durability_set_table_class('dropped_me', 'durable');
ALTER TABLE renamed_me RENAME TO renamed;
ALTER TABLE moved_me SET SCHEMA archive;
DROP TABLE dropped_me;
SELECT * FROM delayed_durability_table_classes ORDER BY schema, "table";
-- DROP SCHEMA ... CASCADE drops the class of the tables in it.
DROP SCHEMA archive CASCADE;
SELECT count(*) AS archive_classes FROM delayed_durability_table_classes WHERE schema = 'archive';
SELECT count(*) AS rows_left_for_dropped FROM delayed_durability_table_class_config
 WHERE relid::text LIKE '%dropped_me%' OR relid::text ~ '^[0-9]+$';
SET delayed_durability.mode = 'forced';
INSERT INTO renamed VALUES (1);
SELECT tc_flushed() AS renamed_keeps_durable;
-- NULL clears a class.
SELECT delayed_durability_set_table_class('renamed', NULL);
INSERT INTO renamed VALUES (2);
SELECT tc_flushed() AS cleared_follows_forced;
SET delayed_durability.mode = 'allowed';

-- Errors.
\set VERBOSITY sqlstate
SELECT delayed_durability_set_table_class('payments', 'fast');
SELECT delayed_durability_set_table_class(NULL, 'durable');
SELECT delayed_durability_set_table_class('tgt_trigger_view', 'durable');
SELECT delayed_durability_set_table_class('tmp', 'durable');
SELECT delayed_durability_set_table_class('no_such_table', 'durable');
SELECT delayed_durability_set_table_class('pg_class', 'durable');
SELECT delayed_durability_set_table_class('delayed_durability_table_class_config', 'durable');
\set VERBOSITY default
SELECT delayed_durability_set_table_class('payments', 'fast');
SELECT delayed_durability_set_table_class('tgt_trigger_view', 'durable');

-- Privileges: the owner, a member of the owning role and a superuser may
-- set a class; anyone else gets 42501, and nobody writes the configuration
-- table directly.
CREATE ROLE regress_tc_owner;
CREATE ROLE regress_tc_member IN ROLE regress_tc_owner;
CREATE ROLE regress_tc_other;
CREATE TABLE owned (i int);
ALTER TABLE owned OWNER TO regress_tc_owner;
SET ROLE regress_tc_other;
\set VERBOSITY sqlstate
SELECT delayed_durability_set_table_class('owned', 'durable');
INSERT INTO delayed_durability_table_class_config VALUES ('owned', 'durable');
\set VERBOSITY default
SELECT delayed_durability_set_table_class('owned', 'durable');
SELECT * FROM delayed_durability_table_classes WHERE "table" = 'owned';
SET ROLE regress_tc_owner;
SELECT delayed_durability_set_table_class('owned', 'delayed');
SET ROLE regress_tc_member;
SELECT delayed_durability_set_table_class('owned', 'durable');
RESET ROLE;
SELECT * FROM delayed_durability_table_classes WHERE "table" = 'owned';
DROP TABLE owned;
DROP ROLE regress_tc_owner, regress_tc_member, regress_tc_other;

-- nextval() in a transaction that writes only delayed tables does not make
-- its commit durable (a serial column of a delayed table would otherwise
-- make every such commit durable): like any delayed commit's, its values
-- can be handed out again after a crash. cached_nextval() flushes its
-- recovery value before it returns a value, whatever the commit: the one
-- for numbers that must never repeat.
SET delayed_durability.mode = 'allowed';
CREATE SEQUENCE invoice_no;
BEGIN;
INSERT INTO dly SELECT nextval('invoice_no');
COMMIT;
SELECT tc_flushed() AS nextval_commit_flushed;
BEGIN;
SELECT pg_current_wal_insert_lsn() AS before_call \gset
INSERT INTO dly SELECT cached_nextval('invoice_no');
SELECT pg_current_wal_flush_lsn() > :'before_call'::pg_lsn AS cached_nextval_recovery_value_flushed;
COMMIT;
SELECT tc_flushed() AS cached_nextval_commit_flushed;
RESET delayed_durability.mode;

-- Only delayed_durability_set_table_class() changes the configuration
-- table, whatever the grants: a routine GRANT ALL ON ALL TABLES IN SCHEMA
-- public does not let a role clear a durable class.
CREATE TABLE granted_payments (id int);
SELECT delayed_durability_set_table_class('granted_payments', 'durable');
CREATE ROLE regress_tc_app;
GRANT ALL ON ALL TABLES IN SCHEMA public TO regress_tc_app;
SET ROLE regress_tc_app;
DELETE FROM delayed_durability_table_class_config;
UPDATE delayed_durability_table_class_config SET class = 'delayed';
INSERT INTO delayed_durability_table_class_config VALUES ('tgt', 'delayed');
TRUNCATE delayed_durability_table_class_config;
-- Nor inside a subtransaction after a failed call of the function.
DO $$
BEGIN
  BEGIN
    PERFORM delayed_durability_set_table_class('granted_payments', NULL);
  EXCEPTION WHEN insufficient_privilege THEN NULL;
  END;
  DELETE FROM delayed_durability_table_class_config;
END $$;
RESET ROLE;
SELECT "table", class FROM delayed_durability_table_classes WHERE "table" = 'granted_payments';
-- The owner still sets classes through the function.
SELECT delayed_durability_set_table_class('granted_payments', NULL);
SELECT count(*) AS cleared FROM delayed_durability_table_classes WHERE "table" = 'granted_payments';
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM regress_tc_app;
DROP TABLE granted_payments;
DROP ROLE regress_tc_app;

-- A transaction that writes more tables than the first pass of the walk
-- over its written tables holds (16): one durable table among 20 makes it
-- durable, even forced; 20 delayed ones leave it delayed.
DO $$ BEGIN FOR i IN 1 .. 20 LOOP EXECUTE format('CREATE TABLE many_%s (i int)', i); END LOOP; END $$;
SELECT count(*) AS classified
  FROM (SELECT delayed_durability_set_table_class(('many_' || i)::regclass, 'delayed') FROM generate_series(1, 20) AS i) AS s;
SET delayed_durability.mode = 'forced';
BEGIN;
DO $$ BEGIN FOR i IN 1 .. 20 LOOP EXECUTE format('INSERT INTO many_%s VALUES (1)', i); END LOOP; END $$;
SELECT pg_current_wal_insert_lsn() AS before_commit \gset
COMMIT;
SELECT pg_current_wal_flush_lsn() > :'before_commit'::pg_lsn AS twenty_delayed_tables_flushed;
SELECT delayed_durability_set_table_class('many_20', 'durable');
BEGIN;
DO $$ BEGIN FOR i IN 1 .. 20 LOOP EXECUTE format('INSERT INTO many_%s VALUES (2)', i); END LOOP; END $$;
SELECT pg_current_wal_insert_lsn() AS before_commit \gset
COMMIT;
SELECT pg_current_wal_flush_lsn() > :'before_commit'::pg_lsn AS one_durable_of_twenty_flushed;
RESET delayed_durability.mode;
DO $$ BEGIN FOR i IN 1 .. 20 LOOP EXECUTE format('DROP TABLE many_%s', i); END LOOP; END $$;

-- A table whose access method is not heap (here heap's own handler under
-- another name: PostgreSQL has no other table access method) may not count
-- its writes per transaction. A class is refused on it; a durable table
-- moved to one makes every commit in the database that writes durable, with
-- a WARNING once per session, until it is moved back.
CREATE ACCESS METHOD tc_heap2 TYPE TABLE HANDLER heap_tableam_handler;
CREATE TABLE other_am_payments (id int) USING tc_heap2;
SELECT delayed_durability_set_table_class('other_am_payments', 'durable');
CREATE TABLE moved_payments (id int);
SELECT delayed_durability_set_table_class('moved_payments', 'durable');
SET delayed_durability.mode = 'forced';
BEGIN;
INSERT INTO dly VALUES (42);
SELECT pg_current_wal_insert_lsn() AS before_commit \gset
COMMIT;
SELECT pg_current_wal_flush_lsn() > :'before_commit'::pg_lsn AS unrelated_commit_flushed_beside_heap_durable;
ALTER TABLE moved_payments SET ACCESS METHOD tc_heap2;
BEGIN;
INSERT INTO dly VALUES (43);
SELECT pg_current_wal_insert_lsn() AS before_commit \gset
COMMIT;
SELECT pg_current_wal_flush_lsn() > :'before_commit'::pg_lsn AS unrelated_commit_flushed_beside_uncounted_durable;
BEGIN;
INSERT INTO dly VALUES (44);
SELECT pg_current_wal_insert_lsn() AS before_commit \gset
COMMIT;
SELECT pg_current_wal_flush_lsn() > :'before_commit'::pg_lsn AS again_flushed_without_a_second_warning;
-- Neither an opt-in nor an error caught after the uncounted table's write
-- (PL/pgSQL, or psql's ON_ERROR_ROLLBACK savepoint: the write is rolled
-- back, the transaction goes on) makes such a commit delayed.
SET delayed_durability.mode = 'allowed';
BEGIN;
SELECT commit_delayed();
INSERT INTO dly VALUES (46);
DO $$ BEGIN INSERT INTO moved_payments VALUES (1); RAISE EXCEPTION 'caught'; EXCEPTION WHEN raise_exception THEN NULL; END $$;
SELECT pg_current_wal_insert_lsn() AS before_commit \gset
COMMIT;
SELECT pg_current_wal_flush_lsn() > :'before_commit'::pg_lsn AS opted_in_after_caught_error_flushed;
\set ON_ERROR_ROLLBACK on
BEGIN;
SELECT commit_delayed();
INSERT INTO dly VALUES (47);
INSERT INTO moved_payments SELECT 1 / (2 - g) FROM generate_series(1, 2) AS g;
SELECT pg_current_wal_insert_lsn() AS before_commit \gset
COMMIT;
\set ON_ERROR_ROLLBACK off
SELECT pg_current_wal_flush_lsn() > :'before_commit'::pg_lsn AS opted_in_after_rolled_back_statement_flushed;
SELECT count(*) AS rolled_back_rows FROM moved_payments;
SET delayed_durability.mode = 'forced';
ALTER TABLE moved_payments SET ACCESS METHOD heap;
BEGIN;
INSERT INTO dly VALUES (45);
SELECT pg_current_wal_insert_lsn() AS before_commit \gset
COMMIT;
SELECT pg_current_wal_flush_lsn() > :'before_commit'::pg_lsn AS unrelated_commit_flushed_after_moving_back;
RESET delayed_durability.mode;
DROP TABLE moved_payments, other_am_payments;
DROP ACCESS METHOD tc_heap2;
