/*
 * cached_nextval()'s entry point: the per-call work, shaped like nextval's.
 *
 * nextval() with a cache costs little per call: a backend-local hash probe,
 * the relation lock taken once per transaction, relation_open, the ACL
 * check, and an increment of a backend-local counter. cached_nextval() must
 * also check that nothing wrote the sequence since its shared block was
 * claimed, and take the value from a cache shared by all sessions. This file
 * keeps that to what nextval does plus a share lock on an already pinned
 * page and one atomic fetch-add on the shared slot (src/sequence/slots.rs):
 *
 *  - one entry per sequence in a backend-local table remembers the
 *    transaction whose lock we hold (taken under the top transaction's
 *    resource owner, as sequence.c does, so a subtransaction's abort keeps
 *    it), the sequence's options (forgotten on any pg_sequence
 *    invalidation), the index of its shared slot, and a pin of its page;
 *  - the page stays pinned until the transaction ends (released at
 *    pre-commit/pre-prepare, before the resource owner would report a leak;
 *    an abort releases it itself). A file created in this transaction is
 *    never kept pinned: a rolled-back subtransaction drops its buffers;
 *  - everything else - claiming a block, waiting for a synchronous standby,
 *    finding a slot - is the Rust slow path (dd_cached_nextval_slow).
 *
 * Errors are raised here as sequence.c raises them: there is no Rust frame
 * between this function and the executor on the fast path.
 */
#include "postgres.h"

#include "access/htup_details.h"

#include "access/relation.h"
#include "access/xact.h"
#include "catalog/pg_class.h"
#include "catalog/pg_sequence.h"
#include "commands/sequence.h"
#include "fmgr.h"
#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/bufpage.h"
#include "storage/bufmgr.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "tcop/utility.h"
#include "utils/acl.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/rel.h"
#include "utils/resowner.h"
#include "utils/syscache.h"

#include "sequence_page.h"

#if PG_VERSION_NUM >= 170000
#define MY_LXID (MyProc->vxid.lxid)
#else
#define MY_LXID (MyProc->lxid)
#endif

#if PG_VERSION_NUM >= 160000
#define REL_FILE_NUMBER(rel) ((rel)->rd_locator.relNumber)
#else
#define REL_FILE_NUMBER(rel) ((rel)->rd_node.relNode)
#endif

/* Mirrored by Options in src/sequence/page.rs. */
typedef struct DdSequenceOptions
{
	int64		increment;
	int64		min;
	int64		max;
	int64		cache;
	bool		cycle;
} DdSequenceOptions;

/* src/sequence/mod.rs, slots.rs and src/preload.rs */
extern int64 dd_cached_nextval_slow(Relation rel, const DdSequenceOptions *options, int32 *slot_index);
extern bool dd_library_preloaded(void);
extern void dd_require_preloaded(void);
extern bool dd_sequence_fast_take(int32 slot_index, uint64 key, const DdSequenceOptions *options,
								  const DdSequencePage *now, bool page_as_validated,
								  uint64 *validated_generation, int64 *value);

/* Called from Rust. */
extern Datum dd_cached_nextval(PG_FUNCTION_ARGS);
extern bool dd_sequence_session_value(Oid relid, int64 *value);
extern bool dd_sequence_session_last(Oid *relid, int64 *value);
extern void dd_sequence_discard_session_values(void);
extern void dd_sequence_register_callbacks(void);

typedef struct SequenceEntry
{
	Oid			relid;			/* hash key */
	LocalTransactionId lock_lxid;	/* we hold RowExclusiveLock in this xact */
	bool		options_valid;
	DdSequenceOptions options;
	int32		slot_index;		/* -1 until the slow path found the slot */
	Buffer		pinned;			/* InvalidBuffer, or block 0 of pinned_file */
	LocalTransactionId pin_lxid;
	Oid			pinned_file;
	/* The buffer of the last pin, tried first next time (ReadRecentBuffer). */
	Buffer		recent;
	Oid			recent_file;
	uint32		data_offset;	/* of the tuple's data in recent_file's page */
	/*
	 * The slot's generation when the fast path last found the slot matching
	 * these options and validated_page (NOT_VALIDATED: never, or since the
	 * options were read again).
	 */
	uint64		validated_generation;
	DdSequencePage validated_page;
	bool		has_value;		/* cached_currval() */
	int64		last_value;
} SequenceEntry;

