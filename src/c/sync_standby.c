/*
 * Waiting for a synchronous standby outside a commit.
 *
 * cached_nextval() hands out no value of a new block before the block's
 * recovery value is on the synchronous standby, so that a promotion cannot
 * hand its values out again. The wait is PostgreSQL's own (SyncRepWaitForLSN,
 * as a commit waits, at least at remote_flush), entered with interrupts held
 * as at commit: a cancel or a termination ends the wait with PostgreSQL's
 * WARNING and is then acted upon here.
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "replication/syncrep.h"
#include "replication/walsender.h"
#include "replication/walsender_private.h"
#include "storage/lwlock.h"
#if PG_VERSION_NUM >= 160000
#include "utils/guc_hooks.h"
#endif

/*
 * Whether no synchronous standby is configured, or one has flushed up to lsn.
 * As SyncRepWaitForLSN decides: from the shared state the checkpointer keeps
 * (this backend's own copy of synchronous_standby_names is only re-read
 * between commands: a reload that sets it during a long statement must count
 * at once); the local setting only before the checkpointer has processed it.
 */
bool
dd_sync_standby_confirmed(XLogRecPtr lsn)
{
	bool		confirmed;

	if (max_wal_senders == 0)
		return true;
	LWLockAcquire(SyncRepLock, LW_SHARED);
#ifdef SYNC_STANDBY_DEFINED
	/* Minor releases since 2025 replaced the boolean with flags. */
	if (WalSndCtl->sync_standbys_status & SYNC_STANDBY_INIT)
		confirmed = (WalSndCtl->sync_standbys_status & SYNC_STANDBY_DEFINED) == 0 ||
			WalSndCtl->lsn[SYNC_REP_WAIT_FLUSH] >= lsn;
	else
		confirmed = WalSndCtl->lsn[SYNC_REP_WAIT_FLUSH] >= lsn ||
			SyncRepStandbyNames == NULL || SyncRepStandbyNames[0] == '\0';
#else
	confirmed = !WalSndCtl->sync_standbys_defined ||
		WalSndCtl->lsn[SYNC_REP_WAIT_FLUSH] >= lsn;
#endif
	LWLockRelease(SyncRepLock);
	return confirmed;
}

/* Waits for the synchronous standby; returns whether it confirmed lsn. */
bool
dd_sync_standby_wait(XLogRecPtr lsn)
{
	int			saved = synchronous_commit;

	if (saved < SYNCHRONOUS_COMMIT_REMOTE_FLUSH)
	{
		synchronous_commit = SYNCHRONOUS_COMMIT_REMOTE_FLUSH;
		assign_synchronous_commit(synchronous_commit, NULL);
	}
	PG_TRY();
	{
		HOLD_INTERRUPTS();
		SyncRepWaitForLSN(lsn, false);
		RESUME_INTERRUPTS();
	}
	PG_FINALLY();
	{
		/* The session's level, also when the wait raised an error. */
		if (synchronous_commit != saved)
		{
			synchronous_commit = saved;
			assign_synchronous_commit(saved, NULL);
		}
	}
	PG_END_TRY();
	/* A termination request ends the session here. */
	CHECK_FOR_INTERRUPTS();
	return dd_sync_standby_confirmed(lsn);
}
