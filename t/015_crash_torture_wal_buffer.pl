# The crash torture of 011 with the persistent WAL buffer on /dev/shm:
# durable commits skip their WAL fsync, and simulated power cuts zero every
# WAL byte after the last real fsync, so every acknowledged durable commit,
# prepared transaction and sequence recovery value past that point must come
# back from the buffer.
#   TORTURE_CYCLES=N (default 15), TORTURE_SEED=S as for 011.
use strict;
use warnings;

$ENV{TORTURE_WAL_BUFFER} = 1;
$ENV{TORTURE_CYCLES} //= 15;
(my $torture = __FILE__) =~ s/015_crash_torture_wal_buffer/011_crash_torture/;
do "./$torture";
die $@ if $@;
