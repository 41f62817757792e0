/*
 * The ProcessUtility hook, in C.
 *
 * Every utility statement (DDL, COPY, DO, CALL, VACUUM, ...) runs below this
 * hook. Its errors must reach PostgreSQL exactly as raised: with the cursor
 * position, CONTEXT lines and schema/table/constraint names that drivers and
 * PL/pgSQL handlers read. A Rust frame here would catch the error and raise
 * a copy with fewer fields, so the trampoline is C and only tells Rust, once
 * the statement completed, what ran. Nothing is noted before a statement
 * runs: a statement that fails (and whose error a PL/pgSQL handler or
 * psql's ON_ERROR_ROLLBACK catches) must leave nothing behind.
 */
#include "postgres.h"

#include "tcop/utility.h"

/* src/commit.rs */
extern void dd_after_utility_statement(Node *stmt);

static ProcessUtility_hook_type prev_process_utility = NULL;

static void
dd_process_utility(PlannedStmt *pstmt, const char *queryString,
#if PG_VERSION_NUM >= 140000
				   bool readOnlyTree,
#endif
				   ProcessUtilityContext context, ParamListInfo params,
				   QueryEnvironment *queryEnv, DestReceiver *dest,
				   QueryCompletion *qc)
{
	Node	   *stmt = pstmt->utilityStmt;

	if (prev_process_utility)
		prev_process_utility(pstmt, queryString,
#if PG_VERSION_NUM >= 140000
							 readOnlyTree,
#endif
							 context, params, queryEnv, dest, qc);
	else
		standard_ProcessUtility(pstmt, queryString,
#if PG_VERSION_NUM >= 140000
								readOnlyTree,
#endif
								context, params, queryEnv, dest, qc);

	/* Only once the statement completed without error. */
	dd_after_utility_statement(stmt);
}

/* Called once from _PG_init in the postmaster; chains the previous hook. */
void
dd_install_process_utility_hook(void)
{
	prev_process_utility = ProcessUtility_hook;
	ProcessUtility_hook = dd_process_utility;
}
