//! Durability classes per table: `durable` tables make every commit that
//! modified them durable, `delayed` tables make a commit that modified only
//! them (and temporary or unlogged tables) delayed. The classes live in the
//! extension's configuration table; each backend keeps them in a hash map
//! from relation to class, built on the first commit that needs it and
//! again after an invalidation (a relcache invalidation of pg_description,
//! sent when the configuration table changes; of the configuration table,
//! when it is dropped; of a classified partitioned table, when it gains or
//! loses a partition; or of everything). What the transaction modified comes from
//! PostgreSQL's per-transaction table statistics (src/c/table_class.c), so a
//! commit costs a walk of the tables it wrote and a lookup for each. A
//! transaction that changed classes also bumps a generation number in
//! shared memory when it commits; every commit compares it (one atomic
//! load), so that a change applies even to transactions already open.

use pgrx::pg_sys;
use pgrx::prelude::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Class {
    Durable,
    Delayed,
}

#[derive(Clone, Copy)]
struct Entry {
    class: Class,
    /// A partitioned table: its invalidation (a partition created, attached
    /// or detached) means reading the classes again.
    partitioned: bool,
    /// A durable table whose access method is not heap.
    uncounted: bool,
}

/// Relation OIDs are small integers: one multiply spreads them well.
#[derive(Default)]
struct OidHasher(u64);
impl Hasher for OidHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 << 8 | *b as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = (n as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }
}
type ClassMap = HashMap<u32, Entry, BuildHasherDefault<OidHasher>>;

/// Bumped by every transaction that changed classes, once it committed: a
/// commit compares it with the value its backend last saw, one atomic load,
/// so that a class change applies at once to every later commit, including
/// that of a transaction already open (invalidations reach a backend only
/// when it takes a lock or starts a transaction).
#[repr(C, align(128))]
struct SharedGeneration {
    generation: AtomicU64,
}

struct Cache {
    /// The map reflects the configuration table (no invalidation since).
    valid: Cell<bool>,
    shared: Cell<*const SharedGeneration>,
    /// The shared generation the map was read at.
    seen_shared_generation: Cell<u64>,
    /// This transaction wrote the configuration table.
    changed_in_transaction: Cell<bool>,
    /// Bumped by every invalidation that concerns the map.
    generation: Cell<u64>,
    config_relid: Cell<pg_sys::Oid>,
    classes: RefCell<ClassMap>,
    /// Some table has class durable.
    any_durable: Cell<bool>,
    /// Some durable table's access method is not heap: what a transaction
    /// wrote there is not counted, so every commit that writes is durable.
    any_uncounted_durable: Cell<bool>,
    /// Durable tables invalidated since the map was read: their access
    /// method is checked again at the next commit (ALTER TABLE SET ACCESS
    /// METHOD), without reading every class again (VACUUM and ANALYZE
    /// invalidate them too).
    recheck: RefCell<Vec<u32>>,
    /// load() is running: any relcache invalidation then means reading
    /// again (the old map cannot tell whether it concerns the new one).
    loading: Cell<bool>,
    /// Read in the current transaction (possibly with its own uncommitted
    /// changes: an abort after pre-commit must not keep them).
    loaded_in_transaction: Cell<bool>,
    /// An invalidation of the marker relation (or of everything) arrived
    /// since this was last cleared (see commit_prepared_completed).
    marker_seen: Cell<bool>,
    /// delayed_durability_set_table_class() is writing the configuration
    /// table (its guard trigger lets that write through).
    setting_class: Cell<bool>,
}
// SAFETY: a PostgreSQL backend runs this code on one thread only.
unsafe impl Sync for Cache {}
static CACHE: Cache = Cache {
    valid: Cell::new(false),
    shared: Cell::new(std::ptr::null()),
    seen_shared_generation: Cell::new(0),
    changed_in_transaction: Cell::new(false),
    generation: Cell::new(0),
    config_relid: Cell::new(pg_sys::InvalidOid),
    classes: RefCell::new(HashMap::with_hasher(BuildHasherDefault::new())),
    any_durable: Cell::new(false),
    any_uncounted_durable: Cell::new(false),
    recheck: RefCell::new(Vec::new()),
    loading: Cell::new(false),
    loaded_in_transaction: Cell::new(false),
    marker_seen: Cell::new(false),
    setting_class: Cell::new(false),
};

