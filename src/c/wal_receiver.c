/*
 * What the WAL receiver last heard from the server it streams from: the end
 * of WAL that server reported (its flush position in WAL data messages, what
 * it had sent in keepalives: at most what it had flushed), on which
 * timeline, and whether it streams now. Sampled on a standby by the report
 * worker while streaming, so that a failover it is promoted in can say how
 * far that server had at least flushed when last heard from.
 */
#include "postgres.h"

#include "replication/walreceiver.h"
#include "storage/spin.h"

bool
dd_wal_receiver_streaming(XLogRecPtr *end, TimeLineID *tli)
{
	WalRcvData *walrcv = WalRcv;
	bool		streaming;

	*end = InvalidXLogRecPtr;
	*tli = 0;
	if (walrcv == NULL)
		return false;
	SpinLockAcquire(&walrcv->mutex);
	streaming = walrcv->walRcvState == WALRCV_STREAMING;
	*end = walrcv->latestWalEnd;
	*tli = walrcv->receivedTLI;
	SpinLockRelease(&walrcv->mutex);
	return streaming && *end != InvalidXLogRecPtr && *tli != 0;
}
