/*
 * Durability classes per table: the catalog work (src/table_class.rs holds
 * the backend-local cache and the decision).
 *
 *  - which tables the current transaction modified: PostgreSQL's own
 *    per-transaction table statistics (pgstat_relation.c). heapam counts
 *    every inserted, updated and deleted row there and TRUNCATE marks the
 *    table, whatever ran the write (a statement, COPY, a trigger, a rule, a
 *    foreign-key cascade, a function, logical replication apply); a
 *    subtransaction's counts move to its parent when it commits and are
 *    dropped from the transaction's list when it rolls back. At pre-commit
 *    only the top level is left. The per-commit cost is a walk of the
 *    tables this transaction wrote;
 *  - reading the configuration table into (relation, class) pairs, with
 *    partitions given the class of the partitioned table they belong to;
 *  - setting a class, with the ownership check, as the configuration
 *    table's owner.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/htup_details.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/catalog.h"
#include "catalog/indexing.h"
#include "catalog/objectaddress.h"
#include "catalog/partition.h"
#include "catalog/pg_am.h"
#include "catalog/pg_class.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_inherits.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "pgstat.h"
#include "storage/lmgr.h"
#include "utils/acl.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/syscache.h"
#if PG_VERSION_NUM >= 150000
#include "utils/pgstat_internal.h"
#endif

#define CONFIG_TABLE "delayed_durability_table_class_config"

#if PG_VERSION_NUM >= 160000
#define TABSTAT_RELID(t) ((t)->id)
#define IS_TABLE_OWNER(relid) object_ownercheck(RelationRelationId, (relid), GetUserId())
#else
#define TABSTAT_RELID(t) ((t)->t_id)
#define IS_TABLE_OWNER(relid) pg_class_ownercheck((relid), GetUserId())
#endif

/*
 * The tables the current top-level transaction modified (rows inserted,
 * updated or deleted, or truncated), at pre-commit. Writes up to max of them
 * into out and returns how many there are; -1 when they are not known:
 * track_counts is off, or before 15 (no per-transaction statistics this code
 * can read).
 */
int
dd_xact_modified_relations(Oid *out, int max)
{
#if PG_VERSION_NUM >= 150000
	PgStat_SubXactStatus *level;
	PgStat_TableXactStatus *trans;
	int			n = 0;

	/* With track_counts off nothing is counted: the caller cannot know. */
	if (!pgstat_track_counts)
		return -1;
	if (GetCurrentTransactionNestLevel() != 1)
		return 0;
	/* The top level's list; an empty level is made when there is none. */
	level = pgstat_get_xact_stack_level(1);
	for (trans = level->first; trans != NULL; trans = trans->next)
	{
		if (trans->tuples_inserted == 0 && trans->tuples_updated == 0 &&
			trans->tuples_deleted == 0 && !trans->truncdropped)
			continue;
		if (n < max)
			out[n] = TABSTAT_RELID(trans->parent);
		n++;
	}
	return n;
#else
	return -1;
#endif
}

/*
 * Whether a write to this unclassified relation leaves a commit delayed that
 * the delayed class would delay: a temporary or unlogged table (a crash
 * loses it anyway), a TOAST table (written only with its table's row, whose
 * own class counts), or a relation dropped in this transaction (the commit
 * drops its file: PostgreSQL flushes it).
 */
bool
dd_relation_ignorable(Oid relid)
{
	HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	Form_pg_class form;
	bool		result;

	if (!HeapTupleIsValid(tuple))
		return true;
	form = (Form_pg_class) GETSTRUCT(tuple);
	result = form->relpersistence != RELPERSISTENCE_PERMANENT || form->relkind == RELKIND_TOASTVALUE;
	ReleaseSysCache(tuple);
	return result;
}

/*
 * The configuration table of the extension installed in this database,
 * found through pg_extension.extconfig; InvalidOid when the extension is not
 * installed or is at a version without one.
 */
