# A failover reported like a crash: receipts that keep their meaning across
# a promotion, the failover recorded on the new primary, the old primary's
# record imported to list exactly what was lost, and what promoting a
# standby would lose, seen from the primary. Judged against the rows
# present on the new primary, not against the extension's own report.
use strict;
use warnings;
use File::Copy;
use File::Spec;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use DelayedDurabilityTest;

my $primary = new_dd_node('fo_primary', init => { allows_streaming => 1 });
$primary->safe_psql('postgres', q{
ALTER DATABASE postgres SET delayed_durability.mode = 'forced';
CREATE TABLE t (k int PRIMARY KEY, xid xid8);
CREATE TABLE dropped_file (i int);
INSERT INTO dropped_file VALUES (1);
CREATE ROLE watcher LOGIN IN ROLE pg_monitor;
SELECT flush_log();
});
$primary->backup('b');
my $standby = PostgreSQL::Test::Cluster->new('fo_standby');
$standby->init_from_backup($primary, 'b', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);

# Delayed commits, each with its receipt, as the client hears of them.
sub commit_with_receipts
{
	my ($node, $from, $to) = @_;
	my $out = $node->safe_psql('postgres', "SELECT last_commit_receipt() IS NULL;\n" . join('', map {
		"INSERT INTO t VALUES ($_, pg_current_xact_id());\nSELECT '$_ ' || last_commit_receipt();\n"
	} $from .. $to));
	return map { /^(\d+) (\S+)$/ ? ($1 => $2) : () } split /\n/, $out;
}


# ---- exposure: with the standby's WAL receiver stopped (SIGSTOP) its
# connection stays listed with the flush position it last reported.
my %receipt = commit_with_receipts($primary, 1, 5);
# A WAL sender sends only flushed WAL: flush it, then wait for the standby.
$primary->safe_psql('postgres', 'SELECT flush_log()');
$primary->wait_for_catchup($standby);
my $receiver = pause_wal_receiver($standby);
my %exposed = commit_with_receipts($primary, 51, 56);
my ($count, $flush_lsn, $bytes, $aged) = split /\|/, $primary->safe_psql('postgres',
	"SELECT delayed_commits, flush_lsn, wal_bytes > 0, oldest_commit_age > interval '0' FROM delayed_durability_standby_exposure WHERE application_name = 'fo_standby'",
	extra_params => [ '-U', 'watcher' ]);
# Independent count: the receipts whose commit ends past the flush
# position the standby reported.
my $past = grep { lsn_to_int((split /:/, $_)[2]) > lsn_to_int($flush_lsn) } values(%receipt), values(%exposed);
cmp_ok($past, '>=', 6, "exposure: the six commits made after the standby stopped are past its flush position ($flush_lsn)");
is("$count|$bytes|$aged", "$past|t|t", 'exposure: the standby would lose exactly the acknowledged commits past its flush position, as pg_monitor sees it');
# A commit PostgreSQL flushes itself (TRUNCATE drops the table's old file)
# but that, delayed by the policy, waits for no standby: exposed as well.
$primary->safe_psql('postgres', 'TRUNCATE dropped_file');
is($primary->safe_psql('postgres', "SELECT delayed_commits FROM delayed_durability_standby_exposure WHERE application_name = 'fo_standby'"),
	$count + 1, 'exposure: a commit that dropped a file, flushed here but not waiting for the standby, counts too');
kill 'CONT', $receiver;
$primary->safe_psql('postgres', 'SELECT flush_log()');
$primary->wait_for_catchup($standby);
%receipt = (%receipt, %exposed);

# The standby is cut off (no WAL receiver at all): nothing more reaches it,
# whoever flushes the primary's WAL.
$standby->safe_psql('postgres', "ALTER SYSTEM SET primary_conninfo = ''; SELECT pg_reload_conf()");
$standby->poll_query_until('postgres', "SELECT count(*) = 0 FROM pg_stat_activity WHERE backend_type = 'walreceiver'")
  or die 'the WAL receiver did not stop';
%receipt = (%receipt, commit_with_receipts($primary, 101, 106));


# ---- failover: the primary dies with those six unreplicated, the standby
# is promoted.
my $old_record = $primary->data_dir . '/delayed_durability/commits';
kill_everything($primary);
$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()') or die 'not promoted';
$standby->poll_query_until('postgres', 'SELECT count(*) = 1 FROM delayed_durability_failovers') or die 'no failover row';
my ($old_tli, $new_tli, $switch, $lost, $exact) = split /\|/, $standby->safe_psql('postgres',
	"SELECT old_timeline, new_timeline, switch_lsn, coalesce(lost_commits::text, 'NULL'), exact FROM delayed_durability_failovers");
