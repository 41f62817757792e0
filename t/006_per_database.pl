# Two databases with different policies in one cluster.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $node = new_dd_node('per_database');
$node->safe_psql('postgres', q{
CREATE DATABASE shop_forced;
CREATE DATABASE shop_durable;
ALTER DATABASE shop_forced SET delayed_durability.mode = 'forced';
ALTER DATABASE shop_durable SET delayed_durability.mode = 'disabled';
});
for my $db ('shop_forced', 'shop_durable')
{
	$node->safe_psql($db, 'CREATE TABLE t (id int)');
}

my @inserts = map { "INSERT INTO t VALUES ($_);" } 1 .. 30;
my @forced = commits_with_check($node, 'shop_forced', '', \@inserts);
my @durable = commits_with_check($node, 'shop_durable', 'SET synchronous_commit = off;', \@inserts);
is(count_true(@forced), 0, 'shop_forced: commits delayed');
is(count_true(@durable), 30, 'shop_durable: commits durable even with synchronous_commit = off');

my $stats = $node->safe_psql('postgres', q{
SELECT datname, commits_delayed >= 30, commits_durable >= 30
  FROM delayed_durability_stats WHERE datname LIKE 'shop%' ORDER BY datname});
is($stats, "shop_durable|f|t\nshop_forced|t|f", 'counters per database');

# Interleaved commits in both: only the durable database's commits are
# guaranteed after a crash, and they all survive.
$node->safe_psql('shop_forced', join("\n", map { "INSERT INTO t VALUES ($_);" } 101 .. 120));
$node->safe_psql('shop_durable', join("\n", map { "INSERT INTO t VALUES ($_);" } 101 .. 120));
power_cut($node);
is(rows_in($node, 'shop_durable', 'true'), 50, 'shop_durable: all commits survive a power cut');

$node->stop;

# Slots of dropped databases are reused: with 8 slots, a CI that creates and
# drops more databases than that still counts the new ones.
my $few = new_dd_node('few_slots', conf => "delayed_durability.max_databases = 8\n");
for my $i (1 .. 12)
{
	$few->safe_psql('postgres', "CREATE DATABASE tmp_$i");
	$few->safe_psql("tmp_$i", 'CREATE TABLE t (i int); INSERT INTO t VALUES (1)');
	$few->safe_psql('postgres', "DROP DATABASE tmp_$i");
}
$few->safe_psql('postgres', 'CREATE DATABASE after_drops');
$few->safe_psql('after_drops', 'CREATE TABLE t (i int); INSERT INTO t VALUES (1); INSERT INTO t VALUES (2)');
cmp_ok($few->safe_psql('postgres', "SELECT commits_durable FROM delayed_durability_stats WHERE datname = 'after_drops'"),
	'>=', 3, 'a database created after more drops than slots is counted');
is($few->safe_psql('postgres', 'SHOW delayed_durability.max_databases'), '8', 'max_databases in effect');
$few->stop;
done_testing();
