# A statement that fails, and whose error is caught (a PL/pgSQL EXCEPTION
# block, psql's ON_ERROR_ROLLBACK, a driver's autosave), must leave nothing
# that changes how the commit is treated: the commit stays delayed and
# unflushed, the loss budget holds, it is recorded for the crash report,
# and its receipt is the end of its own commit record. Each check reads
# PostgreSQL's own positions, with the WAL writer stopped so that only
# backends flush; the power cut then shows which commits were really lost.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

my $node = new_dd_node('failed', conf => "restart_after_crash = on\n");
my $tsdir = $node->basedir . '/ts';
mkdir $tsdir;
$node->safe_psql('postgres', q{
CREATE DATABASE forced_db;
ALTER DATABASE forced_db SET delayed_durability.mode = forced;
});
# forced_db is made from template1: the extension and wal_end() are there.
$node->safe_psql('forced_db', q{
CREATE TABLE t (k text PRIMARY KEY, xid xid8);
CREATE FUNCTION counters(OUT durable bigint, OUT delayed bigint, OUT forced bigint, OUT budget bigint)
LANGUAGE sql AS $$ SELECT commits_durable, commits_delayed, commits_forced_durable, commits_budget_flushed
  FROM delayed_durability_stats WHERE datname = current_database() $$;
-- The setup itself commits delayed here: made durable before the tests.
SELECT flush_log();
});

# Every statement that PostgreSQL refuses in a transaction block and whose
# successful commit it always flushes.
my @statements = (
	[ 'create database', 'CREATE DATABASE dd_never', 'CREATE DATABASE' ],
	[ 'drop database', 'DROP DATABASE IF EXISTS dd_never', 'DROP DATABASE' ],
	[ 'create tablespace', "CREATE TABLESPACE dd_ts LOCATION '$tsdir'", 'CREATE TABLESPACE' ],
	[ 'drop tablespace', 'DROP TABLESPACE IF EXISTS dd_ts', 'DROP TABLESPACE' ],
	[ 'alter database set tablespace', 'ALTER DATABASE postgres SET TABLESPACE pg_default', 'ALTER DATABASE SET TABLESPACE' ],
	[ 'commit prepared', "COMMIT PREPARED 'dd_no_such_gid'", 'COMMIT PREPARED' ],
);

