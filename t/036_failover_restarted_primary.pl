# A failover whose old primary restarted after the standby stopped
# receiving. The record of acknowledged delayed commits holds one run: the
# commits the old primary acknowledged before its restart, past the switch
# point, are lost in the failover too but are in no record. The failover's
# row must not read exact; one whose old primary ran once since the
# standby stopped still does. Judged against the rows the new primary has.
use strict;
use warnings;
use File::Copy;
use File::Spec;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;

sub delayed_commits
{
	my ($node, $from, $to) = @_;
	$node->safe_psql('postgres', join('', map { "INSERT INTO t VALUES ($_);\n" } $from .. $to));
}

# A primary and a standby it streams to; the standby then stops receiving.
sub pair
{
	my ($name) = @_;
	my $primary = new_dd_node("${name}_p", init => { allows_streaming => 1 });
	$primary->safe_psql('postgres', q{
ALTER DATABASE postgres SET delayed_durability.mode = 'forced';
CREATE TABLE t (k int PRIMARY KEY);
SELECT flush_log();
});
	$primary->backup('b');
	my $standby = PostgreSQL::Test::Cluster->new("${name}_s");
	$standby->init_from_backup($primary, 'b', has_streaming => 1);
	$standby->start;
	$primary->wait_for_catchup($standby);
	$standby->safe_psql('postgres', "ALTER SYSTEM SET primary_conninfo = ''; SELECT pg_reload_conf()");
	$standby->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'walreceiver'")
	  or die 'the WAL receiver did not stop';
	return ($primary, $standby);
}

# The old primary dies; the standby is promoted and imports the record
# copied from the old primary's data directory.
sub fail_over
{
	my ($primary, $standby) = @_;
	kill_everything($primary);
	# Absolute: the server reads it from its data directory (18's base
	# directories are relative to the test's).
	my $copy = File::Spec->rel2abs($standby->basedir . '/old_record');
	copy($primary->data_dir . '/delayed_durability/commits', $copy) or die $!;
	$standby->promote;
	$standby->poll_query_until('postgres', 'SELECT count(*) = 1 FROM delayed_durability_failovers') or die 'no failover row';
	my $listed = $standby->safe_psql('postgres', "SELECT delayed_durability_import_failover_record('$copy')");
	my ($lost, $exact, $detail) = split /\|/,
	  $standby->safe_psql('postgres', 'SELECT lost_commits, exact, detail FROM delayed_durability_failovers');
	my $present = $standby->safe_psql('postgres', 'SELECT count(*) FROM t');
	my $xids = $standby->safe_psql('postgres', "SELECT count(*) FROM delayed_durability_lost_commits WHERE lost_in = 'failover'");
	return ($listed, $lost, $exact, $detail, $present, $xids);
}

# ---- 1. The old primary restarted cleanly between two batches: five
# delayed commits before the restart (made durable by its shutdown there,
# never sent), three after it. All eight are lost in the failover; the
# record lists the last three only.
{
	my ($primary, $standby) = pair('restarted');
	delayed_commits($primary, 1, 5);
	$primary->restart;
	delayed_commits($primary, 6, 8);
	is($primary->safe_psql('postgres', 'SELECT count(*) FROM t'), 8, 'restarted: the old primary had all eight rows');
	my ($listed, $lost, $exact, $detail, $present, $xids) = fail_over($primary, $standby);
	is($present, 0, 'restarted: none of the eight rows is on the new primary');
	is("$listed|$lost|$xids", '3|3|3', 'restarted: the record lists the three of its last run');
	is($exact, 'f', 'restarted: the failover does not read exact');
	like($detail, qr/covers its last run only, which began at [0-9A-F]+\/[0-9A-F]+, past the switch point/,
		'restarted: and says why');
}

# ---- 2. The same without the restart: the record covers every delayed
# commit past the switch point, and the row is exact.
{
	my ($primary, $standby) = pair('once');
	delayed_commits($primary, 1, 8);
	my ($listed, $lost, $exact, $detail, $present, $xids) = fail_over($primary, $standby);
	is($present, 0, 'one run: none of the eight rows is on the new primary');
	is("$listed|$lost|$xids|$exact", '8|8|8|t', 'one run: all eight listed, exact');
}

# ---- 3. A crash restart of the old primary (restart_after_crash): the
# record of the run after it begins where recovery ended, past the switch
# point: the commits of the crashed run that recovery kept are lost in the
# failover and not in the record.
{
	my ($primary, $standby) = pair('crashed');
	$primary->append_conf('postgresql.conf', "restart_after_crash = on\n");
	$primary->reload;
	delayed_commits($primary, 1, 5);
	$primary->safe_psql('postgres', 'SELECT flush_log()');
	# The WAL writer killed: the postmaster restarts every process and recovers.
	my $walwriter = $primary->safe_psql('postgres', "SELECT pid FROM pg_stat_activity WHERE backend_type = 'walwriter'");
	kill 'KILL', $walwriter;
	$primary->poll_query_until('postgres', "SELECT count(*) = 1 FROM pg_stat_activity WHERE backend_type = 'walwriter' AND pid <> $walwriter")
	  or die 'not back after the crash restart';
	is($primary->safe_psql('postgres', 'SELECT count(*) FROM t'), 5, 'crash restart: the five flushed rows were recovered');
	delayed_commits($primary, 6, 8);
	my ($listed, $lost, $exact, $detail, $present, $xids) = fail_over($primary, $standby);
	is($present, 0, 'crash restart: none of the eight rows is on the new primary');
	is("$listed|$lost|$exact", '3|3|f', 'crash restart: three listed, not exact');
	like($detail, qr/covers its last run only/, 'crash restart: and says why');
}

done_testing();
