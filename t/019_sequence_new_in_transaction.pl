# cached_nextval() in the transaction that created the sequence's file
# (CREATE SEQUENCE, ALTER SEQUENCE ... RESTART, TRUNCATE ... RESTART
# IDENTITY): the recovery value lives in a file that exists only if that
# transaction commits, so its commit is made durable even under forced mode;
# with wal_level = minimal nothing of that file is WAL-logged before commit,
# so values are claimed one at a time and a setval() there is still seen.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

for my $wal_level ('replica', 'minimal')
{
	my $node = new_dd_node("new_in_xact_$wal_level", conf => qq{
delayed_durability.mode = forced
wal_level = $wal_level
max_wal_senders = 0
});
	my $forced = sub {
		$node->safe_psql('postgres',
			'SELECT commits_forced_durable FROM delayed_durability_stats WHERE datname = current_database()');
	};

	my $before = $forced->();
	my $out = $node->safe_psql('postgres', q{
SELECT flushed();
BEGIN;
CREATE SEQUENCE m CACHE 50;
SELECT cached_nextval('m') FROM generate_series(1, 3);
-- setval() to the end of what a cached block would be, in the same transaction.
SELECT setval('m', 50);
SELECT cached_nextval('m');
COMMIT;
SELECT 'flushed=' || flushed();
});
	my @lines = split /\n/, $out;
	is(join(',', @lines[1 .. 3]), '1,2,3', "$wal_level: values in the creating transaction");
	is($lines[5], '51', "$wal_level: a setval() in the creating transaction is seen");
	is($lines[-1], 'flushed=true', "$wal_level: the creating transaction's commit is durable under forced");
	is($forced->() - $before, 1, "$wal_level: counted as forced durable");

	# Power cut right after: kill everything and zero the WAL past the flush
	# position read after the commit. The sequence, created by a commit that
	# forced mode would have delayed, must exist and continue after 51.
	my $power_cut = sub {
		my $flushed_at = lsn_to_int($node->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()'));
		kill_everything($node);
		cmp_ok(zero_wal_after($node, $flushed_at), '>', 0, "$wal_level: WAL after the flush position zeroed");
		$node->start;
	};
	$power_cut->();
	my ($ok, $next) = $node->psql('postgres', "SELECT cached_nextval('m')");
	is($ok, 0, "$wal_level: after the power cut the sequence exists");
	cmp_ok($next || 0, '>', 51, "$wal_level: and continues after the values handed out (" . ($next // '') . ")");

	# A plain delayed commit right after it stays delayed: the requirement
	# was for that one transaction.
	$node->safe_psql('postgres', 'CREATE TABLE t (id int)');
	settle_wal_writer($node);
	is($node->safe_psql('postgres', "INSERT INTO t VALUES (1);\nSELECT flushed();"), 'f',
		"$wal_level: the next commit is delayed again");

	# The same for ALTER SEQUENCE ... RESTART (a new file for the sequence).
	$out = $node->safe_psql('postgres', q{
BEGIN;
ALTER SEQUENCE m RESTART WITH 1000;
SELECT cached_nextval('m');
COMMIT;
SELECT 'flushed=' || flushed();
});
	like($out, qr/^1000\nflushed=true$/, "$wal_level: ALTER SEQUENCE RESTART in the transaction: durable commit");

	# (PostgreSQL flushes this commit anyway: it drops the old file.)
	$power_cut->();
	$next = $node->safe_psql('postgres', "SELECT cached_nextval('m')");
	cmp_ok($next, '>', 1000, "$wal_level: after the power cut the sequence continues above 1000 ($next)");

	# After the creating transaction committed (durably), other sessions go
	# on with the block it claimed (replica); with minimal it claimed values
	# one at a time, so the next session claims a block of its own.
	$node->safe_psql('postgres', q{
BEGIN;
CREATE SEQUENCE m3 CACHE 50;
SELECT cached_nextval('m3');
COMMIT;
});
	my $writes = q{SELECT sequence_recovery_writes FROM delayed_durability_stats WHERE datname = current_database()};
	my $w0 = $node->safe_psql('postgres', $writes);
	is($node->safe_psql('postgres', "SELECT cached_nextval('m3'), cached_nextval('m3')"), '2|3',
		"$wal_level: later sessions continue after the creating transaction's values");
	is($node->safe_psql('postgres', $writes) - $w0, $wal_level eq 'replica' ? 0 : 1,
		"$wal_level: recovery writes after the creating transaction");
	$node->stop;
}

done_testing();
