/*
 * Whether this server's WAL holds, ending at a receipt's position, the
 * commit record the receipt names: a record of the transaction resource
 * manager (COMMIT or COMMIT PREPARED) of the receipt's transaction, with its
 * commit time for a plain commit. And whether a timeline's switch point is
 * the end of a shutdown checkpoint (the old primary shut down cleanly
 * before the promotion).
 *
 * A standby has no report of the crashes of the primary it follows: a
 * delayed commit the primary lost in a crash is in no WAL the standby
 * receives, but the WAL the restarted primary writes next passes its
 * position. Only the record at that position tells them apart (transaction
 * ids are handed out again after a crash, hence the time).
 *
 * PostgreSQL's own reader (as pg_walinspect uses it) reads what this
 * server has: flushed WAL on a primary, replayed WAL on a standby, on the
 * timeline that held the position.
 */
#include "postgres.h"

#include "access/rmgr.h"
#include "access/xact.h"
#include "catalog/pg_control.h"
#include "access/xlog.h"
#include "access/xlog_internal.h"
#include "access/xlogreader.h"
#include "access/xlogutils.h"

/* What the WAL at the position says. */
#define DD_RECORD_MATCHES 0
#define DD_RECORD_OTHER 1		/* no such commit record ends there */
#define DD_RECORD_NOT_YET 2		/* past what this server can read yet */
#define DD_RECORD_UNREADABLE 3	/* removed or damaged: see the message */

/*
 * A window to widen: no record starts between its start and end (it began
 * inside the record that ends at end, or one spanning it), or none could
 * be found before the readable WAL ended (the page holding end begins with
 * the rest of that record, and nothing after it is readable yet).
 */
#define DD_WIDEN (-1)
#define DD_WIDEN_AT_END_OF_WAL (-2)

/* What the record ending at the position must be. */
typedef struct DDRecordWanted
{
	bool		shutdown_checkpoint;	/* else a commit record: */
	TransactionId xid;
	TimestampTz at;
	/* Set for a shutdown checkpoint found: where it starts, its time. */
	XLogRecPtr	found_start;
	pg_time_t	found_time;
} DDRecordWanted;

/* Whether the record the reader just read is the one wanted. */
static int
dd_matches(XLogReaderState *reader, DDRecordWanted *wanted)
{
	uint8		info;

	if (wanted->shutdown_checkpoint)
	{
		CheckPoint	checkpoint;

		if (XLogRecGetRmid(reader) != RM_XLOG_ID ||
			(XLogRecGetInfo(reader) & ~XLR_INFO_MASK) != XLOG_CHECKPOINT_SHUTDOWN ||
			XLogRecGetDataLen(reader) < sizeof(CheckPoint))
			return DD_RECORD_OTHER;
		memcpy(&checkpoint, XLogRecGetData(reader), sizeof(CheckPoint));
		wanted->found_start = reader->ReadRecPtr;
		wanted->found_time = checkpoint.time;
		return DD_RECORD_MATCHES;
	}
	if (XLogRecGetRmid(reader) != RM_XACT_ID || XLogRecGetXid(reader) != wanted->xid)
		return DD_RECORD_OTHER;
	info = XLogRecGetInfo(reader) & XLOG_XACT_OPMASK;
	if (info == XLOG_XACT_COMMIT_PREPARED)
		return DD_RECORD_MATCHES;
	if (info != XLOG_XACT_COMMIT || XLogRecGetDataLen(reader) < sizeof(xl_xact_commit))
		return DD_RECORD_OTHER;
	return ((xl_xact_commit *) XLogRecGetData(reader))->xact_time == wanted->at
		? DD_RECORD_MATCHES : DD_RECORD_OTHER;
}

/* Reads the records from the first one at or after start. */
static int
dd_scan(XLogReaderState *reader, ReadLocalXLogPageNoWaitPrivate *private,
		XLogRecPtr start, XLogRecPtr end, DDRecordWanted *wanted,
		char *message, size_t message_len)
{
	XLogRecPtr	first;
	bool		first_record = true;

	/* The callback sets it, nothing clears it. */
	private->end_of_wal = false;
	first = XLogFindNextRecord(reader, start);
	if (XLogRecPtrIsInvalid(first))
	{
		if (private->end_of_wal)
			return DD_WIDEN_AT_END_OF_WAL;
		/* What the reader found wrong, if it says. */
		strlcpy(message, reader->errormsg_buf[0] ? reader->errormsg_buf : "no valid WAL record found", message_len);
		return DD_RECORD_UNREADABLE;
	}
	XLogBeginRead(reader, first);
	for (;;)
	{
		char	   *errormsg = NULL;
		XLogRecord *record = XLogReadRecord(reader, &errormsg);

		if (record == NULL)
		{
			if (private->end_of_wal)
				return DD_RECORD_NOT_YET;
			strlcpy(message, errormsg ? errormsg : "invalid WAL record", message_len);
			return DD_RECORD_UNREADABLE;
		}
		if (first_record && reader->ReadRecPtr >= end)
			return DD_WIDEN;
		first_record = false;
		if (reader->EndRecPtr < end)
			continue;
		if (reader->EndRecPtr > end)
			return DD_RECORD_OTHER;
		return dd_matches(reader, wanted);
	}
}

