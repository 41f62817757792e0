/*
 * Reading and writing a sequence's one tuple the way sequence.c does.
 *
 * cached_nextval() claims a block of values by writing the block's end as
 * the sequence's last_value. nextval() and setval() read, change and
 * WAL-log that tuple while holding the page's exclusive buffer lock; the
 * claim must do the same, or a nextval() running between our read and our
 * write would be overwritten and its values handed out twice. So the claim
 * is split in two: dd_sequence_lock() takes the exclusive lock and returns
 * the tuple, the caller computes the block, dd_sequence_write() writes and
 * WAL-logs it (as do_setval does) and releases the lock. An error between
 * the two releases the lock and the pin through transaction abort, as it
 * does for nextval's own "reached maximum value" error.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xloginsert.h"
#include "commands/sequence.h"
#include "miscadmin.h"
#include "storage/bufmgr.h"
#include "utils/rel.h"

#include "sequence_page.h"

/* Private to sequence.c. */
#define SEQ_MAGIC 0x1717
typedef struct sequence_magic
{
	uint32		magic;
} sequence_magic;



static HeapTupleHeader
sequence_tuple(Relation rel, Buffer buf, Size *len)
{
	Page		page = BufferGetPage(buf);
	sequence_magic *sm = (sequence_magic *) PageGetSpecialPointer(page);
	ItemId		lp;

	if (sm->magic != SEQ_MAGIC)
		elog(ERROR, "bad magic number in sequence \"%s\": %08X",
			 RelationGetRelationName(rel), sm->magic);
	lp = PageGetItemId(page, FirstOffsetNumber);
	Assert(ItemIdIsNormal(lp));
	*len = ItemIdGetLength(lp);
	return (HeapTupleHeader) PageGetItem(page, lp);
}

static void
describe_tuple(Relation rel, Buffer buf, HeapTupleHeader tuple, DdSequencePage *out)
{
	Form_pg_sequence_data seq = (Form_pg_sequence_data) ((char *) tuple + tuple->t_hoff);

	out->last_value = seq->last_value;
	out->log_cnt = seq->log_cnt;
	out->is_called = seq->is_called;
	out->needs_wal = RelationNeedsWAL(rel);
#if PG_VERSION_NUM >= 160000
	out->new_in_transaction = rel->rd_createSubid != InvalidSubTransactionId ||
		rel->rd_firstRelfilelocatorSubid != InvalidSubTransactionId;
	out->file_number = rel->rd_locator.relNumber;
#else
	out->new_in_transaction = rel->rd_createSubid != InvalidSubTransactionId ||
		rel->rd_firstRelfilenodeSubid != InvalidSubTransactionId;
	out->file_number = rel->rd_node.relNode;
#endif
	out->page_lsn = PageGetLSN(BufferGetPage(buf));
}

/* Where the tuple's data starts in the page (the caller holds a lock). */
uint32
dd_sequence_data_offset(Relation rel, Buffer buf)
{
	Size		len;
	HeapTupleHeader tuple = sequence_tuple(rel, buf, &len);

	return (uint32) ((char *) tuple + tuple->t_hoff - (char *) BufferGetPage(buf));
}

/* The tuple as it is now, read under a share lock. */
void
dd_sequence_read(Relation rel, DdSequencePage *out)
{
	Buffer		buf = ReadBuffer(rel, 0);
	Size		len;

	LockBuffer(buf, BUFFER_LOCK_SHARE);
	describe_tuple(rel, buf, sequence_tuple(rel, buf, &len), out);
	UnlockReleaseBuffer(buf);
}

/* Takes the page's exclusive lock (kept) and returns the tuple. */
Buffer
dd_sequence_lock(Relation rel, DdSequencePage *out)
{
	Buffer		buf = ReadBuffer(rel, 0);
	Size		len;
	HeapTupleHeader tuple;

	LockBuffer(buf, BUFFER_LOCK_EXCLUSIVE);
	tuple = sequence_tuple(rel, buf, &len);
	/* As read_seq_tuple: clear an xmax left by SELECT FOR UPDATE of old releases. */
	if (HeapTupleHeaderGetRawXmax(tuple) != InvalidTransactionId)
	{
		HeapTupleHeaderSetXmax(tuple, InvalidTransactionId);
		tuple->t_infomask &= ~HEAP_XMAX_COMMITTED;
		tuple->t_infomask |= HEAP_XMAX_INVALID;
		MarkBufferDirtyHint(buf, true);
	}
	describe_tuple(rel, buf, tuple, out);
	return buf;
}

/*
 * Writes last_value (is_called = true) and log_cnt into the page locked by
 * dd_sequence_lock, WAL-logged like do_setval when the relation needs WAL,
 * and releases the lock. Returns the end of the WAL record, or 0 when none
 * was written, and the page as written in *out.
 */
uint64
dd_sequence_write(Relation rel, Buffer buf, int64 last_value, int64 log_cnt,
				  DdSequencePage *out)
{
	Page		page = BufferGetPage(buf);
	Size		len;
	HeapTupleHeader tuple = sequence_tuple(rel, buf, &len);
	Form_pg_sequence_data seq = (Form_pg_sequence_data) ((char *) tuple + tuple->t_hoff);
	bool		needs_wal = RelationNeedsWAL(rel);
	XLogRecPtr	recptr = InvalidXLogRecPtr;

	/* As do_setval: the commit of a WAL-logged change waits for sync rep. */
	if (needs_wal)
		GetTopTransactionId();

	START_CRIT_SECTION();
	seq->last_value = last_value;
	seq->is_called = true;
	seq->log_cnt = log_cnt;
	MarkBufferDirty(buf);
	if (needs_wal)
	{
		xl_seq_rec	xlrec;

		XLogBeginInsert();
		XLogRegisterBuffer(0, buf, REGBUF_WILL_INIT);
#if PG_VERSION_NUM >= 160000
		xlrec.locator = rel->rd_locator;
#else
		xlrec.node = rel->rd_node;
#endif
		XLogRegisterData((char *) &xlrec, sizeof(xl_seq_rec));
		XLogRegisterData((char *) tuple, len);
		recptr = XLogInsert(RM_SEQ_ID, XLOG_SEQ_LOG);
		PageSetLSN(page, recptr);
	}
	END_CRIT_SECTION();

	describe_tuple(rel, buf, tuple, out);
	UnlockReleaseBuffer(buf);
	return recptr;
}