#define NOT_VALIDATED PG_UINT64_MAX

/* Pins kept at once; more sequences in one transaction take the slow path. */
#define MAX_HELD_PINS 16

static HTAB *entries = NULL;
static SequenceEntry *last_entry = NULL;	/* the previous call's entry */
static SequenceEntry *last_returned = NULL; /* cached_lastval() */
static SequenceEntry *held_pins[MAX_HELD_PINS];
static int	held_pin_count = 0;
/* Pins were released for commit in this transaction: take no more. */
static LocalTransactionId pins_closed_lxid = InvalidLocalTransactionId;

static inline SequenceEntry *
entry_for(Oid relid)
{
	SequenceEntry *entry;
	bool		found;

	if (last_entry != NULL && last_entry->relid == relid)
		return last_entry;
	if (entries == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(Oid);
		ctl.entrysize = sizeof(SequenceEntry);
		entries = hash_create("delayed_durability sequences", 16, &ctl, HASH_ELEM | HASH_BLOBS);
	}
	entry = hash_search(entries, &relid, HASH_ENTER, &found);
	if (!found)
	{
		entry->lock_lxid = InvalidLocalTransactionId;
		entry->options_valid = false;
		entry->slot_index = -1;
		entry->pinned = InvalidBuffer;
		entry->pin_lxid = InvalidLocalTransactionId;
		entry->recent = InvalidBuffer;
		entry->has_value = false;
		entry->validated_generation = NOT_VALIDATED;
	}
	last_entry = entry;
	return entry;
}

/*
 * As sequence.c's lock_and_open_sequence, with a clear error for a bad OID
 * (RelationIdGetRelation returns NULL for a relation that does not exist,
 * where relation_open raises an internal error).
 */
static Relation
lock_and_open(SequenceEntry *entry)
{
	Relation	rel;

	if (entry->lock_lxid != MY_LXID)
	{
		ResourceOwner current = CurrentResourceOwner;

		CurrentResourceOwner = TopTransactionResourceOwner;
		LockRelationOid(entry->relid, RowExclusiveLock);
		CurrentResourceOwner = current;
	}
	rel = RelationIdGetRelation(entry->relid);
	if (rel == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation with OID %u does not exist", entry->relid)));
	/* As relation_open: a transaction that used a temporary object cannot PREPARE. */
	if (RelationUsesLocalBuffers(rel))
		MyXactFlags |= XACT_FLAGS_ACCESSEDTEMPNAMESPACE;
	entry->lock_lxid = MY_LXID;
	return rel;
}

/* nextval's checks: relkind, privileges, read-only and parallel mode. */
static void
check_call(Relation rel)
{
	if (rel->rd_rel->relkind != RELKIND_SEQUENCE)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a sequence", RelationGetRelationName(rel))));
	if (pg_class_aclcheck(RelationGetRelid(rel), GetUserId(), ACL_USAGE | ACL_UPDATE) != ACLCHECK_OK)
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied for sequence %s", RelationGetRelationName(rel))));
	if (rel->rd_rel->relpersistence != RELPERSISTENCE_TEMP)
		PreventCommandIfReadOnly("cached_nextval()");
	PreventCommandIfParallelMode("cached_nextval()");
}

static const DdSequenceOptions *
options_of(SequenceEntry *entry)
{
	HeapTuple	tuple;
	Form_pg_sequence form;

	if (entry->options_valid)
		return &entry->options;
	tuple = SearchSysCache1(SEQRELID, ObjectIdGetDatum(entry->relid));
	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for sequence %u", entry->relid);
	form = (Form_pg_sequence) GETSTRUCT(tuple);
	entry->options.increment = form->seqincrement;
	entry->options.min = form->seqmin;
	entry->options.max = form->seqmax;
	entry->options.cache = Max(form->seqcache, 1);
	entry->options.cycle = form->seqcycle;
	ReleaseSysCache(tuple);
	entry->options_valid = true;
	return &entry->options;
}

/* ALTER SEQUENCE, DROP, rolled-back DDL: read every sequence's options again. */
static void
forget_options(Datum arg, int cacheid, uint32 hashvalue)
{
	HASH_SEQ_STATUS status;
	SequenceEntry *entry;

	if (entries == NULL)
		return;
	hash_seq_init(&status, entries);
	while ((entry = hash_seq_search(&status)) != NULL)
	{
		entry->options_valid = false;
		entry->validated_generation = NOT_VALIDATED;
	}
}

static void
release_held_pins(void)
{
	ResourceOwner current = CurrentResourceOwner;
	int			i;

	CurrentResourceOwner = TopTransactionResourceOwner;
	for (i = 0; i < held_pin_count; i++)
	{
		ReleaseBuffer(held_pins[i]->pinned);
		held_pins[i]->pinned = InvalidBuffer;
	}
	CurrentResourceOwner = current;
	held_pin_count = 0;
}

static void
forget_held_pins(void)
{
	int			i;

	/* The transaction's abort released them with its resource owner. */
	for (i = 0; i < held_pin_count; i++)
		held_pins[i]->pinned = InvalidBuffer;
	held_pin_count = 0;
}

static void
xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
		case XACT_EVENT_PARALLEL_PRE_COMMIT:
		case XACT_EVENT_PRE_PREPARE:
			if (MyProc != NULL)
				pins_closed_lxid = MY_LXID;
			release_held_pins();
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			forget_held_pins();
			break;
		default:
			break;
	}
}

