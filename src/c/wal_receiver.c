/*
 * What the WAL receiver last heard from the primary: the end of the WAL the
 * primary reported (in its WAL data and keepalive messages: the WAL it had
 * flushed or sent), when, and on which timeline. Read on a standby by the
 * report worker, so that a failover it is promoted in can say what the old
 * primary had flushed when it was last heard of.
 */
#include "postgres.h"

#include "replication/walreceiver.h"
#include "storage/spin.h"

bool
dd_wal_receiver_latest(XLogRecPtr *end, TimestampTz *at, TimeLineID *tli)
{
	WalRcvData *walrcv = WalRcv;

	*end = InvalidXLogRecPtr;
	*at = 0;
	*tli = 0;
	if (walrcv == NULL)
		return false;
	SpinLockAcquire(&walrcv->mutex);
	*end = walrcv->latestWalEnd;
	*at = walrcv->latestWalEndTime;
	*tli = walrcv->receivedTLI;
	SpinLockRelease(&walrcv->mutex);
	return *end != InvalidXLogRecPtr && *tli != 0;
}
