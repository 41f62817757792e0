# Without shared_preload_libraries the extension refuses to work and says how
# to fix it, instead of silently applying no policy.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('not_preloaded');
$node->init;
# Nothing else writes WAL between a commit and the check of its flush.
$node->append_conf('postgresql.conf', "autovacuum = off\n");
$node->start;
my ($create_ret, $create_out, $create_err) = $node->psql('postgres', 'CREATE EXTENSION delayed_durability', extended_stderr => 1);
is($create_ret, 0, 'CREATE EXTENSION works without the preload');
like($create_err, qr/WARNING:  delayed_durability is not loaded through "shared_preload_libraries": its policy is not in force/,
	'but warns that the policy is not in force');
like($create_err, qr/HINT:  .*SELECT \* FROM delayed_durability_settings/, 'and says where to look');
is($node->safe_psql('postgres', 'SELECT library_preloaded, mode IS NULL, mode_source IS NULL FROM delayed_durability_settings WHERE datname = current_database()'),
	'f|t|t', 'the settings view says the library is not preloaded, and shows no mode');

$node->safe_psql('postgres', 'CREATE TABLE payments (i int)');
for my $call ('SELECT commit_delayed()', 'SELECT flush_log()',
	'SELECT * FROM delayed_durability_status()', 'SELECT * FROM delayed_durability_stats',
	q{SELECT delayed_durability_set_table_class('payments', 'durable')})
{
	my ($ret, $stdout, $stderr) = $node->psql('postgres', $call, extended_stderr => 1);
	isnt($ret, 0, "$call fails");
	like($stderr, qr/ERROR:  delayed_durability must be loaded via "shared_preload_libraries"/,
		"$call: error message");
	like($stderr, qr/HINT:  Add delayed_durability to the "shared_preload_libraries" setting/,
		"$call: hint");
}

# A durable class would not be enforced: none was set.
is($node->safe_psql('postgres', 'SELECT count(*) FROM delayed_durability_table_class_config'), '0',
	'no table class was set without the preload');

# The policy GUC does not exist without the library: a postgresql.conf
# setting of it is reported, and commits stay PostgreSQL's default (durable).
$node->append_conf('postgresql.conf', "delayed_durability.mode = 'forced'\n");
$node->restart;
is($node->safe_psql('postgres', "SELECT current_setting('delayed_durability.mode', true)"), 'forced',
	'unknown to the server: a placeholder only');
is($node->safe_psql('postgres', 'SELECT library_preloaded FROM delayed_durability_settings WHERE datname = current_database()'), 'f',
	'the settings view is not fooled by the placeholder');
$node->safe_psql('postgres', 'CREATE TABLE t (id int)');
# The check is run once before the commit: reading the catalogs for it can
# prune a catalog page, which writes WAL; it must not land between the
# commit and the check.
my $flushed = $node->safe_psql('postgres',
	"SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn() - 40;\nINSERT INTO t VALUES (1);\n"
	  . "SELECT pg_current_wal_flush_lsn() >= pg_current_wal_insert_lsn() - 40;");
is((split /\n/, $flushed)[-1], 't', 'without the library commits stay durable');

# Preloaded, an invalid value in postgresql.conf is refused with the valid
# ones listed, and the server runs with the safe default.
$node->append_conf('postgresql.conf', "shared_preload_libraries = 'delayed_durability'\ndelayed_durability.mode = 'sometimes'\n");
$node->restart;
is($node->safe_psql('postgres', 'SHOW delayed_durability.mode'), 'disabled', 'invalid value: the safe default applies');
ok($node->log_contains(qr/LOG:  delayed_durability: cluster-wide mode = disabled, max_loss_bytes = 0, max_loss_time = 0 ms, track_lost_commits = on, wal_buffer_path = \(none\)/),
	'the cluster-wide settings are logged at startup');
$node->safe_psql('postgres', q{ALTER SYSTEM SET delayed_durability.mode = 'allowed'; SELECT pg_reload_conf()});
$node->poll_query_until('postgres', q{SELECT mode = 'allowed' FROM delayed_durability_settings WHERE datname = 'postgres'})
  or diag('the reloaded cluster mode did not reach the view');