static Buffer pin_page(SequenceEntry *entry, Relation rel);

/*
 * The page's buffer, pinned until the end of the transaction, or
 * InvalidBuffer when it is not kept pinned (then the slow path reads it).
 */
static inline Buffer
pinned_page(SequenceEntry *entry, Relation rel)
{
	if (likely(entry->pinned != InvalidBuffer && entry->pin_lxid == MY_LXID &&
			   entry->pinned_file == REL_FILE_NUMBER(rel)))
		return entry->pinned;
	return pin_page(entry, rel);
}

static Buffer
pin_page(SequenceEntry *entry, Relation rel)
{
	ResourceOwner current;

	if (entry->pinned != InvalidBuffer)
		return InvalidBuffer;	/* a new file in this transaction: slow path */
	if (held_pin_count == MAX_HELD_PINS || pins_closed_lxid == MY_LXID ||
		rel->rd_createSubid != InvalidSubTransactionId ||
#if PG_VERSION_NUM >= 160000
		rel->rd_firstRelfilelocatorSubid != InvalidSubTransactionId
#else
		rel->rd_firstRelfilenodeSubid != InvalidSubTransactionId
#endif
		)
		return InvalidBuffer;
	current = CurrentResourceOwner;
	CurrentResourceOwner = TopTransactionResourceOwner;
	PG_TRY();
	{
		/* The buffer of the previous transaction's pin, if it still holds the page. */
		if (entry->recent != InvalidBuffer && entry->recent_file == REL_FILE_NUMBER(rel) &&
#if PG_VERSION_NUM >= 160000
			ReadRecentBuffer(rel->rd_locator, MAIN_FORKNUM, 0, entry->recent)
#else
			ReadRecentBuffer(rel->rd_node, MAIN_FORKNUM, 0, entry->recent)
#endif
			)
			entry->pinned = entry->recent;
		else
			entry->pinned = ReadBuffer(rel, 0);
	}
	PG_FINALLY();
	{
		CurrentResourceOwner = current;
	}
	PG_END_TRY();
	/* The tuple never moves in a file's page: writers change it in place. */
	if (entry->recent_file != REL_FILE_NUMBER(rel) || entry->recent == InvalidBuffer)
	{
		LockBuffer(entry->pinned, BUFFER_LOCK_SHARE);
		entry->data_offset = dd_sequence_data_offset(rel, entry->pinned);
		LockBuffer(entry->pinned, BUFFER_LOCK_UNLOCK);
	}
	entry->recent = entry->pinned;
	entry->recent_file = REL_FILE_NUMBER(rel);
	entry->pin_lxid = MY_LXID;
	entry->pinned_file = REL_FILE_NUMBER(rel);
	held_pins[held_pin_count++] = entry;
	return entry->pinned;
}

/*
 * The fields of the page the fast path compares, read without the content
 * lock from the pinned page. A read racing a writer (who holds the
 * exclusive lock) may mix old and new fields; it is only ever used to
 * decide that the page is exactly the version the block's claim left, and
 * that stays decidable field by field: after any other write at least one
 * field differs from the claim's for good until the next claim - the page
 * LSN of a WAL-logged sequence (nextval() must WAL-log after a claim, whose
 * log_cnt is 0; setval() always does; LSNs only grow), the log_cnt of one
 * without WAL (a claim writes -1, which nextval() and setval() never
 * write). So a read that finds every field equal to the claim's either
 * came before any other write, or raced one that had not finished: the
 * call is ordered before that write. Any mismatch goes to the slow path,
 * which reads under the lock.
 */
