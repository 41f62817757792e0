# flush_log() hardens every delayed commit acknowledged before it, and the
# crash check bites without it.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $node = new_dd_node('flush_log', conf => "delayed_durability.mode = 'forced'\n");
# The table itself is created by a delayed commit: harden it.
$node->safe_psql('postgres', 'CREATE TABLE t (id int); SELECT flush_log();');

# Negative control first: forced commits (the WAL writer settled, so it
# flushes none of them), then a power cut: they are lost.
settle_wal_writer($node);
my $end = $node->safe_psql('postgres', join("\n",
	(map { "INSERT INTO t VALUES ($_);" } 1 .. 30), 'SELECT wal_end();'));
power_cut($node);
my $survivors = rows_in($node, 'postgres', 'id BETWEEN 1 AND 30');
note "control: $survivors of 30 forced commits survived the power cut";
is($survivors, 0, 'control: without flush_log() the delayed commits are lost');

# Now with flush_log() after the commits, from another session than the
# one that committed.
settle_wal_writer($node);
$node->safe_psql('postgres', join("\n", map { "INSERT INTO t VALUES ($_);" } 101 .. 130));
my ($before, $flushed_to) = split /\|/, $node->safe_psql('postgres',
	'SELECT pg_current_wal_flush_lsn() < wal_end(), flush_log() >= wal_end()');
is($before, 't', 'the commits were delayed');
is($flushed_to, 't', 'flush_log() returns a position at or past the end of WAL');
power_cut($node);
is(rows_in($node, 'postgres', 'id BETWEEN 101 AND 130'), 30, 'every commit before flush_log() survives a power cut');

# Right after a WAL segment switch.
$node->safe_psql('postgres', join("\n", map { "INSERT INTO t VALUES ($_);" } 201 .. 210));
$node->safe_psql('postgres', 'SELECT pg_switch_wal()');
$node->safe_psql('postgres', join("\n", map { "INSERT INTO t VALUES ($_);" } 211 .. 220));
is($node->safe_psql('postgres', 'SELECT flush_log() >= wal_end()'), 't', 'flush_log() after a segment switch');
power_cut($node);
is(rows_in($node, 'postgres', 'id BETWEEN 201 AND 220'), 20, 'all present after the power cut');

$node->stop;
done_testing();
