/* The sequence page as src/c/sequence_page.c describes it. */
#ifndef DD_SEQUENCE_PAGE_H
#define DD_SEQUENCE_PAGE_H

#include "storage/buf.h"
#include "utils/relcache.h"

/* Mirrored by SequencePage in src/sequence/page.rs. */
typedef struct DdSequencePage
{
	int64		last_value;
	int64		log_cnt;
	bool		is_called;
	/* Changes to the relation are WAL-logged (RelationNeedsWAL). */
	bool		needs_wal;
	/*
	 * The relation's current file was created by this transaction (CREATE
	 * SEQUENCE, or ALTER SEQUENCE / TRUNCATE ... RESTART IDENTITY giving it a
	 * new one): it survives only if this transaction commits.
	 */
	bool		new_in_transaction;
	/* Changes with every WAL-logged write of the page. */
	uint64		page_lsn;
	/* Changes with every new file of the relation. */
	uint32		file_number;
} DdSequencePage;

extern uint32 dd_sequence_data_offset(Relation rel, Buffer buf);

#endif