// Called through pg_guard_ffi_boundary where they can raise an error.
unsafe extern "C-unwind" {
    fn dd_xact_modified_relations(out: *mut pg_sys::Oid, max: std::ffi::c_int) -> std::ffi::c_int;
    fn dd_relation_ignorable(relid: pg_sys::Oid) -> bool;
    fn dd_relation_is_heap(relid: pg_sys::Oid) -> bool;
    fn dd_warn_uncounted(relid: pg_sys::Oid);
    fn dd_table_class_config_relid() -> pg_sys::Oid;
    fn dd_table_class_load(
        config_relid: pg_sys::Oid,
        relids: *mut *mut pg_sys::Oid,
        codes: *mut *mut std::ffi::c_char,
        context: *mut pg_sys::MemoryContext,
    ) -> std::ffi::c_int;
    fn dd_table_class_set(config_relid: pg_sys::Oid, relid: pg_sys::Oid, class: *const std::ffi::c_char);
}

pub fn request_shared_memory() {
    // SAFETY: called from the shared-memory request hook (shmem.rs).
    unsafe { pg_sys::RequestAddinShmemSpace(std::mem::size_of::<SharedGeneration>()) };
}

pub fn attach_shared_memory() {
    let ptr = crate::shmem::init_struct(c"delayed_durability table classes", std::mem::size_of::<SharedGeneration>());
    CACHE.shared.set(ptr as *const SharedGeneration);
}

fn shared_generation() -> u64 {
    let ptr = CACHE.shared.get();
    // SAFETY: zeroed at startup, valid for the server's life; atomic.
    if ptr.is_null() {
        0
    } else {
        unsafe { (*ptr).generation.load(Ordering::Acquire) }
    }
}

pub fn register_callbacks() {
    // SAFETY: called once from _PG_init in the postmaster; backends inherit it.
    unsafe { pg_sys::CacheRegisterRelcacheCallback(Some(relation_changed), pg_sys::Datum::from(0)) };
}

/// The relation whose relcache invalidation says "the classes changed": a
/// catalog every database has, that no syscache reads (so invalidating it
/// does not discard the relcache init files) and that rarely changes itself.
/// pg_description (DescriptionRelationId, 2609 in every version).
const MARKER_RELATION: pg_sys::Oid = pg_sys::Oid::from_u32(2609);

/// Relcache invalidation: marks the map stale when it concerns it. Raises
/// nothing (it runs wherever invalidations are processed).
unsafe extern "C-unwind" fn relation_changed(_arg: pg_sys::Datum, relid: pg_sys::Oid) {
    if relid == MARKER_RELATION || relid == pg_sys::InvalidOid {
        CACHE.marker_seen.set(true);
    }
    // None: the map is being replaced (then anything concerns it).
    let entry = CACHE.classes.try_borrow().ok().map(|map| map.get(&u32::from(relid)).copied());
    let concerns_map = CACHE.loading.get()
        || relid == pg_sys::InvalidOid
        || relid == MARKER_RELATION
        || relid == CACHE.config_relid.get()
        // A partitioned table gaining or losing a partition.
        || entry.map_or(true, |e| e.is_some_and(|e| e.partitioned));
    if !concerns_map && matches!(entry, Some(Some(e)) if e.class == Class::Durable) {
        // A durable table whose access method may have changed.
        match CACHE.recheck.try_borrow_mut() {
            Ok(mut queue) if queue.len() < 1024 => queue.push(u32::from(relid)),
            _ => {
                CACHE.valid.set(false);
                CACHE.generation.set(CACHE.generation.get() + 1);
            }
        }
    }
    if concerns_map {
        CACHE.valid.set(false);
        CACHE.generation.set(CACHE.generation.get() + 1);
    }
}

/// Rebuilds the map from the configuration table. False when it could not
/// be read now (locked): the commit is then made durable.
fn load() -> bool {
    CACHE.loading.set(true);
    let loaded = read_classes();
    CACHE.loading.set(false);
    loaded
}

