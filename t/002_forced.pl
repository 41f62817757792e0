# Mode forced: commits return before their WAL is flushed, and the WAL
# fsync count does not grow per commit.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $node = new_dd_node('forced');
$node->safe_psql('postgres', 'CREATE TABLE t (id int)');

# PostgreSQL's WAL fsync count (pg_stat_wal.wal_sync, pg_stat_io from 18) around a batch of commits in one session. Backends
# publish their WAL statistics when idle; pg_stat_force_next_flush() makes
# the next idle moment publish them at once.
sub wal_syncs_for
{
	my ($setup, $first, $count) = @_;
	my $script = "$setup\nSELECT pg_stat_force_next_flush();\nSELECT delayed_durability_wal_fsyncs();\n";
	$script .= "INSERT INTO t VALUES ($_);\n" for $first .. $first + $count - 1;
	$script .= "SELECT pg_stat_force_next_flush();\nSELECT delayed_durability_wal_fsyncs();\n";
	my @out = grep { /^\d+$/ } split /\n/, $node->safe_psql('postgres', $script);
	return $out[-1] - $out[0];
}

my $n = 200;
my $durable_syncs = wal_syncs_for("SET delayed_durability.mode = 'disabled';", 1, $n);
my $forced_syncs = wal_syncs_for("SET delayed_durability.mode = 'forced';", 1001, $n);
note "WAL fsyncs for $n commits: durable $durable_syncs, forced $forced_syncs";
cmp_ok($durable_syncs, '>=', $n, 'durable: at least one WAL fsync per commit');
cmp_ok($forced_syncs, '<', $n / 10, 'forced: WAL fsyncs do not grow per commit');

# Right after each forced commit, the flush position is behind it (the WAL
# writer is settled first by commits_with_check: it flushes nothing then).
my @flushed = commits_with_check($node, 'postgres', "SET delayed_durability.mode = 'forced';",
	[ map { "INSERT INTO t VALUES ($_);" } 2001 .. 2050 ]);
is(scalar @flushed, 50, 'one check per commit');
is(count_true(@flushed), 0, 'forced: the flush position is behind every commit');

# Explicit durability requests do not override forced.
@flushed = commits_with_check($node, 'postgres',
	"SET delayed_durability.mode = 'forced'; SET synchronous_commit = remote_apply;",
	[ map { "INSERT INTO t VALUES ($_);" } 3001 .. 3020 ]);
is(count_true(@flushed), 0, 'forced overrides synchronous_commit = remote_apply');

# PostgreSQL still forces some commits durable: a commit that drops a file.
@flushed = commits_with_check($node, 'postgres', "SET delayed_durability.mode = 'forced';",
	[ 'CREATE TABLE dropme (i int);', 'DROP TABLE dropme;' ]);
is($flushed[1], 1, 'forced: a commit that drops a relation file is still flushed');

my ($durable, $delayed, $forced_durable) = split /\|/, $node->safe_psql('postgres',
	"SELECT commits_durable, commits_delayed, commits_forced_durable FROM delayed_durability_stats WHERE datname = 'postgres'");
cmp_ok($delayed, '>=', $n + 50 + 20, 'delayed commits counted');
cmp_ok($forced_durable, '>=', 1, 'the forced-durable commit counted');

$node->stop;
done_testing();
