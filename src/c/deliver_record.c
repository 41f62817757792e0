/*
 * Delivery of a saved record of acknowledged delayed commits to the new
 * primary, over libpq: a rejoined old primary's report worker calls
 * delayed_durability_receive_failover_record() there, so that the
 * failover's report becomes exact without an operator.
 *
 * libpq is opened here, in that worker only, and never linked: a library
 * preloaded into the postmaster that linked libpq.so.5 would make every
 * server process (the WAL receiver's libpqwalreceiver among them) share
 * whichever libpq the loader found first, possibly older than the
 * server's. The server's own libpq (in its lib directory) is preferred,
 * then the system's.
 * Blocking calls; connect_timeout, statement_timeout and TCP keepalives
 * bound them unless the connection string says otherwise.
 */
#include "postgres.h"

#include <dlfcn.h>

#include "catalog/pg_type_d.h"
#include "libpq-fe.h"
#include "miscadmin.h"
#include "utils/guc.h"

/* What a delivery came to. */
#define DD_DELIVERED 0
#define DD_NO_CONNECTION 1
#define DD_REFUSED 2

static struct
{
	bool		loaded;
	PGconn	   *(*connectdb_params) (const char *const *, const char *const *, int);
	ConnStatusType (*status) (const PGconn *);
	char	   *(*error_message) (const PGconn *);
	void		(*finish) (PGconn *);
	PGresult   *(*exec_params) (PGconn *, const char *, int, const Oid *, const char *const *,
								const int *, const int *, int);
	ExecStatusType (*result_status) (const PGresult *);
	int			(*ntuples) (const PGresult *);
	char	   *(*getvalue) (const PGresult *, int, int);
	int			(*getisnull) (const PGresult *, int, int);
	char	   *(*error_field) (const PGresult *, int);
	void		(*clear) (PGresult *);
	char	   *(*escape_identifier) (PGconn *, const char *, size_t);
	void		(*freemem) (void *);
}			pq;

static void
copy_text(char *to, size_t size, const char *from)
{
	if (size > 0)
		strlcpy(to, from ? from : "", size);
}

/* Opens libpq once; false, with the reason in message, if it cannot. */
static bool
load_libpq(char *message, size_t message_size)
{
	char		libdir[MAXPGPATH];
	char		path[MAXPGPATH + 16];
	void	   *handle;

	if (pq.loaded)
		return true;
	get_lib_path(my_exec_path, libdir);
	snprintf(path, sizeof(path), "%s/libpq.so.5", libdir);
	handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (handle == NULL)
		handle = dlopen("libpq.so.5", RTLD_NOW | RTLD_LOCAL);
	if (handle == NULL)
	{
		copy_text(message, message_size, dlerror());
		return false;
	}
#define LOAD(field, symbol) \
	if ((*(void **) &pq.field = dlsym(handle, symbol)) == NULL) \
	{ \
		copy_text(message, message_size, "libpq lacks " symbol); \
		return false; \
	}
	LOAD(connectdb_params, "PQconnectdbParams");
	LOAD(status, "PQstatus");
	LOAD(error_message, "PQerrorMessage");
	LOAD(finish, "PQfinish");
	LOAD(exec_params, "PQexecParams");
	LOAD(result_status, "PQresultStatus");
	LOAD(ntuples, "PQntuples");
	LOAD(getvalue, "PQgetvalue");
	LOAD(getisnull, "PQgetisnull");
	LOAD(error_field, "PQresultErrorField");
	LOAD(clear, "PQclear");
	LOAD(escape_identifier, "PQescapeIdentifier");
	LOAD(freemem, "PQfreemem");
#undef LOAD
	pq.loaded = true;
	return true;
}

/* An error answer: DD_REFUSED with its SQLSTATE, or a broken connection. */
static int
failure(PGconn *conn, PGresult *result, char *sqlstate, char *message, size_t message_size)
{
	if (result != NULL && pq.error_field(result, PG_DIAG_SQLSTATE) != NULL)
	{
		copy_text(sqlstate, 6, pq.error_field(result, PG_DIAG_SQLSTATE));
		copy_text(message, message_size, pq.error_field(result, PG_DIAG_MESSAGE_PRIMARY));
		return DD_REFUSED;
	}
	copy_text(message, message_size, pq.error_message(conn));
	return DD_NO_CONNECTION;
}