# One transaction per statement, as psql runs it with ON_ERROR_ROLLBACK:
# the statement fails, psql rolls back to its implicit savepoint, the
# transaction commits. Before COMMIT the insert position is taken inside the
# transaction; after it, the receipt, PostgreSQL's flush position and the
# counters. Returns one line per statement.
my $walwriter = pause_wal_writer($node);
my $script = "\\set ON_ERROR_ROLLBACK on\nSELECT 'warm', last_commit_lsn() IS NULL, (SELECT count(*) FROM counters());\n";
for my $s (@statements)
{
	my ($name, $sql) = @$s;
	$script .= qq{SELECT * FROM counters() \\gset b_
BEGIN;
INSERT INTO t VALUES ('$name', pg_current_xact_id());
$sql;
SELECT wal_end() AS before_commit \\gset
COMMIT;
SELECT '$name', last_commit_lsn() > :'before_commit',
       pg_current_wal_flush_lsn() < last_commit_lsn(),
       NOT is_durable(last_commit_lsn()),
       c.delayed - :b_delayed, c.forced - :b_forced, c.durable - :b_durable,
       last_commit_lsn(), (SELECT xid FROM t WHERE k = '$name')
  FROM counters() AS c;
};
}
my ($ret, $out, $err) = $node->psql('forced_db', $script, on_error_stop => 0);
my %result = map { my @f = split /\|/; ($f[0] => [ @f[ 1 .. $#f ] ]) } grep { /\|/ } split /\n/, $out;
my %receipt;
for my $s (@statements)
{
	my ($name, $label) = @$s[ 0, 2 ];
	like($err, qr/\Q$label\E cannot run inside a transaction block/, "$name: refused in the transaction block");
	my $r = $result{$name} or do { fail("$name: no result ($err)"); next };
	is(join(',', @$r[ 0 .. 5 ]), 't,t,t,1,0,0',
		"$name caught: the receipt is past the insert position before COMMIT, not flushed, not durable, counted delayed, not forced durable");
	$receipt{ $r->[6] } = [ $name, $r->[7] ];
}

# The power cut: every WAL byte after PostgreSQL's flush position is gone
# (the WAL writer is still stopped, and is killed with everything else).
# The commits after the caught statements were never flushed: lost, and
# each one listed with its own receipt and xid.
sub power_cut_at_flush_position
{
	my $flushed_at = $node->safe_psql('forced_db', 'SELECT pg_current_wal_flush_lsn()');
	my $since = $node->safe_psql('postgres', 'SELECT now()');
	kill_everything($node);
	zero_wal_after($node, lsn_to_int($flushed_at));
	$node->start;
	$node->poll_query_until('forced_db', "SELECT count(*) > 0 FROM delayed_durability_crashes WHERE crash_recovered_at > '$since'")
	  or die 'no crash report';
	my $crash = $node->safe_psql('forced_db', "SELECT exact, detail FROM delayed_durability_crashes WHERE crash_recovered_at > '$since'");
	like($crash, qr/^t\|exact: /, "the crash report is exact ($crash)");
	return map { my ($x, $l) = split /\|/; ($l => $x) } split /\n/,
	  $node->safe_psql('forced_db', "SELECT xid, commit_lsn FROM delayed_durability_lost_commits WHERE crash_recovered_at > '$since'");
}

my %listed = power_cut_at_flush_position();
is($node->safe_psql('forced_db', 'SELECT count(*) FROM t'), '0', 'every commit after a caught statement was lost in the power cut');
for my $lsn (sort keys %receipt)
{
	my ($name, $xid) = @{ $receipt{$lsn} };
	is($listed{$lsn} // 'missing', $xid, "$name: listed as lost with its receipt $lsn and xid $xid");
}
is(scalar keys %listed, scalar @statements, 'nothing else listed');

# A procedure whose transactions each catch a failing DROP DATABASE before
# committing, in a database with a 1 kB byte budget. After each COMMIT it
# prints how far the insert position taken just before COMMIT is ahead of
# PostgreSQL's flush position: the commit record lies beyond it, so the
# budget holds only if that stays within 1 kB.
$walwriter = pause_wal_writer($node);
$node->safe_psql('forced_db', q{
ALTER DATABASE forced_db SET delayed_durability.max_loss_bytes = '1kB';
CREATE PROCEDURE attack(n int) LANGUAGE plpgsql AS $$
DECLARE before_commit pg_lsn;
BEGIN
  FOR i IN 1 .. n LOOP
    INSERT INTO t VALUES ('loop ' || i, pg_current_xact_id());
    RAISE NOTICE 'xid=%', pg_current_xact_id();
    BEGIN
      EXECUTE 'DROP DATABASE IF EXISTS no_such_db';
    EXCEPTION WHEN others THEN NULL;
    END;
    before_commit := wal_end();
    COMMIT;
    RAISE NOTICE 'lag=%', (before_commit - pg_current_wal_flush_lsn())::bigint;
  END LOOP;
END $$;
SELECT flush_log();
});
my ($loop, $notices);
$node->psql('forced_db', q{
SELECT * FROM counters() \gset b_
CALL attack(50);
SELECT c.budget - :b_budget > 0, c.forced - :b_forced, c.durable + c.delayed - :b_durable - :b_delayed
  FROM counters() AS c;
}, stdout => \$loop, stderr => \$notices, on_error_stop => 1);
is($loop, 't|0|50', 'caught DROP DATABASE in 50 transactions: the budget flushed, none counted forced durable');
my @lags = $notices =~ /lag=(-?\d+)/g;
is(scalar @lags, 50, '50 commits measured');
my ($max_lag) = sort { $b <=> $a } @lags;
cmp_ok($max_lag, '<=', 1024, "at most 1 kB of WAL before each commit record unflushed after it (max $max_lag)");
cmp_ok($max_lag, '>', 0, 'some commits were left unflushed: the budget was not met by flushing everything');
my @loop_xids = xids_from_notices($notices);

# The power cut: every lost loop commit (its row absent) is listed.
%listed = power_cut_at_flush_position();
my %present = map { $_ => 1 } split /\n/, $node->safe_psql('forced_db', "SELECT xid FROM t WHERE k LIKE 'loop %'");
my @lost_loop = grep { !$present{$_} } @loop_xids;
cmp_ok(scalar @lost_loop, '>', 0, scalar(@lost_loop) . ' loop commits lost');
my %listed_xid = map { $_ => 1 } values %listed;
is(join(',', grep { !$listed_xid{$_} } @lost_loop), '', 'every lost loop commit is listed');

$node->stop;
done_testing();