fn read_classes() -> bool {
    let generation = CACHE.generation.get();
    let mut map = ClassMap::default();
    // SAFETY: catalog reads inside the committing transaction; an error
    // becomes a Rust panic here and is raised again by the caller's guard.
    let config = unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| dd_table_class_config_relid()) };
    if config != pg_sys::InvalidOid {
        let mut relids: *mut pg_sys::Oid = std::ptr::null_mut();
        let mut codes: *mut std::ffi::c_char = std::ptr::null_mut();
        let mut context: pg_sys::MemoryContext = std::ptr::null_mut();
        // SAFETY: as above; the arrays, `n` entries long, live in `context`.
        let n = unsafe {
            pg_sys::ffi::pg_guard_ffi_boundary(|| dd_table_class_load(config, &mut relids, &mut codes, &mut context))
        };
        if n == -2 {
            return false;
        }
        if n > 0 {
            // SAFETY: the C function returned n valid entries in each array.
            let (relids, codes) = unsafe {
                (std::slice::from_raw_parts(relids, n as usize), std::slice::from_raw_parts(codes, n as usize))
            };
            // A later pair overrides an earlier one (nearer partition ancestor).
            for (relid, code) in relids.iter().zip(codes) {
                let code = *code as u8;
                let class = if code.is_ascii_uppercase() { Class::Durable } else { Class::Delayed };
                map.insert(
                    u32::from(*relid),
                    Entry { class, partitioned: code.eq_ignore_ascii_case(&b'p'), uncounted: code == b'U' },
                );
            }
        }
        if !context.is_null() {
            // SAFETY: the context the C function made; nothing points into it any more.
            unsafe { pg_sys::MemoryContextDelete(context) };
        }
    }
    CACHE.any_durable.set(map.values().any(|e| e.class == Class::Durable));
    let uncounted = map.iter().find(|(_, e)| e.uncounted).map(|(relid, _)| *relid);
    // Said each time it becomes true in this session.
    if let (Some(relid), false) = (uncounted, CACHE.any_uncounted_durable.get()) {
        // SAFETY: syscache lookups and a WARNING; guarded.
        unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| dd_warn_uncounted(pg_sys::Oid::from(relid))) };
    }
    CACHE.any_uncounted_durable.set(uncounted.is_some());
    CACHE.recheck.borrow_mut().clear();
    CACHE.config_relid.set(config);
    *CACHE.classes.borrow_mut() = map;
    CACHE.loaded_in_transaction.set(true);
    // An invalidation that arrived while reading means another read next time.
    CACHE.valid.set(CACHE.generation.get() == generation);
    true
}

/// At the end of every transaction: a map read with this transaction's own
/// uncommitted changes is not kept when the transaction aborts; a committed
/// change of the classes is announced to every backend.
pub fn at_transaction_end(committed: bool) {
    // An error while reading left it set.
    CACHE.loading.set(false);
    if CACHE.loaded_in_transaction.replace(false) && !committed {
        CACHE.valid.set(false);
    }
    if CACHE.changed_in_transaction.replace(false) && committed {
        let ptr = CACHE.shared.get();
        if !ptr.is_null() {
            // SAFETY: as in shared_generation(). The commit is visible by
            // now (XACT_EVENT_COMMIT comes after ProcArrayEndTransaction).
            unsafe { (*ptr).generation.fetch_add(1, Ordering::Release) };
        }
    }
}

/// What the committing transaction modified, as far as classes go.
#[derive(Clone, Copy, Default)]
pub struct Modified {
    /// It modified a table of class `durable`, or it cannot be known whether
    /// it did (the commit is then durable: the safe side).
    pub durable: bool,
    /// It modified a table of class `delayed` and otherwise only tables of
    /// class `delayed`, temporary, unlogged or TOAST ones.
    pub only_delayed: bool,
}

const UNKNOWN: Modified = Modified { durable: true, only_delayed: false };

/// After a COMMIT PREPARED completed: the prepared transaction's
/// invalidations are in the shared queue, but its backend's flag went with
/// PREPARE. Reading the queue now tells whether they include the marker
/// relation's, i.e. whether the prepared transaction changed classes; only
/// then is the generation bumped at this commit (a 2PC workload that
/// changes no class makes no backend read the classes again).
pub fn commit_prepared_completed() {
    CACHE.marker_seen.set(false);
    // SAFETY: what any lock acquisition does; pgrx guards pg_sys calls.
    unsafe { pg_sys::AcceptInvalidationMessages() };
    if CACHE.marker_seen.get() {
        CACHE.changed_in_transaction.set(true);
    }
}