is("$old_tli->$new_tli", '1->2', 'the new primary recorded the failover from timeline 1 to 2');
is("$lost $exact", 'NULL f', 'not exact until the old primary\'s record is imported');
ok($standby->log_contains(qr/delayed_durability: failover: timeline 1 was left at \Q$switch\E for timeline 2/), 'a LOG line says so');

# The receipts against the rows the new primary really has.
my %present = map { $_ => 1 } split /\n/, $standby->safe_psql('postgres', 'SELECT k FROM t');
my @lost_keys = grep { !$present{$_} } sort { $a <=> $b } keys %receipt;
is(scalar @lost_keys, 6, 'the six unreplicated commits are not on the new primary');
sub statuses
{
	my %s;
	for my $k (keys %receipt)
	{
		$s{$k} = $standby->safe_psql('postgres', "SELECT status FROM receipt_status('$receipt{$k}')");
	}
	return %s;
}
my %status = statuses();
is(join(',', map { "$_=$status{$_}" } grep { $status{$_} ne ($present{$_} ? 'durable' : 'lost') } sort { $a <=> $b } keys %receipt), '',
	'every receipt reads durable when its row is on the new primary, lost when not');
# The new timeline writes past the lost commits' positions: still lost.
$standby->safe_psql('postgres', q{SET delayed_durability.mode = disabled;
INSERT INTO t SELECT g, NULL FROM generate_series(10000, 14000) AS g; SELECT flush_log();});
%status = statuses();
is(scalar(grep { $status{$_} eq 'lost' } @lost_keys), 6, 'after the new timeline wrote past their positions, the lost ones still read lost');
like($standby->safe_psql('postgres', "SELECT detail FROM receipt_status('$receipt{$lost_keys[0]}')"),
	qr/timeline 1 was left at \Q$switch\E, before the commit's end/, 'and the detail says where the timeline was left');
my %after = commit_with_receipts($standby, 20001, 20001);
$standby->safe_psql('postgres', 'SELECT flush_log()');
is($standby->safe_psql('postgres', "SELECT status FROM receipt_status('$after{20001}')"), 'durable', 'a receipt issued after the promotion is unaffected');

# ---- the old primary's record, copied while it is down, imported on the
# new primary: exactly the six, matched by xid and position.
# Absolute: the server reads the path (18's test directories are relative).
my $copy = File::Spec->rel2abs($standby->basedir . '/old_primary_commits');
copy($old_record, $copy) or die "copy: $!";
# First the same record claiming another database system (its header's
# system identifier, bytes 16..23, changed), by both ways in, while the
# failover waits: refused, and the row still waits.
my $foreign_record = File::Spec->rel2abs($standby->basedir . '/foreign_commits');
copy($old_record, $foreign_record) or die "copy: $!";
open my $foreign_fh, '+<:raw', $foreign_record or die "open: $!";
seek $foreign_fh, 16, 0;
print $foreign_fh pack('Q<', 12345);
close $foreign_fh or die "close: $!";
my (undef, undef, $foreign_err) = $standby->psql('postgres', "SELECT delayed_durability_import_failover_record('$foreign_record')");
like($foreign_err, qr/is the record of another database system \(12345; this one is \d+\)/, 'the record of another database system: import refused');
(undef, undef, $foreign_err) = $standby->psql('postgres',
	"SELECT delayed_durability_receive_failover_record(pg_read_binary_file('$foreign_record'), 'n9', 1)");
like($foreign_err, qr/the record delivered by n9 as \S+ is the record of another database system/, '... and delivery refused');
is($standby->safe_psql('postgres', "SELECT coalesce(lost_commits::text, 'NULL'), exact FROM delayed_durability_failovers"),
	'NULL|f', '... the failover still waits, nothing listed');
is($standby->safe_psql('postgres', "SELECT delayed_durability_import_failover_record('$copy')"), '6', 'import: six lost');
my @listed = split /\n/, $standby->safe_psql('postgres',
	"SELECT xid || ' ' || commit_lsn FROM delayed_durability_lost_commits WHERE lost_in = 'failover' ORDER BY commit_lsn");
my @expected = map { my @f = split /:/, $receipt{$_}; "$f[3] $f[2]" } @lost_keys;
is_deeply(\@listed, \@expected, 'listed: exactly the commits absent from the new primary, by xid and commit position');
is($standby->safe_psql('postgres', 'SELECT lost_commits, exact FROM delayed_durability_failovers'), '6|t', 'the failover row is exact now');
is($standby->safe_psql('postgres', 'SELECT count(*) FROM delayed_durability_failovers', extra_params => [ '-U', 'watcher' ]),
	'1', 'pg_monitor reads the failovers');
$standby->safe_psql('postgres', 'CREATE ROLE nobody_special LOGIN');
my ($ret_public, $out_public, $err_public) = $standby->psql('postgres', 'SELECT * FROM delayed_durability_failovers',
	extra_params => [ '-U', 'nobody_special' ]);
like($err_public, qr/permission denied/, 'a role without pg_monitor cannot read the failovers');

# ---- bad input: nothing changes
sub fails
{
	my ($sql, $expect, $what, @params) = @_;
	my ($ret, $out, $err) = $standby->psql('postgres', $sql, @params);
	isnt($ret, 0, "$what: refused");
	like($err, $expect, "$what: $expect");
}
fails("SELECT delayed_durability_import_failover_record('$copy')", qr/no failover on this server waits/, 'a second import');
my $truncated = File::Spec->rel2abs($standby->basedir . '/truncated');
copy($old_record, $truncated) or die;
truncate $truncated, 4096 + 64 * 3;
fails("SELECT delayed_durability_import_failover_record('$truncated')", qr/is truncated/, 'a truncated record');
fails("SELECT * FROM receipt_status('not a receipt')", qr/invalid receipt "not a receipt"/, 'a malformed receipt');
my $foreign = $receipt{ $lost_keys[0] } =~ s/^\d+/12345/r;
fails("SELECT * FROM receipt_status('$foreign')", qr/receipt of another database system/, 'a receipt of another cluster');
fails("SELECT delayed_durability_import_failover_record('$copy')", qr/permission denied/, 'an import by a non-superuser',
	extra_params => [ '-U', 'watcher' ]);
# The delivery a rejoined old primary makes (t/031): the same checks on
# the bytes it sends; EXECUTE is not PUBLIC's.
is($standby->safe_psql('postgres', "SELECT delayed_durability_receive_failover_record(pg_read_binary_file('$copy'), 'n1', 1)"), '6',
	'the record imported by hand, delivered again: answered with the count it gave (its sender marks it delivered)');
fails("SELECT delayed_durability_receive_failover_record(pg_read_binary_file('$truncated'), 'n1')",
	qr/the record delivered by n1 as \S+ is truncated/, 'a truncated delivered record');
fails("SELECT delayed_durability_receive_failover_record(NULL, 'n1')", qr/must not be null/, 'a null record');
fails("SELECT delayed_durability_receive_failover_record('\\x00', 'n1')", qr/the record delivered by n1 /, 'a delivery of bytes that are no record');
fails("SELECT delayed_durability_receive_failover_record(pg_read_binary_file('$copy'), 'n1')",
	qr/permission denied for function delayed_durability_receive_failover_record/, 'a delivery by a role without EXECUTE',
	extra_params => [ '-U', 'watcher' ]);
is($standby->safe_psql('postgres', 'SELECT lost_commits FROM delayed_durability_failovers'), '6', 'the report is unchanged');

# ---- kept across a restart, not recorded twice; the reset forgets it,
# and the next start does not record the same promotion again.
$standby->restart;
is($standby->safe_psql('postgres', q{SELECT count(*) || ' ' || sum(lost_commits) FROM delayed_durability_failovers}), '1 6',
	'after a restart: the same one failover, its list kept');
$standby->safe_psql('postgres', 'SELECT delayed_durability_lost_commits_reset()');
is($standby->safe_psql('postgres', q{SELECT (SELECT count(*) FROM delayed_durability_failovers) || ' '
	|| (SELECT count(*) FROM delayed_durability_lost_commits WHERE lost_in = 'failover')}), '0 0',
	'the reset forgets the failover and its lost commits');
$standby->restart;
is($standby->safe_psql('postgres', 'SELECT count(*) FROM delayed_durability_failovers'), '0',
	'and the next start does not record that promotion again');

# ---- a delayed commit that no record keeps (track_lost_commits and
# max_loss_time off) makes the age read from the record unknown (NULL),
# never younger, until the next start.
$standby->safe_psql('postgres', 'CREATE TABLE aged (i int)');
settle_wal_writer($standby);
$standby->safe_psql('postgres', "SET delayed_durability.mode = 'forced'; INSERT INTO aged VALUES (1)");
is($standby->safe_psql('postgres', 'SELECT delayed_durability_oldest_unflushed_commit_age() IS NOT NULL'), 't',
	'a recorded delayed commit, not flushed: its age is known');
$standby->safe_psql('postgres', 'ALTER SYSTEM SET delayed_durability.track_lost_commits = off; SELECT pg_reload_conf()');
$standby->poll_query_until('postgres', "SELECT current_setting('delayed_durability.track_lost_commits') = 'off'") or die;
$standby->safe_psql('postgres', "SET delayed_durability.mode = 'forced'; INSERT INTO aged VALUES (2)");
is($standby->safe_psql('postgres', 'SELECT delayed_durability_oldest_unflushed_commit_age() IS NULL'), 't',
	'after a delayed commit no record keeps: the age is unknown, not that of the recorded one');

$standby->stop;
done_testing();
