/*
 * The loss budget kept against a standby: the flush position a physical
 * replication slot's standby confirmed, and the wait, in a commit that
 * already happened, until it confirms a position. The wait is shaped as
 * PostgreSQL's own SyncRepWaitForLSN: entered with interrupts held (as at
 * commit), a cancel or a termination request ends it with a WARNING and
 * the commit stands.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "replication/slot.h"
#include "replication/walsender_private.h"
#include "storage/latch.h"
#include "storage/lwlock.h"
#include "storage/spin.h"
#include "tcop/dest.h"
#include "tcop/tcopprot.h"

/*
 * The flush position the standby streaming from the physical slot `name`
 * last confirmed (a physical slot's restart_lsn follows the flush position
 * in its standby's replies), and whether a WAL sender streams from it now
 * (connected and caught up: in the streaming state), and the pid of the
 * WAL sender using it (0 when none), which tells one connection of a
 * standby from the next.
 * False when there is no physical slot of that name.
 */
bool
dd_slot_confirmed_flush(const char *name, XLogRecPtr *flush, bool *active, int *sender_pid)
{
	bool		found = false;
	int			sender = 0;

	*flush = InvalidXLogRecPtr;
	*active = false;
	*sender_pid = 0;
	if (max_replication_slots <= 0 || ReplicationSlotCtl == NULL)
		return false;
	LWLockAcquire(ReplicationSlotControlLock, LW_SHARED);
	for (int i = 0; i < max_replication_slots; i++)
	{
		ReplicationSlot *s = &ReplicationSlotCtl->replication_slots[i];

		if (!s->in_use || strcmp(NameStr(s->data.name), name) != 0)
			continue;
		SpinLockAcquire(&s->mutex);
		if (s->data.database == InvalidOid)
		{
			found = true;
			*flush = s->data.restart_lsn;
			sender = s->active_pid;
		}
		SpinLockRelease(&s->mutex);
		break;
	}
	LWLockRelease(ReplicationSlotControlLock);
	*sender_pid = sender;
	/*
	 * Streaming, not merely connected: a standby catching up after an
	 * outage confirms positions far behind, and waiting for it would hold
	 * every commit for the whole backlog (synchronous replication, too,
	 * counts only streaming WAL senders).
	 */
	if (sender != 0 && WalSndCtl != NULL)
	{
		for (int i = 0; i < max_wal_senders; i++)
		{
			WalSnd	   *w = &WalSndCtl->walsnds[i];

			SpinLockAcquire(&w->mutex);
			if (w->pid == sender)
				*active = w->state == WALSNDSTATE_STREAMING;
			SpinLockRelease(&w->mutex);
		}
	}
	return found;
}

/*
 * Waits until the standby of slot `name` confirmed `target`. Returns
 * 0 when it did, 1 when the slot is gone or nothing streams from it (now or
 * while waiting), 2 on a cancel request, 3 on a termination request or the
 * postmaster's death (the session then ends, as after SyncRepWaitForLSN).
 */
int
dd_wait_slot_flush(const char *name, XLogRecPtr target, uint32 wait_event_info)
{
	long		sleep_ms = 1;

	for (;;)
	{
		XLogRecPtr	flush;
		bool		active;
		int			sender;
		int			rc;

		if (!dd_slot_confirmed_flush(name, &flush, &active, &sender) || !active)
			return 1;
		if (flush >= target)
			return 0;
		if (ProcDiePending)
		{
			ereport(WARNING,
					(errcode(ERRCODE_ADMIN_SHUTDOWN),
					 errmsg("canceling the wait for the standby of replication slot \"%s\" and terminating connection due to administrator command", name),
					 errdetail("The transaction has already committed locally, but the standby might not have it.")));
			whereToSendOutput = DestNone;
			return 3;
		}
		if (QueryCancelPending)
		{
			QueryCancelPending = false;
			ereport(WARNING,
					(errmsg("canceling the wait for the standby of replication slot \"%s\" due to user request", name),
					 errdetail("The transaction has already committed locally, but the standby might not have it.")));
			return 2;
		}
		/*
		 * Polled (a WAL sender wakes only the synchronous-replication
		 * queue), from 1 ms up to 10 ms: a standby replies as soon as it
		 * flushed, and many waiting backends must not spin on the slot lock.
		 */
		rc = WaitLatch(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_POSTMASTER_DEATH, sleep_ms, wait_event_info);
		sleep_ms = Min(sleep_ms * 2, 10);
		ResetLatch(MyLatch);
		if (rc & WL_POSTMASTER_DEATH)
		{
			ProcDiePending = true;
			whereToSendOutput = DestNone;
			return 3;
		}
	}
}
