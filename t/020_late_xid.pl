# Every commit that writes a commit record follows the policy, also those
# that get their transaction id only after the pre-commit callbacks (NOTIFY
# and pg_notify(): PreCommit_Notify assigns it), and those whose commit
# drops files decided after them (ON COMMIT DROP): checked by the WAL flush
# position against the insert position noted just before each commit, and
# by the counter deltas. Then a
# listener that received a notification finds the notifying transaction
# committed after a power cut, under disabled with synchronous_commit = off.
use strict;
use warnings;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use DelayedDurabilityTest;

my $node = new_dd_node('late_xid');
$node->safe_psql('postgres', q{
CREATE TABLE src (i int);
CREATE TABLE audit (i int);
CREATE FUNCTION audit_row() RETURNS trigger LANGUAGE plpgsql AS
  $$ BEGIN INSERT INTO audit VALUES (NEW.i); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER audit_at_commit AFTER INSERT ON src
  DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION audit_row();
});

# case => [statements, writes a commit record, kind]. Kinds: 'policy'
# follows the policy; 'no_wal' wrote no WAL before its commit (only a
# temporary table): PostgreSQL commits it asynchronously at any level,
# nothing of it survives a crash, and it is counted as delayed in every mode.
my @cases = (
	[ 'NOTIFY only', q{NOTIFY ch, 'x';}, 1, 'policy' ],
	[ 'pg_notify only', q{SELECT pg_notify('ch', 'x');}, 1, 'policy' ],
	[ 'temporary table ON COMMIT DELETE ROWS', q{INSERT INTO tt VALUES (1);}, 1, 'no_wal' ],
	[ 'deferred constraint trigger writing at commit', q{INSERT INTO src VALUES (1);}, 1, 'policy' ],
	[ 'lo_create only', q{SELECT lo_create(0) > 0;}, 1, 'policy' ],
	[ 'ON COMMIT DROP temporary table', q{BEGIN; CREATE TEMP TABLE d (i int) ON COMMIT DROP; INSERT INTO d VALUES (1); COMMIT;}, 1, 'policy' ],
	[ 'savepoint only', q{BEGIN; SAVEPOINT a; RELEASE a; COMMIT;}, 0, 'policy' ],
	[ 'empty transaction', q{BEGIN; COMMIT;}, 0, 'policy' ],
);
my $counters = q{SELECT 'c=' || commits_durable || ',' || commits_delayed || ',' || commits_forced_durable
  FROM delayed_durability_stats WHERE datname = current_database();};

# mode, synchronous_commit, whether a counted commit is delayed
for my $setting (['disabled', 'off', 0], ['allowed', 'off', 1], ['allowed', 'on', 0], ['forced', 'on', 1])
{
	my ($mode, $sync, $delays) = @$setting;
	settle_wal_writer($node);
	my $script = "SET delayed_durability.mode = $mode;\nSET synchronous_commit = $sync;\n"
	  . "CREATE TEMP TABLE tt (i int) ON COMMIT DELETE ROWS;\nSELECT flushed();\n";
	$script .= "$counters\nCALL mark_wal();\n$_->[1]\nSELECT 'f=' || flushed_since_mark()::int;\n$counters\n" for @cases;
	my @out = grep { /^[cf]=/ } split /\n/, $node->safe_psql('postgres', $script);
	for my $case (@cases)
	{
		my ($name, undef, $counted, $kind) = @$case;
		my ($before, $flushed, $after) = splice @out, 0, 3;
		my @b = $before =~ /(\d+)/g;
		my @a = $after =~ /(\d+)/g;
		my @delta = map { $a[$_] - $b[$_] } 0 .. 2;
		my $delayed = $delays || $kind eq 'no_wal';
		my @want = !$counted ? (0, 0, 0) : $delayed ? (0, 1, 0) : (1, 0, 0);
		is(join(',', @delta), join(',', @want),
			"$mode, synchronous_commit=$sync, $name: counted (durable, delayed, forced durable)");
		if ($counted)
		{
			is($flushed, $delayed ? 'f=0' : 'f=1',
				"$mode, synchronous_commit=$sync, $name: " . ($delayed ? 'WAL not flushed past it' : 'WAL flushed past it'));
		}
	}
}

# A listener receives a notification from a transaction whose only action
# is NOTIFY, under disabled with synchronous_commit = off; a power cut right
# after (WAL zeroed past the flush position read then) must not lose that
# transaction: the listener may already have acted on it.
$node->safe_psql('postgres', 'CREATE TABLE canary (i int); SELECT flush_log();');
settle_wal_writer($node);
my $listener = $node->background_psql('postgres', on_error_stop => 0);
$listener->query_safe('LISTEN ch');
my $xid = $node->safe_psql('postgres', q{
SET delayed_durability.mode = disabled;
SET synchronous_commit = off;
SELECT pg_current_xact_id();
NOTIFY ch, 'committed?';
});
$xid = (split /\n/, $xid)[0] + 1;    # the NOTIFY's transaction comes next (nothing else runs)
my $heard = '';
for (1 .. 100)
{
	# psql prints notifications after each command it runs.
	$heard .= $listener->query("SELECT 'poll'");
	last if $heard =~ /Asynchronous notification "ch" with payload "committed\?" received/;
	usleep(50_000);
}
like($heard, qr/Asynchronous notification "ch" with payload "committed\?" received/, 'the listener received the notification');
# A canary after it: a delayed commit, with the WAL writer stopped; the
# cut must lose it (the cut really removes WAL).
pause_wal_writer($node);
$node->safe_psql('postgres', q{
SET delayed_durability.mode = allowed;
SET synchronous_commit = off;
INSERT INTO canary VALUES (1);
});
my $flushed_at = lsn_to_int($node->safe_psql('postgres', 'SELECT pg_current_wal_flush_lsn()'));
kill_everything($node);
$listener->{run}->kill_kill;
zero_wal_after($node, $flushed_at);
$node->start;
my ($ret, $status) = $node->psql('postgres', "SELECT pg_xact_status('$xid')");
is($status, 'committed', "the notifying transaction ($xid) is committed after the power cut");
is($node->safe_psql('postgres', 'SELECT count(*) FROM canary'), '0', 'the power cut removed WAL: the delayed commit after it is lost');

$node->stop;
done_testing();