/// At pre-commit of a transaction that has an xid.
pub fn modified() -> Modified {
    // A class set by a transaction that committed while this one ran
    // applies to this commit.
    let generation = shared_generation();
    if generation != CACHE.seen_shared_generation.get() {
        CACHE.seen_shared_generation.set(generation);
        CACHE.valid.set(false);
    }
    if CACHE.valid.get() && !CACHE.recheck.borrow().is_empty() {
        let queue = std::mem::take(&mut *CACHE.recheck.borrow_mut());
        let map = CACHE.classes.borrow();
        // SAFETY: syscache lookups; guarded.
        let changed = queue.iter().any(|relid| {
            map.get(relid).is_some_and(|e| {
                e.uncounted == unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| dd_relation_is_heap(pg_sys::Oid::from(*relid))) }
            })
        });
        if changed {
            CACHE.valid.set(false);
        }
    }
    if !CACHE.valid.get() {
        // Reading again: take the invalidations sent meanwhile first (a
        // partition created since this transaction last took a lock).
        // SAFETY: what a lock acquisition does; pgrx guards pg_sys calls.
        unsafe { pg_sys::AcceptInvalidationMessages() };
        if !load() {
            return UNKNOWN;
        }
    }
    if CACHE.classes.borrow().is_empty() {
        return Modified::default();
    }
    let mut buffer = [pg_sys::InvalidOid; 16];
    let mut relids: Vec<pg_sys::Oid> = Vec::new();
    // SAFETY: reads this backend's transaction statistics; the top level is
    // made (palloc) when missing, so the call is guarded.
    let n = unsafe {
        pg_sys::ffi::pg_guard_ffi_boundary(|| dd_xact_modified_relations(buffer.as_mut_ptr(), buffer.len() as i32))
    };
    if n < 0 {
        // Not counted (track_counts = off): durable if any table could be
        // durable, and never delayed by the class.
        return Modified { durable: CACHE.any_durable.get(), only_delayed: false };
    }
    if CACHE.any_uncounted_durable.get() {
        // A durable table whose writes are not counted: any commit may
        // have written it.
        return UNKNOWN;
    }
    let written: &[pg_sys::Oid] = if n as usize <= buffer.len() {
        &buffer[..n as usize]
    } else {
        relids.resize(n as usize, pg_sys::InvalidOid);
        // SAFETY: as above, with room for all n.
        unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| dd_xact_modified_relations(relids.as_mut_ptr(), n)) };
        &relids
    };
    let mut result = Modified::default();
    let mut unclassified = Vec::new();
    {
        let map = CACHE.classes.borrow();
        for relid in written {
            match map.get(&u32::from(*relid)).map(|e| e.class) {
                Some(Class::Durable) => result.durable = true,
                Some(Class::Delayed) => result.only_delayed = true,
                None => unclassified.push(*relid),
            }
        }
    }
    if result.durable {
        result.only_delayed = false;
    } else if result.only_delayed {
        // SAFETY: syscache lookups; guarded.
        result.only_delayed = unclassified
            .iter()
            .all(|relid| unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| dd_relation_ignorable(*relid)) });
    }
    result
}

/// Sets the durability class of a table (`durable`, `delayed`, or NULL to
/// clear it). Only the table's owner, a member of the owning role or a
/// superuser may.
#[pg_extern(
    volatile,
    parallel_unsafe,
    sql = r#"