$node->safe_psql('postgres', q{CREATE DATABASE shop; ALTER DATABASE shop SET delayed_durability.mode = 'forced';
ALTER DATABASE shop SET delayed_durability.max_loss_bytes = '16kB'; ALTER DATABASE shop SET delayed_durability.max_loss_time = '200ms'});
is($node->safe_psql('postgres', q{SELECT datname, mode, mode_source, max_loss_bytes, max_loss_time, library_preloaded
  FROM delayed_durability_settings WHERE datname IN ('postgres', 'shop') ORDER BY 1}),
	"postgres|allowed|cluster|0|00:00:00|t\nshop|forced|database|16384|00:00:00.2|t",
	'the settings view: each database\'s own settings over the cluster\'s, which a reload changes');
ok($node->log_contains(qr/invalid value for parameter "delayed_durability.mode": "sometimes"/),
	'invalid value reported in the server log');

# ALTER ROLE ALL SET applies to every session over postgresql.conf: the
# view shows it as the cluster's value, under each database's own.
$node->safe_psql('postgres', q{ALTER ROLE ALL SET delayed_durability.mode = 'disabled';
ALTER ROLE ALL SET delayed_durability.max_loss_bytes = '8kB'; ALTER ROLE ALL SET delayed_durability.max_loss_time = '1s'});
is($node->safe_psql('postgres', 'SHOW delayed_durability.mode'), 'disabled', 'ALTER ROLE ALL SET is in force in a new session');
is($node->safe_psql('postgres', q{SELECT datname, mode, mode_source, max_loss_bytes, max_loss_time
  FROM delayed_durability_settings WHERE datname IN ('postgres', 'shop') ORDER BY 1}),
	"postgres|disabled|cluster|8192|00:00:01\nshop|forced|database|16384|00:00:00.2",
	'the settings view shows ALTER ROLE ALL SET as the cluster-wide value, under a database\'s own');
$node->safe_psql('postgres', 'ALTER ROLE ALL RESET ALL');
is($node->safe_psql('postgres', q{SELECT mode, max_loss_bytes FROM delayed_durability_settings WHERE datname = 'postgres'}),
	'allowed|0', 'and the postmaster\'s value again once it is reset');

# Values are kept as written: the view reads them as the settings do
# (a unit 'B', hexadecimal, a fraction of a unit, the mode in capitals),
# for a database and for ALTER ROLE ALL alike.
$node->safe_psql('postgres', q{ALTER DATABASE shop SET delayed_durability.mode = 'FORCED';
ALTER DATABASE shop SET delayed_durability.max_loss_bytes = '8192B'; ALTER DATABASE shop SET delayed_durability.max_loss_time = '0x10';
ALTER ROLE ALL SET delayed_durability.max_loss_bytes = '0x4000'; ALTER ROLE ALL SET delayed_durability.max_loss_time = '1.5s'});
is($node->safe_psql('shop', 'SHOW delayed_durability.max_loss_bytes'), '8kB', 'the database\'s value as PostgreSQL reads it');
is($node->safe_psql('postgres', q{SELECT datname, mode, max_loss_bytes, max_loss_time
  FROM delayed_durability_settings WHERE datname IN ('postgres', 'shop') ORDER BY 1}),
	"postgres|allowed|16384|00:00:01.5\nshop|forced|8192|00:00:00.016",
	'the settings view reads 8192B, 0x10, 0x4000, 1.5s and FORCED as the settings do');
is($node->safe_psql('postgres', q{SELECT delayed_durability_setting_value('delayed_durability.max_loss_bytes', '64kB'),
  delayed_durability_setting_value('delayed_durability.max_loss_time', '2min'),
  delayed_durability_setting_value('delayed_durability.max_loss_time', 'soon') IS NULL,
  delayed_durability_setting_value('delayed_durability.max_loss_bytes', '-1') IS NULL}),
	'65536|120000|t|t', 'delayed_durability_setting_value() reads units and refuses nonsense and negative values with NULL');
my ($ret, $out, $err) = $node->psql('postgres', q{SELECT delayed_durability_setting_value('work_mem', '4MB')});
like($err, qr/ERROR:  "work_mem" is not an integer setting of delayed_durability/, 'another setting\'s name is refused');
$node->safe_psql('postgres', 'ALTER ROLE ALL RESET ALL');

$node->stop;
done_testing();