static int
dd_record_at(XLogRecPtr end, DDRecordWanted *wanted, char *message, size_t message_len)
{
	MemoryContext caller = CurrentMemoryContext;
	ReadLocalXLogPageNoWaitPrivate *private = palloc0(sizeof(ReadLocalXLogPageNoWaitPrivate));
	XLogReaderState *volatile reader;
	volatile int result = DD_RECORD_OTHER;

	message[0] = '\0';
	reader = XLogReaderAllocate(wal_segment_size, NULL,
								XL_ROUTINE(.page_read = &read_local_xlog_page_no_wait,
										   .segment_open = &wal_segment_open,
										   .segment_close = &wal_segment_close),
								private);
	if (reader == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OUT_OF_MEMORY),
				 errmsg("out of memory"),
				 errdetail("Failed while allocating a WAL reading processor.")));
	PG_TRY();
	{
		/*
		 * Where to look for the record's start: first from the page holding
		 * its last byte (most commit records are small), then from twice as
		 * many pages back each time, up to 32 MB (a commit record that drops
		 * or creates thousands of relations is megabytes). WAL well before
		 * the record may not be there: a standby's first segment has zeros
		 * before its base backup's start, older segments are removed.
		 */
		XLogRecPtr	last_page = (end - 1) - (end - 1) % XLOG_BLCKSZ;
		uint64		pages_back = 0;

		for (;;)
		{
			/* The first page of WAL is no record's (as pg_walinspect). */
			XLogRecPtr	start = last_page > XLOG_BLCKSZ * (pages_back + 1)
				? last_page - XLOG_BLCKSZ * pages_back : XLOG_BLCKSZ;

			result = dd_scan(reader, private, start, end, wanted, message, message_len);
			if (result != DD_WIDEN && result != DD_WIDEN_AT_END_OF_WAL)
				break;
			if (start == XLOG_BLCKSZ)
			{
				/* From the first page on: no record ends there. */
				result = result == DD_WIDEN ? DD_RECORD_OTHER : DD_RECORD_NOT_YET;
				break;
			}
			if (pages_back >= 4095)
			{
				if (result == DD_WIDEN_AT_END_OF_WAL)
					result = DD_RECORD_NOT_YET;
				else
				{
					result = DD_RECORD_UNREADABLE;
					snprintf(message, message_len, "no record found to begin within %d MB before it",
							 (int) (XLOG_BLCKSZ * (pages_back + 1) / (1024 * 1024)));
				}
				break;
			}
			pages_back = pages_back * 2 + 1;
		}
	}
	PG_CATCH();
	{
		ErrorData  *error;

		/*
		 * A segment removed, or one that cannot be read (an I/O error,
		 * its permissions, no file descriptor left): said, not raised.
		 * Anything else (a cancel, out of memory) goes on.
		 */
		MemoryContextSwitchTo(caller);
		error = CopyErrorData();
		if (error->elevel != ERROR ||
			(ERRCODE_TO_CATEGORY(error->sqlerrcode) != ERRCODE_SYSTEM_ERROR &&
			 error->sqlerrcode != ERRCODE_DATA_CORRUPTED &&
			 error->sqlerrcode != ERRCODE_INSUFFICIENT_PRIVILEGE &&
			 error->sqlerrcode != ERRCODE_INSUFFICIENT_RESOURCES))
		{
			FreeErrorData(error);
			XLogReaderFree(reader);
			PG_RE_THROW();
		}
		FlushErrorState();
		strlcpy(message, error->message, message_len);
		FreeErrorData(error);
		result = DD_RECORD_UNREADABLE;
	}
	PG_END_TRY();
	XLogReaderFree(reader);
	pfree(private);
	return result;
}

int
dd_commit_record_at(XLogRecPtr end, TransactionId xid, TimestampTz at,
					char *message, size_t message_len)
{
	DDRecordWanted wanted = {.shutdown_checkpoint = false, .xid = xid, .at = at};

	return dd_record_at(end, &wanted, message, message_len);
}

/*
 * Whether the record ending at end is a shutdown checkpoint, and where it
 * starts and its time. At a timeline's switch point it may be the old
 * primary's clean shutdown, whose walsenders sent all its WAL first (or
 * the end of a crash recovery, which writes the same record): the old
 * primary's own record, stamped with that checkpoint, tells them apart.
 */
int
dd_shutdown_checkpoint_at(XLogRecPtr end, XLogRecPtr *start, int64 *time,
						  char *message, size_t message_len)
{
	DDRecordWanted wanted = {.shutdown_checkpoint = true};
	int			result = dd_record_at(end, &wanted, message, message_len);

	*start = wanted.found_start;
	*time = (int64) wanted.found_time;
	return result;
}