CREATE FUNCTION delayed_durability_set_table_class(tbl regclass, class text) RETURNS void
VOLATILE PARALLEL UNSAFE LANGUAGE c
AS 'MODULE_PATHNAME', '@FUNCTION_NAME@';
"#
)]
fn delayed_durability_set_table_class(tbl: Option<pg_sys::Oid>, class: Option<&str>) {
    let Some(relid) = tbl else {
        ereport!(PgLogLevel::ERROR, PgSqlErrorCode::ERRCODE_NULL_VALUE_NOT_ALLOWED, "the table must not be NULL");
        unreachable!()
    };
    // Without the preload no class is enforced: setting one would be a
    // promise nothing keeps. Clearing one stays possible.
    if class.is_some() {
        crate::preload::require_preloaded();
    }
    let class: Option<&std::ffi::CStr> = match class {
        None => None,
        Some(name) if name.eq_ignore_ascii_case("durable") => Some(c"durable"),
        Some(name) if name.eq_ignore_ascii_case("delayed") => Some(c"delayed"),
        Some(name) => {
            pg_sys::panic::ErrorReport::new(
                PgSqlErrorCode::ERRCODE_INVALID_PARAMETER_VALUE,
                format!("invalid durability class \"{name}\""),
                function_name!(),
            )
            .set_hint("The class is 'durable', 'delayed', or NULL to clear it.")
            .report(PgLogLevel::ERROR);
            unreachable!()
        }
    };
    // SAFETY: catalog read; guarded.
    let config = unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| dd_table_class_config_relid()) };
    if config == pg_sys::InvalidOid {
        pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE,
            "the installed version of delayed_durability has no table classes",
            function_name!(),
        )
        .set_hint("Run ALTER EXTENSION delayed_durability UPDATE.")
        .report(PgLogLevel::ERROR);
    }
    let class_ptr = class.map_or(std::ptr::null(), |c| c.as_ptr());
    // Lets this write through the configuration table's guard trigger,
    // only for its duration: an error unwinds through the guard, which
    // clears it, so a caught error leaves no opening behind.
    struct Writing;
    impl Drop for Writing {
        fn drop(&mut self) {
            CACHE.setting_class.set(false);
        }
    }
    let _writing = Writing;
    CACHE.setting_class.set(true);
    // SAFETY: checks and SPI in C; errors are raised through the guard.
    unsafe { pg_sys::ffi::pg_guard_ffi_boundary(|| dd_table_class_set(config, relid, class_ptr)) };
}

/// The configuration table's guard: rows change only through
/// delayed_durability_set_table_class(), whatever the grants (a routine
/// `GRANT ALL ON ALL TABLES IN SCHEMA public` would otherwise let any role
/// clear a durable class). Superusers pass (pg_restore loads the rows, the
/// event trigger forgets dropped tables as the extension's owner); the
/// trigger is an ordinary one, so a logical replication apply worker
/// (session_replication_role = replica) passes too.
#[pg_trigger]
fn delayed_durability_table_class_config_guard<'a>(
    trigger: &'a pgrx::PgTrigger<'a>,
) -> Result<Option<PgHeapTuple<'a, pgrx::AllocatedByPostgres>>, pgrx::PgTriggerError> {
    // SAFETY: reads the current user's superuser flag (a syscache lookup, guarded).
    if !CACHE.setting_class.get() && !unsafe { pg_sys::superuser() } {
        pg_sys::panic::ErrorReport::new(
            PgSqlErrorCode::ERRCODE_INSUFFICIENT_PRIVILEGE,
            "permission denied for table delayed_durability_table_class_config",
            function_name!(),
        )
        .set_detail("Durability classes change only through delayed_durability_set_table_class().")
        .set_hint("Call delayed_durability_set_table_class(table, class) as the table's owner.")
        .report(PgLogLevel::ERROR);
    }
    Ok(match trigger.op()? {
        pgrx::PgTriggerOperation::Delete => trigger.old(),
        pgrx::PgTriggerOperation::Truncate => None,
        _ => trigger.new(),
    })
}

/// Called by the configuration table's triggers: every backend reads the
/// classes again once this transaction commits (this one at its next
/// command).
#[pg_extern(volatile, parallel_unsafe)]
fn delayed_durability_table_classes_changed() {
    // A class is a durability promise: its change must survive a crash
    // (and reach a synchronous standby) whatever the policy of the commit
    // that makes it, or a durable table could silently become unclassified.
    crate::commit_requests::require_durable_commit();
    // Announced at commit (at_transaction_end).
    CACHE.changed_in_transaction.set(true);
    // Also a transactional invalidation of the marker relation's relcache
    // entry, which relation_changed() listens for: sent by COMMIT PREPARED
    // too, whichever backend runs it.
    // SAFETY: queues an invalidation; raises nothing but out-of-memory.
    unsafe { pg_sys::CacheInvalidateRelcacheByRelid(MARKER_RELATION) };
}

