# Hostile and careless input: every call gets a clear error or the right
# result and no backend ever crashes; extension lifecycle including
# pg_dump/pg_restore of cached_nextval() defaults; bad startup settings.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $node = new_dd_node('hardening');
$node->safe_psql('postgres', q{
CREATE SEQUENCE s CACHE 10;
CREATE SEQUENCE lim MAXVALUE 3 CACHE 2;
CREATE SEQUENCE huge_inc INCREMENT 9223372036854775807 CACHE 1000;
CREATE SEQUENCE huge_cache CACHE 9223372036854775807;
CREATE SEQUENCE near_max START 9223372036854775800 MAXVALUE 9223372036854775807 CACHE 100;
CREATE SEQUENCE near_min INCREMENT -1 START -9223372036854775800 MINVALUE -9223372036854775808 MAXVALUE 0 CACHE 100;
CREATE TABLE t (id bigint DEFAULT cached_nextval('s'), v int);
CREATE FUNCTION trg() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  PERFORM commit_delayed();
  NEW.v := cached_nextval('s');
  RETURN NEW;
END $$;
CREATE TRIGGER t_trg BEFORE INSERT ON t FOR EACH ROW EXECUTE FUNCTION trg();
});
my $pid = $node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()');

# [sql, expected: regex on stdout or stderr]
my @cases = (
	[ "SELECT cached_nextval(NULL) IS NULL", qr/^t$/ ],
	[ "SELECT cached_nextval('no_such')", qr/relation "no_such" does not exist/ ],
	[ "SELECT cached_nextval(4294967295::oid::regclass)", qr/relation with OID 4294967295 does not exist/ ],
	[ "SELECT cached_nextval('pg_class')", qr/"pg_class" is not a sequence/ ],
	[ "SELECT cached_nextval(1)", qr/relation with OID 1 does not exist/ ],
	[ "SELECT cached_nextval('s', 1)", qr/function cached_nextval\(unknown, integer\) does not exist/ ],
	[ "SELECT commit_delayed(true)", qr/function commit_delayed\(boolean\) does not exist/ ],
	[ "SELECT flush_log(NULL)", qr/function flush_log\(unknown\) does not exist/ ],
	[ "SELECT count(flush_log()) FROM generate_series(1, 1000)", qr/^1000$/ ],
	[ "SELECT cached_nextval('huge_inc'); SELECT cached_nextval('huge_inc')", qr/reached maximum value of sequence "huge_inc"/ ],
	[ "SELECT count(DISTINCT cached_nextval('huge_cache')) FROM generate_series(1, 100)", qr/^100$/ ],
	[ "SELECT count(*) FROM (SELECT cached_nextval('near_max') FROM generate_series(1, 8)) s", qr/^8$/ ],
	[ "SELECT cached_nextval('near_max')", qr/reached maximum value of sequence "near_max" \(9223372036854775807\)/ ],
	[ "SELECT count(*) FROM (SELECT cached_nextval('near_min') FROM generate_series(1, 9)) s", qr/^9$/ ],
	[ "SELECT cached_nextval('near_min')", qr/reached minimum value of sequence "near_min"/ ],
	[ "BEGIN; SELECT 1/0; SELECT commit_delayed(); ROLLBACK;", qr/current transaction is aborted/ ],
	[ "BEGIN; SELECT 1/0; SELECT flush_log(); ROLLBACK;", qr/current transaction is aborted/ ],
	[ "BEGIN; SELECT 1/0; SELECT cached_nextval('s'); ROLLBACK;", qr/current transaction is aborted/ ],
	[ "SET delayed_durability.mode = NULL", qr/syntax error|invalid value/ ],
	[ "SELECT set_config('delayed_durability.mode', NULL, false)", qr/^disabled$/ ],
	[ "SET delayed_durability.mode = 'FORCED '", qr/invalid value for parameter "delayed_durability.mode"/ ],
	[ "SET delayed_durability.mode TO DEFAULT; SHOW delayed_durability.mode", qr/^disabled$/ ],
	[ "SELECT count(*) FROM delayed_durability_stats_per_database()", qr/^\d+$/ ],
	[ "SELECT delayed_durability_stats_per_database()", qr/^\(/ ],
	# The sequence slot lock is released when an error is caught in a
	# subtransaction: the next call, from another session, does not hang.
	[ "DO \$\$ BEGIN FOR i IN 1..5 LOOP PERFORM cached_nextval('lim'); END LOOP; EXCEPTION WHEN sequence_generator_limit_exceeded THEN RAISE NOTICE 'caught %', SQLSTATE; END \$\$", qr/caught 2200H/ ],
	[ "SET statement_timeout = '10s'; SELECT cached_nextval('lim')", qr/reached maximum value of sequence "lim"/ ],
	[ "SET statement_timeout = '10s'; SELECT cached_nextval('s') > 0", qr/^t$/ ],
	# Cursors, triggers, procedures, exception blocks.
	[ "BEGIN; DECLARE c CURSOR FOR SELECT cached_nextval('s') FROM generate_series(1, 10); FETCH 3 FROM c; FETCH 3 FROM c; CLOSE c; COMMIT;", qr/^\d+\n\d+\n\d+\n\d+\n\d+\n\d+$/ ],
	[ "INSERT INTO t (v) SELECT g FROM generate_series(1, 20) g; SELECT count(DISTINCT id), count(DISTINCT v) FROM t", qr/^20\|20\n(.*WARNING:  commit_delayed\(\) can only be used in transaction blocks\n.*HINT:  Outside a transaction block it has no effect.*\n?){20}$/ ],
	[ "DO \$\$ BEGIN PERFORM commit_delayed(); PERFORM 1/0; EXCEPTION WHEN division_by_zero THEN PERFORM commit_delayed(); END \$\$", qr/^$/ ],
	[ "CREATE PROCEDURE p() LANGUAGE plpgsql AS \$\$ BEGIN FOR i IN 1..3 LOOP PERFORM commit_delayed(); PERFORM cached_nextval('s'); PERFORM flush_log(); COMMIT; END LOOP; END \$\$; CALL p(); DROP PROCEDURE p;", qr/^$/ ],
	[ "BEGIN; SELECT commit_delayed(); SAVEPOINT a; SELECT cached_nextval('s') > 0; ROLLBACK TO a; SELECT flush_log() IS NOT NULL; COMMIT;", qr/^f\nt\nt$/ ],
	[ "BEGIN; SELECT commit_delayed(); INSERT INTO t (v) VALUES (1); PREPARE TRANSACTION 'h1'; COMMIT PREPARED 'h1';", qr/^f$/ ],
	[ "SELECT commit_delayed() FROM generate_series(1, 3)", qr/^f\nf\nf\n.*WARNING:  commit_delayed\(\) can only be used in transaction blocks/ ],
	[ "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) SELECT cached_nextval('s')", qr/Result/ ],
);
for my $case (@cases)
{
	my ($sql, $expect) = @$case;
	my ($ret, $out, $err) = $node->psql('postgres', $sql, on_error_stop => 0);
	like("$out\n$err" =~ s/^\n+|\n+$//gr, $expect, "handled: $sql");
}
is($node->safe_psql('postgres', 'SELECT pg_postmaster_start_time()'), $pid, 'the server never restarted');
my $log = slurp_file($node->logfile);
unlike($log, qr/terminated by signal|server process .* was terminated|PANIC/, 'no backend crashed');

# Update path: a database created at each released version updates to the
# current one and gets what came since (0.2.0: WAL buffer status columns;
# 0.3.0: cached_currval/cached_lastval; 0.4.0: loss budget counter and
# window, receipts, crash report; 0.5.0: table classes; 0.6.0: the
# configuration table's guard, the settings view, pg_monitor's grants;
# 0.6.1: the settings view reads values as the settings do).
my $current = $node->safe_psql('postgres',
	q{SELECT default_version FROM pg_available_extensions WHERE name = 'delayed_durability'});
is($current, '0.6.1', 'current version');
my $status_columns = q{SELECT count(*) FROM pg_proc, unnest(proargnames) AS a
  WHERE proname = 'delayed_durability_status' AND a LIKE 'wal_buffer%'};
my $currval_functions = q{SELECT count(*) FROM pg_proc WHERE proname IN ('cached_currval', 'cached_lastval')};
my $class_objects = q{SELECT (SELECT count(*) FROM pg_proc WHERE proname = 'delayed_durability_set_table_class')
  || '|' || (SELECT count(*) FROM pg_class WHERE relname IN ('delayed_durability_table_classes', 'delayed_durability_table_class_config'))
  || '|' || (SELECT count(*) FROM pg_event_trigger WHERE evtname = 'delayed_durability_forget_dropped_tables')};
my $loss_objects = q{SELECT (SELECT count(*) FROM pg_proc WHERE proname IN ('last_commit_lsn', 'is_durable', 'wait_durable', 'delayed_durability_lost_commits_reset'))
  || '|' || (SELECT count(*) FROM pg_class WHERE relname IN ('delayed_durability_crashes', 'delayed_durability_lost_commits'))};
my $v060_objects = q{SELECT (SELECT count(*) FROM pg_trigger WHERE tgname LIKE 'delayed_durability_table_class_config_guard%')
  || '|' || (SELECT count(*) FROM pg_class WHERE relname = 'delayed_durability_settings')
  || '|' || coalesce((SELECT has_table_privilege('pg_monitor', oid, 'SELECT') FROM pg_class WHERE relname = 'delayed_durability_crashes'), false)
  || '|' || (SELECT count(*) FROM pg_proc WHERE proname = 'delayed_durability_receive_failover_record'
              AND NOT has_function_privilege('public', oid, 'EXECUTE'))};
for my $version ('0.1.0', '0.2.0', '0.3.0', '0.4.0', '0.5.0', '0.6.0')
{
	my $db = 'old_' . ($version =~ s/\./_/gr);
	$node->safe_psql('postgres', "CREATE DATABASE $db TEMPLATE template0");
	$node->safe_psql($db, "CREATE EXTENSION delayed_durability VERSION '$version'");
	is($node->safe_psql($db, $status_columns), $version eq '0.1.0' ? '0' : '5', "$version: WAL buffer columns");
	is($node->safe_psql($db, $currval_functions), $version ge '0.3.0' ? '2' : '0', "$version: cached_currval/cached_lastval");
	is($node->safe_psql($db, $loss_objects), $version ge '0.4.0' ? '4|2' : '0|0', "$version: receipts and crash report only from 0.4.0");
	is($node->safe_psql($db, $class_objects), $version ge '0.5.0' ? '1|2|1' : '0|0|0', "$version: table classes only from 0.5.0");
	is($node->safe_psql($db, $v060_objects), $version ge '0.6.0' ? '2|1|true|1' : '0|0|false|0',
		"$version: guard, settings view, pg_monitor grant, record delivery only from 0.6.0");
	is($node->safe_psql($db, q{SELECT count(*) FROM pg_proc WHERE proname = 'delayed_durability_setting_value'}), '0',
		"$version: no delayed_durability_setting_value()");
	$node->safe_psql($db, 'ALTER EXTENSION delayed_durability UPDATE');
	is($node->safe_psql($db, q{SELECT extversion FROM pg_extension WHERE extname = 'delayed_durability'}),
		$current, "ALTER EXTENSION UPDATE from $version reaches $current");
	is($node->safe_psql($db, $status_columns), '5', "updated from $version: five WAL buffer columns");
	is($node->safe_psql($db, 'SELECT wal_buffer_is_pmem IS NULL AND wal_buffer_fsyncs_avoided = 0 FROM delayed_durability_status()'),
		't', "updated from $version: status function works (buffer off)");
	is($node->safe_psql($db, q{CREATE SEQUENCE upd; SELECT cached_nextval('upd'), cached_currval('upd'), cached_lastval()}),
		'1|1|1', "updated from $version: cached_currval and cached_lastval work");
	is($node->safe_psql($db, $loss_objects), '4|2', "updated from $version: receipts and crash report");
	is($node->safe_psql($db, $class_objects), '1|2|1', "updated from $version: table classes");
	is($node->safe_psql($db, $v060_objects), '2|1|true|1', "updated from $version: guard triggers, settings view, pg_monitor grant, the record delivery's function not executable by PUBLIC");
	is($node->safe_psql($db, q{SELECT mode_source, library_preloaded FROM delayed_durability_settings WHERE datname = current_database()}),
		'cluster|t', "updated from $version: the settings view works");
	$node->safe_psql('postgres', "ALTER DATABASE $db SET delayed_durability.max_loss_bytes = '8192B'");
	is($node->safe_psql($db, q{SELECT max_loss_bytes FROM delayed_durability_settings WHERE datname = current_database()}),
		'8192', "updated from $version: the settings view reads '8192B' as the setting does");
	$node->safe_psql('postgres', "ALTER DATABASE $db RESET delayed_durability.max_loss_bytes");
	# A class set after the update applies at once, the counters have their
	# columns, and DROP TABLE forgets the class.
	is($node->safe_psql($db, q{CREATE TABLE upd_c (i int);
SELECT delayed_durability_set_table_class('upd_c', 'durable');
SET delayed_durability.mode = 'forced';
SELECT commits_durable_by_table FROM delayed_durability_stats WHERE datname = current_database() \gset before_
INSERT INTO upd_c VALUES (1);
SELECT commits_durable_by_table - :before_commits_durable_by_table FROM delayed_durability_stats WHERE datname = current_database();
DROP TABLE upd_c;
SELECT count(*) FROM delayed_durability_table_classes;}), "\n1\n0", "updated from $version: classes work");
	is($node->safe_psql($db, q{CREATE TABLE upd_t (i int); INSERT INTO upd_t VALUES (1);
SELECT is_durable(last_commit_lsn()) IS NOT NULL, (SELECT commits_budget_flushed >= 0 FROM delayed_durability_stats WHERE datname = current_database()),
       (SELECT count(*) FROM delayed_durability_crashes) >= 0, (SELECT oldest_unflushed_commit_age IS NULL OR true FROM delayed_durability_status())}),
		't|t|t|t', "updated from $version: the new functions and columns work");
}

# Lifecycle: DROP and CREATE EXTENSION; UPDATE is a no-op at the current version.
$node->safe_psql('postgres', 'CREATE DATABASE life TEMPLATE template0');
$node->safe_psql('life', q{
CREATE EXTENSION delayed_durability;
CREATE SEQUENCE orders_id_seq CACHE 20;
CREATE TABLE orders (id bigint PRIMARY KEY DEFAULT cached_nextval('orders_id_seq'), item text);
INSERT INTO orders (item) SELECT 'x' FROM generate_series(1, 25);
});
my ($ret, $out, $err) = $node->psql('life', 'ALTER EXTENSION delayed_durability UPDATE');
like($err, qr/version "[\d.]+" of extension "delayed_durability" is already installed/, 'ALTER EXTENSION UPDATE at the current version');
($ret, $out, $err) = $node->psql('life', 'DROP EXTENSION delayed_durability');
like($err, qr/cannot drop extension delayed_durability because other objects depend on it/,
	'DROP EXTENSION refuses while a default uses cached_nextval()');

# pg_dump / pg_restore of a database with cached_nextval() defaults.
my $dump = PostgreSQL::Test::Utils::tempdir() . '/life.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-f', $dump, '-d', $node->connstr('life') ], 'pg_dump');
$node->safe_psql('postgres', 'CREATE DATABASE life_restored TEMPLATE template0');
$node->command_ok([ 'pg_restore', '-d', $node->connstr('life_restored'), $dump ], 'pg_restore');
is($node->safe_psql('life_restored', q{
INSERT INTO orders (item) VALUES ('after restore') RETURNING id > 25}), 't',
	'restored default continues after the dumped values');
