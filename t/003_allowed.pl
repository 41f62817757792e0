# Mode allowed: transactions that call commit_delayed() are delayed, plain
# ones are durable, and a durable commit hardens the delayed ones before it.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $node = new_dd_node('allowed', conf => "delayed_durability.mode = 'allowed'\n");
$node->safe_psql('postgres', 'CREATE TABLE t (id int)');

my @statements;
for my $i (1 .. 40)
{
	push @statements, $i % 2
	  ? "BEGIN; SELECT commit_delayed(); INSERT INTO t VALUES ($i); COMMIT;"
	  : "INSERT INTO t VALUES ($i);";
}
my @flushed = commits_with_check($node, 'postgres', '', \@statements);
my @delayed_flushed = @flushed[ grep { $_ % 2 == 0 } 0 .. $#flushed ];
my @plain_flushed = @flushed[ grep { $_ % 2 == 1 } 0 .. $#flushed ];
is(count_true(@plain_flushed), 20, 'plain commits are flushed right away');
is(count_true(@delayed_flushed), 0, 'commit_delayed() commits are not');

# A run of delayed commits, then one durable commit: the durable commit's
# flush covers every delayed commit before it.
my $out = $node->safe_psql('postgres', join("\n",
	(map { "BEGIN; SELECT commit_delayed(); INSERT INTO t VALUES ($_); COMMIT;" } 101 .. 130),
	"SELECT 'behind=' || (pg_current_wal_flush_lsn() < wal_end());",
	"SELECT 'last_delayed_end=' || wal_end();",
	"CALL mark_wal();",
	"INSERT INTO t VALUES (131);",
	"SELECT 'flushed=' || flushed_since_mark();"));
my %result = map { split /=/, $_, 2 } grep { /=/ } split /\n/, $out;
is($result{behind}, 'true', 'the delayed commits were unflushed');
is($result{flushed}, 'true', 'the durable commit flushed the WAL');
my $last_delayed_end = $result{last_delayed_end};
my $flush = $node->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()');
is($node->safe_psql('postgres', "SELECT '$flush'::pg_lsn >= '$last_delayed_end'::pg_lsn"), 't',
	'flush position covers the last delayed commit');

power_cut($node);
is(rows_in($node, 'postgres', 'id BETWEEN 101 AND 131'), 31,
	'all delayed commits before the durable one survive a power cut');

$node->stop;
done_testing();
