#!/usr/bin/perl
# Runs TAP test files with TAP::Harness and counts from its aggregator, so
# that nothing vanishes silently: a skipped test or a file that skips
# everything (plan skip_all) is reported as skipped, not passed; a file
# that dies, exits non-zero or misses its plan counts as a failure even when
# another file already failed. With CI set, any skip fails the run unless
# the file is listed in TAP_ALLOW_SKIP (space-separated file names).
# Usage: perl scripts/tap_run.pl t/001_x.pl ...   (environment as for prove)
use strict;
use warnings;
use TAP::Harness;

my @files = @ARGV or die "usage: $0 t/file.pl ...\n";
my %allowed = map { $_ => 1 } split ' ', ($ENV{TAP_ALLOW_SKIP} // '');
# merge: stderr joins the stream, so that a file's dying words can be kept.
my $harness = TAP::Harness->new({ verbosity => 1, color => 0, failures => 1, merge => 1 });
# Each failed test's number and name, and the last lines a file printed
# outside TAP (how it died), to repeat them in the last lines of the run
# (CI shows only the tail of a long log).
my (%failed_tests, %last_words);
$harness->callback(
	made_parser => sub {
		my ($parser, $job) = @_;
		my $file = $job->[0];
		$parser->callback(
			test => sub {
				my $result = shift;
				push @{ $failed_tests{$file} }, $result->number . ' ' . ($result->description // '')
				  if !$result->is_ok;
			});
		# A test helper repeats a die's message as a "# died: " comment.
		$parser->callback(
			comment => sub {
				my $line = shift->as_string;
				push @{ $last_words{$file} //= [] }, $line if $line =~ /^#\s*died: /;
			});
		$parser->callback(
			unknown => sub {
				my $line = shift->as_string;
				return if $line =~ /^\s*$/;
				my $kept = $last_words{$file} //= [];
				push @$kept, $line;
				shift @$kept while @$kept > 3;
			});
	});
my $agg = $harness->runtests(@files);

my ($passed, $failed, $skipped, $todo) = (0, 0, 0, 0);
my @problems;
for my $file ($agg->descriptions)
{
	my ($parser) = $agg->parsers($file);
	my $skips = $parser->skip_all ? 1 : scalar $parser->skipped;
	$skipped += $skips;
	$todo += scalar $parser->todo;
	# skipped tests are "passed" for TAP; count them once, as skipped.
	$passed += scalar($parser->passed) - scalar($parser->skipped) - scalar($parser->todo);
	$failed += scalar $parser->failed;
	my $strict = $ENV{CI} && !$allowed{$file};
	my @why;
	push @why, 'skips everything: ' . $parser->skip_all if $parser->skip_all;
	push @why, "$skips test(s) skipped" if $skips && !$parser->skip_all;
	push @why, 'exit status ' . $parser->exit if $parser->exit;
	push @why, 'killed (wait status ' . $parser->wait . ')' if $parser->wait && !$parser->exit;
	push @why, 'parse errors: ' . join('; ', $parser->parse_errors) if $parser->parse_errors;
	push @why, "not ok $_" for @{ $failed_tests{$file} // [] };
	push @why, 'last words: ' . join(' | ', @{ $last_words{$file} })
	  if ($parser->exit || $parser->wait) && $last_words{$file};
	next unless @why;
	# A problem of the whole file is one more failure unless a failed test
	# already accounts for it; skips are failures on CI unless allowed.
	my $broken = ($parser->exit || $parser->wait || $parser->parse_errors) && !$parser->failed;
	my $skip_fails = $skips && $strict;
	$failed++ if $broken || $skip_fails;
	push @problems, "$file: " . join(', ', @why) . ($broken || $skip_fails ? ' (counted as failed)' : '');
}
print "\n";
# Each file's wall-clock time, to keep the CI matrix within its budget.
for my $file ($agg->descriptions)
{
	my ($parser) = $agg->parsers($file);
	printf "tap time: %-40s %4d s\n", $file, $parser->end_time - $parser->start_time
	  if defined $parser->start_time && defined $parser->end_time;
}
print "tap problem: $_\n" for @problems;
# The same, for scripts/test.sh to repeat in the last lines of the run.
print "tap failed: $_\n" for grep { /not ok|counted as failed|exit status|killed|parse errors/ } @problems;
print "tap: $passed passed, $failed failed, $skipped skipped, $todo todo\n";
exit($failed ? 1 : 0);
