# A clean shutdown flushes the WAL: delayed commits are not lost.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $node = new_dd_node('clean_shutdown', conf => "delayed_durability.mode = 'forced'\n");
$node->safe_psql('postgres', 'CREATE TABLE t (id int)');
my @flushed = commits_with_check($node, 'postgres', '', [ map { "INSERT INTO t VALUES ($_);" } 1 .. 100 ]);
is(count_true(@flushed), 0, 'the commits were delayed');
$node->stop('fast');
$node->start;
is(rows_in($node, 'postgres', 'true'), 100, 'all delayed commits present after a fast shutdown');
$node->stop;
done_testing();