Oid
dd_table_class_config_relid(void)
{
	Relation	extensions;
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	Oid			result = InvalidOid;

	if (!OidIsValid(MyDatabaseId))
		return InvalidOid;
	extensions = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("delayed_durability"));
	scan = systable_beginscan(extensions, ExtensionNameIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		config = heap_getattr(tuple, Anum_pg_extension_extconfig,
										  RelationGetDescr(extensions), &isnull);

		if (!isnull)
		{
			Datum	   *elements;
			int			count;

			deconstruct_array(DatumGetArrayTypeP(config), OIDOID, sizeof(Oid), true,
							  TYPALIGN_INT, &elements, NULL, &count);
			for (int i = 0; i < count; i++)
			{
				char	   *name = get_rel_name(DatumGetObjectId(elements[i]));

				if (name != NULL && strcmp(name, CONFIG_TABLE) == 0)
					result = DatumGetObjectId(elements[i]);
			}
		}
	}
	systable_endscan(scan);
	table_close(extensions, AccessShareLock);
	return result;
}

typedef struct ClassRow
{
	Oid			relid;
	bool		durable;
	int			depth;			/* partition ancestors above it */
} ClassRow;

static int
by_depth(const void *a, const void *b)
{
	return ((const ClassRow *) a)->depth - ((const ClassRow *) b)->depth;
}

typedef struct ClassList
{
	Oid		   *relids;
	char	   *codes;
	int			count;
	int			size;
} ClassList;

/* Whether a plain table's access method is heap (true when it is gone). */
bool
dd_relation_is_heap(Oid relid)
{
	HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	bool		heap = true;

	if (HeapTupleIsValid(tuple))
	{
		Form_pg_class form = (Form_pg_class) GETSTRUCT(tuple);

		heap = form->relkind != RELKIND_RELATION || form->relam == HEAP_TABLE_AM_OID;
		ReleaseSysCache(tuple);
	}
	return heap;
}

/* Says that a durable table's writes are not counted, and what follows. */
void
dd_warn_uncounted(Oid relid)
{
	HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));
	char	   *am_name = NULL;

	if (HeapTupleIsValid(tuple))
	{
		am_name = get_am_name(((Form_pg_class) GETSTRUCT(tuple))->relam);
		ReleaseSysCache(tuple);
	}
	ereport(WARNING,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("durable table \"%s\" uses table access method \"%s\", whose writes are not counted per transaction",
					get_rel_name(relid) ? get_rel_name(relid) : "?", am_name ? am_name : "?"),
			 errdetail("Every commit in this database that writes anything is made durable."),
			 errhint("Move the table to heap (ALTER TABLE ... SET ACCESS METHOD heap) or clear its class.")));
}

/*
 * Codes: 'D'/'d' a durable/delayed table, 'P'/'p' a durable/delayed
 * partitioned table (whose invalidation, when it gains a partition, means
 * reading the classes again), 'U' a durable table whose access method is
 * not heap.
 */
static void
append_relation(ClassList *list, Oid relid, bool durable)
{
	char		relkind = get_rel_relkind(relid);
	bool		uncounted = false;

	if (relkind == '\0')
		return;
	/*
	 * A durable table whose access method is not heap (a partition created
	 * with another one, ALTER TABLE SET ACCESS METHOD after the class was
	 * set): its writes may not be counted per transaction.
	 */
	if (durable && relkind == RELKIND_RELATION)
		uncounted = !dd_relation_is_heap(relid);
	if (list->count == list->size)
	{
		list->size *= 2;
		list->relids = repalloc(list->relids, list->size * sizeof(Oid));
		list->codes = repalloc(list->codes, list->size);
	}
	list->relids[list->count] = relid;
	list->codes[list->count] = relkind == RELKIND_PARTITIONED_TABLE ? (durable ? 'P' : 'p')
		: uncounted ? 'U' : (durable ? 'D' : 'd');
	list->count++;
}