// The configuration table (kept by pg_dump), the view, the triggers that
// send the invalidation and forget dropped tables.
pgrx::extension_sql!(
    r#"
CREATE TABLE delayed_durability_table_class_config (
    relid regclass PRIMARY KEY,
    class text NOT NULL CHECK (class IN ('durable', 'delayed'))
);
-- Rows naming a dropped table (a DROP the event trigger did not see) are
-- not dumped: restored, their OID could name another table.
SELECT pg_catalog.pg_extension_config_dump('delayed_durability_table_class_config',
    'WHERE relid::oid IN (SELECT oid FROM pg_catalog.pg_class)');
REVOKE ALL ON delayed_durability_table_class_config FROM PUBLIC;
REVOKE ALL ON FUNCTION delayed_durability_table_classes_changed() FROM PUBLIC;

CREATE FUNCTION delayed_durability_table_class_config_changed() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM @extschema@.delayed_durability_table_classes_changed();
    RETURN NULL;
END $$;
REVOKE ALL ON FUNCTION delayed_durability_table_class_config_changed() FROM PUBLIC;
-- Row triggers, as logical replication's apply fires no statement trigger
-- for INSERT, UPDATE and DELETE; TRUNCATE has only a statement trigger.
-- Enabled always: also when rows arrive by logical replication or with
-- session_replication_role = replica.
CREATE TRIGGER delayed_durability_table_class_config_changed
    AFTER INSERT OR UPDATE OR DELETE ON delayed_durability_table_class_config
    FOR EACH ROW EXECUTE FUNCTION delayed_durability_table_class_config_changed();
CREATE TRIGGER delayed_durability_table_class_config_truncated
    AFTER TRUNCATE ON delayed_durability_table_class_config
    FOR EACH STATEMENT EXECUTE FUNCTION delayed_durability_table_class_config_changed();
ALTER TABLE delayed_durability_table_class_config
    ENABLE ALWAYS TRIGGER delayed_durability_table_class_config_changed,
    ENABLE ALWAYS TRIGGER delayed_durability_table_class_config_truncated;

CREATE FUNCTION delayed_durability_forget_dropped_tables() RETURNS event_trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    -- Only when a classified table was dropped: a change of the classes
    -- makes every session read them again.
    IF EXISTS (SELECT FROM @extschema@.delayed_durability_table_class_config
                WHERE relid::oid IN (SELECT objid FROM pg_event_trigger_dropped_objects()
                                      WHERE classid = 'pg_class'::regclass AND objsubid = 0)) THEN
        DELETE FROM @extschema@.delayed_durability_table_class_config
         WHERE relid::oid IN (SELECT objid FROM pg_event_trigger_dropped_objects()
                               WHERE classid = 'pg_class'::regclass AND objsubid = 0);
    END IF;
END $$;
REVOKE ALL ON FUNCTION delayed_durability_forget_dropped_tables() FROM PUBLIC;
CREATE EVENT TRIGGER delayed_durability_forget_dropped_tables ON sql_drop
    EXECUTE FUNCTION delayed_durability_forget_dropped_tables();
ALTER EVENT TRIGGER delayed_durability_forget_dropped_tables ENABLE ALWAYS;

CREATE VIEW delayed_durability_table_classes AS
    SELECT n.nspname AS schema, c.relname AS "table", t.class
      FROM delayed_durability_table_class_config AS t
      JOIN pg_catalog.pg_class AS c ON c.oid = t.relid
      JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace;
GRANT SELECT ON delayed_durability_table_classes TO PUBLIC;
"#,
    name = "table_classes",
    requires = [delayed_durability_table_classes_changed],
);

pgrx::extension_sql!(
    r#"
REVOKE ALL ON FUNCTION delayed_durability_table_class_config_guard() FROM PUBLIC;
-- Ordinary triggers (not ALWAYS): a logical replication apply worker
-- writes replicated classes past them.
CREATE TRIGGER delayed_durability_table_class_config_guard
    BEFORE INSERT OR UPDATE OR DELETE ON delayed_durability_table_class_config
    FOR EACH ROW EXECUTE FUNCTION delayed_durability_table_class_config_guard();
CREATE TRIGGER delayed_durability_table_class_config_guard_truncate
    BEFORE TRUNCATE ON delayed_durability_table_class_config
    FOR EACH STATEMENT EXECUTE FUNCTION delayed_durability_table_class_config_guard();
"#,
    name = "table_class_guard",
    requires = ["table_classes", delayed_durability_table_class_config_guard],
);