static inline void
read_page_unlocked(Relation rel, SequenceEntry *entry, Buffer buf, DdSequencePage *out)
{
	char	   *page = BufferGetPage(buf);
	volatile FormData_pg_sequence_data *seq = (FormData_pg_sequence_data *) (page + entry->data_offset);
	union
	{
		uint64		whole;
		PageXLogRecPtr parts;
	}			lsn;

	pg_read_barrier();
	/* pd_lsn is the page's first 8 bytes: one aligned load, never torn. */
	lsn.whole = *(volatile uint64 *) page;
	out->page_lsn = PageXLogRecPtrGet(lsn.parts);
	out->last_value = seq->last_value;
	out->log_cnt = seq->log_cnt;
	out->is_called = seq->is_called;
	out->needs_wal = RelationNeedsWAL(rel);
	out->new_in_transaction = false;	/* such files are never kept pinned */
	out->file_number = REL_FILE_NUMBER(rel);
}

/*
 * The SQL function's symbol, cached_nextval_wrapper, is a jump to this
 * function (src/sequence/mod.rs): a Rust library exports only Rust symbols.
 */
Datum
dd_cached_nextval(PG_FUNCTION_ARGS)
{
	Oid			relid = PG_GETARG_OID(0);
	SequenceEntry *entry;
	Relation	rel;
	const DdSequenceOptions *options;
	Buffer		buf;
	int64		value;
	bool		served = false;

	if (!dd_library_preloaded())
		dd_require_preloaded();
	entry = entry_for(relid);
	rel = lock_and_open(entry);
	check_call(rel);
	options = options_of(entry);
	if (entry->slot_index >= 0 && (buf = pinned_page(entry, rel)) != InvalidBuffer)
	{
		DdSequencePage now;
		uint64		key = ((uint64) MyDatabaseId << 32) | relid;

		bool		as_validated;

		read_page_unlocked(rel, entry, buf, &now);
		as_validated = now.page_lsn == entry->validated_page.page_lsn &&
			now.last_value == entry->validated_page.last_value &&
			now.log_cnt == entry->validated_page.log_cnt &&
			now.is_called == entry->validated_page.is_called &&
			now.file_number == entry->validated_page.file_number;
		served = dd_sequence_fast_take(entry->slot_index, key, options, &now, as_validated,
									   &entry->validated_generation, &value);
		if (served && !as_validated)
			entry->validated_page = now;
	}
	if (!served)
		value = dd_cached_nextval_slow(rel, options, &entry->slot_index);
	relation_close(rel, NoLock);
	entry->has_value = true;
	entry->last_value = value;
	last_returned = entry;
	PG_RETURN_INT64(value);
}

/* cached_currval(): false before this session's first cached_nextval(). */
bool
dd_sequence_session_value(Oid relid, int64 *value)
{
	SequenceEntry *entry;

	if (entries == NULL)
		return false;
	entry = hash_search(entries, &relid, HASH_FIND, NULL);
	if (entry == NULL || !entry->has_value)
		return false;
	*value = entry->last_value;
	return true;
}

/* cached_lastval(): false before this session's first cached_nextval(). */
bool
dd_sequence_session_last(Oid *relid, int64 *value)
{
	if (last_returned == NULL || !last_returned->has_value)
		return false;
	*relid = last_returned->relid;
	*value = last_returned->last_value;
	return true;
}

/* DISCARD SEQUENCES / DISCARD ALL. */
void
dd_sequence_discard_session_values(void)
{
	HASH_SEQ_STATUS status;
	SequenceEntry *entry;

	last_returned = NULL;
	if (entries == NULL)
		return;
	hash_seq_init(&status, entries);
	while ((entry = hash_seq_search(&status)) != NULL)
		entry->has_value = false;
}

/* Called once from _PG_init in the postmaster; backends inherit both. */
void
dd_sequence_register_callbacks(void)
{
	CacheRegisterSyscacheCallback(SEQRELID, forget_options, (Datum) 0);
	RegisterXactCallback(xact_callback, NULL);
}