/*
 * conninfo: a connection string, or NULL for this standby's
 * primary_conninfo in database "postgres" (its own settings win over the
 * defaults given here). old_timeline: the timeline the record was
 * written on, 0 if unknown. On DD_REFUSED, sqlstate (6 bytes) and message
 * say why; on DD_NO_CONNECTION, message does.
 */
int
dd_deliver_record(const char *conninfo, const char *record, int record_len, const char *sender,
				  int32 old_timeline, int64 *lost, char *sqlstate, char *message, size_t message_size)
{
	const char *keywords[12];
	const char *values[12];
	int			n = 0;
	PGconn	   *conn;
	PGresult   *result;
	char	   *schema;
	char		query[NAMEDATALEN * 2 + 128];
	char		timeline[16];
	int			outcome;
	Oid			types[3] = {BYTEAOID, TEXTOID, INT4OID};
	const char *params[3] = {record, sender, timeline};
	int			lengths[3] = {record_len, 0, 0};
	int			formats[3] = {1, 0, 0};

	*lost = -1;
	copy_text(sqlstate, 6, "");
	copy_text(message, message_size, "");
	if (!load_libpq(message, message_size))
		return DD_NO_CONNECTION;
	keywords[n] = "fallback_application_name";
	values[n++] = "delayed_durability record delivery";
	keywords[n] = "connect_timeout";
	values[n++] = "10";
	keywords[n] = "options";
	values[n++] = "-c statement_timeout=60s";
	keywords[n] = "keepalives_idle";
	values[n++] = "10";
	keywords[n] = "keepalives_interval";
	values[n++] = "5";
	keywords[n] = "keepalives_count";
	values[n++] = "3";
	/* Unacknowledged data (a large record to a peer gone mid-send). */
	keywords[n] = "tcp_user_timeout";
	values[n++] = "30000";
	keywords[n] = "dbname";
	if (conninfo != NULL)
		values[n++] = conninfo;
	else
	{
		const char *primary = GetConfigOption("primary_conninfo", true, false);

		if (primary == NULL || primary[0] == '\0')
		{
			copy_text(message, message_size, "primary_conninfo is empty");
			return DD_NO_CONNECTION;
		}
		values[n++] = primary;
		/* After the expanded string: the database is ours to choose. */
		keywords[n] = "dbname";
		values[n++] = "postgres";
	}
	keywords[n] = NULL;
	values[n] = NULL;

	conn = pq.connectdb_params(keywords, values, 1);
	if (conn == NULL || pq.status(conn) != CONNECTION_OK)
	{
		copy_text(message, message_size, conn ? pq.error_message(conn) : "out of memory");
		if (conn)
			pq.finish(conn);
		return DD_NO_CONNECTION;
	}

	/* The function where the extension is, whatever the search_path. */
	result = pq.exec_params(conn,
							"SELECT n.nspname FROM pg_catalog.pg_extension AS e JOIN pg_catalog.pg_namespace AS n"
							" ON n.oid = e.extnamespace WHERE e.extname = 'delayed_durability'",
							0, NULL, NULL, NULL, NULL, 0);
	if (pq.result_status(result) != PGRES_TUPLES_OK)
		outcome = failure(conn, result, sqlstate, message, message_size);
	else if (pq.ntuples(result) != 1)
	{
		/* As PostgreSQL would answer a call of a missing function. */
		copy_text(sqlstate, 6, "42883");
		copy_text(message, message_size, "the extension delayed_durability is not created in that database");
		outcome = DD_REFUSED;
	}
	else if ((schema = pq.escape_identifier(conn, pq.getvalue(result, 0, 0), strlen(pq.getvalue(result, 0, 0)))) == NULL)
		outcome = failure(conn, NULL, sqlstate, message, message_size);
	else
	{
		snprintf(query, sizeof(query), "SELECT %s.delayed_durability_receive_failover_record($1, $2, $3)", schema);
		pq.freemem(schema);
		pq.clear(result);
		if (old_timeline > 0)
			snprintf(timeline, sizeof(timeline), "%d", old_timeline);
		else
			params[2] = NULL;
		result = pq.exec_params(conn, query, 3, types, params, lengths, formats, 0);
		if (pq.result_status(result) == PGRES_TUPLES_OK && pq.ntuples(result) == 1 && !pq.getisnull(result, 0, 0))
		{
			*lost = strtoll(pq.getvalue(result, 0, 0), NULL, 10);
			outcome = DD_DELIVERED;
		}
		else
			outcome = failure(conn, result, sqlstate, message, message_size);
	}
	pq.clear(result);
	pq.finish(conn);
	return outcome;
}
