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
 * Asynchronous calls under WaitLatchOrSocket(): the worker gives a
 * delivery up as soon as it is asked to stop (shutdown) or this server
 * leaves recovery (promoted: noting the failover comes first), and never
 * waits longer than connect_timeout (10 s unless the connection string
 * says otherwise; 0 waits as long as the peer lives) to connect and 70 s
 * for an answer (statement_timeout is 60 s there). TCP keepalives and
 * tcp_user_timeout end a connection to a peer that went away.
 */
#include "postgres.h"

#include <dlfcn.h>

#include "catalog/pg_type_d.h"
#include "libpq-fe.h"
#include "miscadmin.h"
#include "storage/latch.h"
#include "utils/guc.h"
#include "utils/timestamp.h"
#include "utils/wait_event.h"

/* What a delivery came to. */
#define DD_DELIVERED 0
#define DD_NO_CONNECTION 1
#define DD_REFUSED 2
#define DD_ABANDONED 3

/* The longest wait for an answer (statement_timeout is 60 s there). */
#define DD_ANSWER_WAIT_MS 70000

/* Whether the worker must give the delivery up now. */
typedef bool (*dd_give_up_fn) (void);

static struct
{
	bool		loaded;
	PGconn	   *(*connect_start_params) (const char *const *, const char *const *, int);
	PostgresPollingStatusType (*connect_poll) (PGconn *);
	int			(*socket) (const PGconn *);
	PQconninfoOption *(*conninfo) (PGconn *);
	void		(*conninfo_free) (PQconninfoOption *);
	int			(*set_nonblocking) (PGconn *, int);
	int			(*send_query_params) (PGconn *, const char *, int, const Oid *, const char *const *,
									  const int *, const int *, int);
	int			(*flush) (PGconn *);
	int			(*consume_input) (PGconn *);
	int			(*is_busy) (PGconn *);
	PGresult   *(*get_result) (PGconn *);
	ConnStatusType (*status) (const PGconn *);
	char	   *(*error_message) (const PGconn *);
	void		(*finish) (PGconn *);
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
	LOAD(connect_start_params, "PQconnectStartParams");
	LOAD(connect_poll, "PQconnectPoll");
	LOAD(socket, "PQsocket");
	LOAD(conninfo, "PQconninfo");
	LOAD(conninfo_free, "PQconninfoFree");
	LOAD(set_nonblocking, "PQsetnonblocking");
	LOAD(send_query_params, "PQsendQueryParams");
	LOAD(flush, "PQflush");
	LOAD(consume_input, "PQconsumeInput");
	LOAD(is_busy, "PQisBusy");
	LOAD(get_result, "PQgetResult");
	LOAD(status, "PQstatus");
	LOAD(error_message, "PQerrorMessage");
	LOAD(finish, "PQfinish");
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

/*
 * Waits until the connection's socket is ready for events (WL_SOCKET_*).
 * DD_DELIVERED when it is; DD_ABANDONED when give_up() says so;
 * DD_NO_CONNECTION past deadline (0: none), with the reason in message.
 * Wakes every second to ask give_up(): a promotion sets no latch here.
 */
static int
wait_for_socket(PGconn *conn, int events, TimestampTz deadline, dd_give_up_fn give_up,
				char *message, size_t message_size)
{
	for (;;)
	{
		long		timeout = 1000;
		int			rc;

		if (give_up())
			return DD_ABANDONED;
		if (deadline != 0)
		{
			long		left = TimestampDifferenceMilliseconds(GetCurrentTimestamp(), deadline);

			if (left <= 0)
			{
				copy_text(message, message_size, "timed out");
				return DD_NO_CONNECTION;
			}
			timeout = Min(timeout, left);
		}
		rc = WaitLatchOrSocket(MyLatch, WL_LATCH_SET | WL_TIMEOUT | WL_EXIT_ON_PM_DEATH | events,
							   pq.socket(conn), timeout, PG_WAIT_EXTENSION);
		/*
		 * A signal's flag stays set for the worker's loop; interrupts (a
		 * barrier the startup process waits for) are served meanwhile.
		 */
		if (rc & WL_LATCH_SET)
		{
			ResetLatch(MyLatch);
			CHECK_FOR_INTERRUPTS();
		}
		if (rc & events)
			return DD_DELIVERED;
	}
}

/* The connection's connect_timeout in seconds (0: none). */
static int
connect_timeout_of(PGconn *conn)
{
	PQconninfoOption *options = pq.conninfo(conn);
	int			seconds = 0;

	for (PQconninfoOption *o = options; o != NULL && o->keyword != NULL; o++)
		if (strcmp(o->keyword, "connect_timeout") == 0 && o->val != NULL)
			seconds = Max(atoi(o->val), 0);
	if (options != NULL)
		pq.conninfo_free(options);
	return seconds;
}

/* Connects without blocking: DD_DELIVERED once connected, else as wait_for_socket(). */
static int
connect_async(PGconn *conn, dd_give_up_fn give_up, char *message, size_t message_size)
{
	int			seconds = connect_timeout_of(conn);
	TimestampTz deadline = seconds > 0 ? TimestampTzPlusMilliseconds(GetCurrentTimestamp(), (int64) seconds * 1000) : 0;
	/* As libpq says: begin as if PQconnectPoll() had asked to write. */
	PostgresPollingStatusType polled = PGRES_POLLING_WRITING;

	for (;;)
	{
		int			waited;

		if (polled == PGRES_POLLING_OK)
			return DD_DELIVERED;
		if (polled == PGRES_POLLING_FAILED)
		{
			copy_text(message, message_size, pq.error_message(conn));
			return DD_NO_CONNECTION;
		}
		waited = wait_for_socket(conn, polled == PGRES_POLLING_READING ? WL_SOCKET_READABLE : WL_SOCKET_WRITEABLE,
								 deadline, give_up, message, message_size);
		if (waited != DD_DELIVERED)
			return waited;
		polled = pq.connect_poll(conn);
	}
}

/*
 * Sends a query and collects its last result without blocking. NULL with
 * *outcome DD_ABANDONED or DD_NO_CONNECTION (reason in message) when it
 * was given up or the connection failed; else the result (maybe an error
 * answer), *outcome DD_DELIVERED.
 */
static PGresult *
query_async(PGconn *conn, const char *query, int nparams, const Oid *types, const char *const *params,
			const int *lengths, const int *formats, dd_give_up_fn give_up, int *outcome,
			char *message, size_t message_size)
{
	TimestampTz deadline = TimestampTzPlusMilliseconds(GetCurrentTimestamp(), DD_ANSWER_WAIT_MS);
	PGresult   *last = NULL;
	PGresult   *next;
	int			flushed;

	*outcome = DD_NO_CONNECTION;
	if (!pq.send_query_params(conn, query, nparams, types, params, lengths, formats, 0))
	{
		copy_text(message, message_size, pq.error_message(conn));
		return NULL;
	}
	/* A large record leaves in pieces: read what comes meanwhile too. */
	while ((flushed = pq.flush(conn)) != 0)
	{
		if (flushed < 0)
		{
			copy_text(message, message_size, pq.error_message(conn));
			return NULL;
		}
		*outcome = wait_for_socket(conn, WL_SOCKET_READABLE | WL_SOCKET_WRITEABLE, deadline, give_up,
								   message, message_size);
		if (*outcome != DD_DELIVERED)
			return NULL;
		if (!pq.consume_input(conn))
		{
			*outcome = DD_NO_CONNECTION;
			copy_text(message, message_size, pq.error_message(conn));
			return NULL;
		}
	}
	for (;;)
	{
		while (pq.is_busy(conn))
		{
			*outcome = wait_for_socket(conn, WL_SOCKET_READABLE, deadline, give_up, message, message_size);
			if (*outcome == DD_DELIVERED && !pq.consume_input(conn))
			{
				*outcome = DD_NO_CONNECTION;
				copy_text(message, message_size, pq.error_message(conn));
			}
			if (*outcome != DD_DELIVERED)
			{
				if (last != NULL)
					pq.clear(last);
				return NULL;
			}
		}
		if ((next = pq.get_result(conn)) == NULL)
			break;
		if (last != NULL)
			pq.clear(last);
		last = next;
	}
	*outcome = DD_DELIVERED;
	if (last == NULL)
	{
		*outcome = DD_NO_CONNECTION;
		copy_text(message, message_size, pq.error_message(conn));
	}
	return last;
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
 * written on, 0 if unknown. give_up: asked at least every second while
 * waiting. On DD_REFUSED, sqlstate (6 bytes) and message say why; on
 * DD_NO_CONNECTION, message does; DD_ABANDONED when give_up() said so.
 */
int
dd_deliver_record(const char *conninfo, const char *record, int record_len, const char *sender,
				  int32 old_timeline, dd_give_up_fn give_up, int64 *lost, char *sqlstate, char *message,
				  size_t message_size)
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

	conn = pq.connect_start_params(keywords, values, 1);
	if (conn == NULL)
	{
		copy_text(message, message_size, "out of memory");
		return DD_NO_CONNECTION;
	}
	if (pq.status(conn) == CONNECTION_BAD)
	{
		copy_text(message, message_size, pq.error_message(conn));
		outcome = DD_NO_CONNECTION;
	}
	else
		outcome = connect_async(conn, give_up, message, message_size);
	if (outcome == DD_DELIVERED && pq.set_nonblocking(conn, 1) != 0)
	{
		copy_text(message, message_size, pq.error_message(conn));
		outcome = DD_NO_CONNECTION;
	}
	if (outcome != DD_DELIVERED)
	{
		pq.finish(conn);
		return outcome;
	}

	/* The function where the extension is, whatever the search_path. */
	result = query_async(conn,
						 "SELECT n.nspname FROM pg_catalog.pg_extension AS e JOIN pg_catalog.pg_namespace AS n"
						 " ON n.oid = e.extnamespace WHERE e.extname = 'delayed_durability'",
						 0, NULL, NULL, NULL, NULL, give_up, &outcome, message, message_size);
	if (result == NULL)
		;						/* outcome and message say why */
	else if (pq.result_status(result) != PGRES_TUPLES_OK)
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
		result = query_async(conn, query, 3, types, params, lengths, formats, give_up, &outcome,
							 message, message_size);
		if (result == NULL)
			;					/* outcome and message say why */
		else if (pq.result_status(result) == PGRES_TUPLES_OK && pq.ntuples(result) == 1 && !pq.getisnull(result, 0, 0))
		{
			*lost = strtoll(pq.getvalue(result, 0, 0), NULL, 10);
			outcome = DD_DELIVERED;
		}
		else
			outcome = failure(conn, result, sqlstate, message, message_size);
	}
	if (result != NULL)
		pq.clear(result);
	pq.finish(conn);
	return outcome;
}