is($node->safe_psql('life_restored', 'SELECT count(*), count(DISTINCT id) FROM orders'), '26|26', 'restored rows intact');

$node->safe_psql('life', 'DROP TABLE orders; DROP EXTENSION delayed_durability');
($ret, $out, $err) = $node->psql('life', 'SELECT flush_log()');
like($err, qr/function flush_log\(\) does not exist/, 'DROP EXTENSION removes the SQL objects');
is($node->safe_psql('life', "SET delayed_durability.mode = 'forced'; SHOW delayed_durability.mode"), 'forced',
	'the policy GUC belongs to the preloaded library, not to the extension objects');
$node->safe_psql('life', 'CREATE EXTENSION delayed_durability');
is($node->safe_psql('life', 'SELECT count(*) FROM delayed_durability_stats WHERE datname = current_database()'), '1',
	'CREATE EXTENSION again');

# Bad startup settings: out-of-range values are refused, the safe default runs.
$node->append_conf('postgresql.conf', "delayed_durability.max_sequences = 5\ndelayed_durability.mode = 'maybe'\n");
$node->restart;
ok($node->log_contains(qr/5 is outside the valid range for parameter "delayed_durability.max_sequences"/),
	'max_sequences out of range reported');
is($node->safe_psql('postgres', 'SHOW delayed_durability.max_sequences'), '1024', 'max_sequences keeps its default');
is($node->safe_psql('postgres', 'SHOW delayed_durability.mode'), 'disabled', 'invalid mode: durable default');
$node->append_conf('postgresql.conf', "delayed_durability.nonsense = 1\n");
$node->restart;
ok($node->log_contains(qr/invalid configuration parameter name "delayed_durability.nonsense"/),
	'unknown parameter under the reserved prefix reported');

$node->stop;
done_testing();