/*
 * Reads the configuration table and returns every relation a class applies
 * to, in an order where a later pair overrides an earlier one for the same
 * relation: a partitioned table's class goes to all its partitions, at any
 * depth, unless a partition nearer to them has a class of its own. The
 * arrays and everything else allocated live in *context, which the caller
 * deletes. Returns -1 when the table is gone, -2 when it cannot be read
 * now: the commit does not wait.
 *
 * Read under ShareLock, taken only if free: no other transaction is then
 * writing classes (a writer holds RowExclusiveLock until it commits), so
 * SnapshotSelf sees exactly the committed classes and this transaction's
 * own, and no SERIALIZABLE predicate lock is taken (a commit never
 * conflicts on the configuration table).
 */
int
dd_table_class_load(Oid config_relid, Oid **relids_out, char **codes_out, MemoryContext *context)
{
	MemoryContext old;
	Relation	config;
	SysScanDesc scan;
	HeapTuple	tuple;
	ClassRow   *rows;
	int			nrows = 0,
				rows_size = 16;
	ClassList	list;

	if (!ConditionalLockRelationOid(config_relid, ShareLock))
		return -2;
	config = try_table_open(config_relid, NoLock);
	if (config == NULL)
	{
		UnlockRelationOid(config_relid, ShareLock);
		return -1;
	}
	*context = AllocSetContextCreate(TopTransactionContext, "delayed_durability table classes",
									 ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(*context);
	rows = palloc(rows_size * sizeof(ClassRow));
	scan = systable_beginscan(config, InvalidOid, false, SnapshotSelf, 0, NULL);
	while (HeapTupleIsValid(tuple = systable_getnext(scan)))
	{
		bool		relid_null,
					class_null;
		Datum		relid = heap_getattr(tuple, 1, RelationGetDescr(config), &relid_null);
		Datum		class = heap_getattr(tuple, 2, RelationGetDescr(config), &class_null);

		if (relid_null || class_null)
			continue;
		/* A row left by a drop the event trigger did not see. */
		if (!SearchSysCacheExists1(RELOID, relid))
			continue;
		if (nrows == rows_size)
		{
			rows_size *= 2;
			rows = repalloc(rows, rows_size * sizeof(ClassRow));
		}
		rows[nrows].relid = DatumGetObjectId(relid);
		rows[nrows].durable = strcmp(TextDatumGetCString(class), "durable") == 0;
		rows[nrows].depth = get_rel_relispartition(rows[nrows].relid)
			? list_length(get_partition_ancestors(rows[nrows].relid)) : 0;
		nrows++;
	}
	systable_endscan(scan);
	table_close(config, ShareLock);

	/* Outer tables first, so that a nearer class is appended later. */
	qsort(rows, nrows, sizeof(ClassRow), by_depth);
	list.size = 16;
	list.count = 0;
	list.relids = palloc(list.size * sizeof(Oid));
	list.codes = palloc(list.size);
	for (int i = 0; i < nrows; i++)
	{
		append_relation(&list, rows[i].relid, rows[i].durable);
		if (get_rel_relkind(rows[i].relid) == RELKIND_PARTITIONED_TABLE)
		{
			ListCell   *cell;

			foreach(cell, find_all_inheritors(rows[i].relid, NoLock, NULL))
			{
				if (lfirst_oid(cell) != rows[i].relid)
					append_relation(&list, lfirst_oid(cell), rows[i].durable);
			}
		}
	}
	MemoryContextSwitchTo(old);
	*relids_out = list.relids;
	*codes_out = list.codes;
	return list.count;
}

/* The relation's owner and table access method. */
static void
relation_owner_and_am(Oid relid, Oid *owner, Oid *am)
{
	HeapTuple	tuple = SearchSysCache1(RELOID, ObjectIdGetDatum(relid));

	if (!HeapTupleIsValid(tuple))
		elog(ERROR, "cache lookup failed for relation %u", relid);
	*owner = ((Form_pg_class) GETSTRUCT(tuple))->relowner;
	*am = ((Form_pg_class) GETSTRUCT(tuple))->relam;
	ReleaseSysCache(tuple);
}

/*
 * delayed_durability_set_table_class()'s work: checks the table and that the
 * caller owns it (or is a member of the owning role, or a superuser), then
 * writes the configuration table as its owner: nobody else may write it, so
 * that a class is only ever set through this check. class is NULL to clear.
 */
void
dd_table_class_set(Oid config_relid, Oid relid, const char *class)
{
	char		relkind;
	char	   *relname;
	Oid			config_owner;
	Oid			table_owner;
	Oid			table_am;
	Oid			save_userid;
	int			save_sec_context;
	Oid			argtypes[2] = {REGCLASSOID, TEXTOID};
	Datum		values[2];
	char		nulls[2] = {' ', ' '};
	char	   *config_name;
	char	   *sql;
	int			ret;

	relname = get_rel_name(relid);
	if (relname == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation with OID %u does not exist", relid)));
	/* Ownership first: nobody else may queue a lock on the table. */
	if (!IS_TABLE_OWNER(relid))
		aclcheck_error(ACLCHECK_NOT_OWNER, get_relkind_objtype(get_rel_relkind(relid)), relname);
	/* Held to the end of the transaction: no concurrent DROP in between. */
	LockRelationOid(relid, ShareUpdateExclusiveLock);
	if (!SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid)))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_TABLE),
				 errmsg("relation \"%s\" was dropped meanwhile", relname)));
	relkind = get_rel_relkind(relid);
	if (relkind != RELKIND_RELATION && relkind != RELKIND_PARTITIONED_TABLE)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("\"%s\" is not a table", relname),
				 errhint("Durability classes apply to tables and partitioned tables.")));
	if (get_rel_persistence(relid) == RELPERSISTENCE_TEMP)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot set a durability class on temporary table \"%s\"", relname),
				 errhint("A crash loses temporary tables whatever their commits; commits that modify only temporary tables already count as delayed ones.")));
	relation_owner_and_am(relid, &table_owner, &table_am);
	if (relkind == RELKIND_RELATION && table_am != HEAP_TABLE_AM_OID)
		ereport(ERROR,
				(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
				 errmsg("cannot set a durability class on \"%s\"", relname),
				 errdetail("Its table access method is not heap: the rows it writes are not counted per transaction.")));
	if (IsCatalogRelationOid(relid) || relid == config_relid)
		ereport(ERROR,
				(errcode(ERRCODE_WRONG_OBJECT_TYPE),
				 errmsg("cannot set a durability class on \"%s\"", relname),
				 errdetail("It is a system catalog or the table the classes are kept in.")));

	relation_owner_and_am(config_relid, &config_owner, &table_am);
	config_name = quote_qualified_identifier(get_namespace_name(get_rel_namespace(config_relid)),
											 get_rel_name(config_relid));
	if (class != NULL)
		/* Setting the class a table has writes nothing (and invalidates nothing). */
		sql = psprintf("INSERT INTO %s AS c (relid, class) VALUES ($1, $2) "
					   "ON CONFLICT (relid) DO UPDATE SET class = EXCLUDED.class "
					   "WHERE c.class OPERATOR(pg_catalog.<>) EXCLUDED.class", config_name);
	else
		sql = psprintf("DELETE FROM %s WHERE relid OPERATOR(pg_catalog.=) $1", config_name);
	values[0] = ObjectIdGetDatum(relid);
	values[1] = class != NULL ? CStringGetTextDatum(class) : (Datum) 0;
	if (class == NULL)
		nulls[1] = 'n';

	/* An error restores the user at (sub)transaction abort. */
	GetUserIdAndSecContext(&save_userid, &save_sec_context);
	SetUserIdAndSecContext(config_owner, save_sec_context | SECURITY_LOCAL_USERID_CHANGE |
						   SECURITY_RESTRICTED_OPERATION);
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	ret = SPI_execute_with_args(sql, class != NULL ? 2 : 1, argtypes, values, nulls, false, 0);
	if (ret != SPI_OK_INSERT && ret != SPI_OK_DELETE && ret != SPI_OK_UPDATE)
		elog(ERROR, "writing the durability class failed: %s", SPI_result_code_string(ret));
	SPI_finish();
	SetUserIdAndSecContext(save_userid, save_sec_context);
}
