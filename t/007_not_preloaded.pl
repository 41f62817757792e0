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
$node->safe_psql('postgres', 'CREATE EXTENSION delayed_durability');

for my $call ('SELECT commit_delayed()', 'SELECT flush_log()',
	'SELECT * FROM delayed_durability_status()', 'SELECT * FROM delayed_durability_stats')
{
	my ($ret, $stdout, $stderr) = $node->psql('postgres', $call, extended_stderr => 1);
	isnt($ret, 0, "$call fails");
	like($stderr, qr/ERROR:  delayed_durability must be loaded via "shared_preload_libraries"/,
		"$call: error message");
	like($stderr, qr/HINT:  Add delayed_durability to the "shared_preload_libraries" setting/,
		"$call: hint");
}

# The policy GUC does not exist without the library: a postgresql.conf
# setting of it is reported, and commits stay PostgreSQL's default (durable).
$node->append_conf('postgresql.conf', "delayed_durability.mode = 'forced'\n");
$node->restart;
is($node->safe_psql('postgres', "SELECT current_setting('delayed_durability.mode', true)"), 'forced',
	'unknown to the server: a placeholder only');
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
ok($node->log_contains(qr/invalid value for parameter "delayed_durability.mode": "sometimes"/),
	'invalid value reported in the server log');

$node->stop;
done_testing();
