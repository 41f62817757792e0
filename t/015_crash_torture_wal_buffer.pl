# The crash torture of 011 with the persistent WAL buffer on /dev/shm:
# durable commits skip their WAL fsync, and simulated power cuts zero every
# WAL byte after the last real fsync, so every acknowledged durable commit,
# prepared transaction and sequence recovery value past that point must come
# back from the buffer.
#   TORTURE_CYCLES=N (default 15), TORTURE_SEED=S as for 011.
use strict;
use warnings;
# Loaded at compile time: the test framework sets itself up in INIT blocks,
# which do not run for modules first loaded by the `do` below.
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use DelayedDurabilityTest;
use WalBufferFile;

$ENV{TORTURE_WAL_BUFFER} = 1;
$ENV{TORTURE_CYCLES} //= 15;
(my $torture = __FILE__) =~ s/015_crash_torture_wal_buffer/011_crash_torture/;
do "./$torture";
die $@ if $@;
