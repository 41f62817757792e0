//! The policy GUC `delayed_durability.mode`.

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting, PostgresGucEnum};

/// SQL Server's database option DELAYED_DURABILITY, as a GUC.
#[derive(PostgresGucEnum, Clone, Copy, PartialEq, Eq, Debug)]
pub enum Mode {
    /// Every commit is durable, even when the transaction asks otherwise.
    #[name = c"disabled"]
    Disabled,
    /// A transaction may opt in with commit_delayed() or synchronous_commit = off.
    #[name = c"allowed"]
    Allowed,
    /// Every commit is delayed (unless PostgreSQL itself forces it durable).
    #[name = c"forced"]
    Forced,
}

pub static MODE: GucSetting<Mode> = GucSetting::<Mode>::new(Mode::Disabled);

pub fn define() {
    // SAFETY: the assign hook raises nothing (it stores an integer).
    unsafe {
        GucRegistry::define_enum_guc_with_hooks(
            c"delayed_durability.mode",
            c"Delayed durability policy: disabled, allowed or forced.",
            c"disabled makes every commit durable (synchronous_commit = off is raised to on); \
allowed lets a transaction opt in with commit_delayed() or synchronous_commit = off; \
forced delays every commit that PostgreSQL does not itself force durable.",
            &MODE,
            // Superuser-only: a non-superuser must not be able to weaken durability.
            GucContext::Suset,
            GucFlags::default(),
            None,
            Some(crate::settings::assign_mode),
            None,
        );
    }
}

/// Called after every GUC of the extension is defined: settings of this
/// prefix that match no GUC become errors, and placeholders are removed.
pub fn reserve_prefix() {
    // SAFETY: called once from _PG_init in the postmaster, with a static C string.
    unsafe {
        #[cfg(not(any(feature = "pg13", feature = "pg14")))]
        pgrx::pg_sys::MarkGUCPrefixReserved(c"delayed_durability".as_ptr());
        #[cfg(any(feature = "pg13", feature = "pg14"))]
        pgrx::pg_sys::EmitWarningsOnPlaceholders(c"delayed_durability".as_ptr());
    }
}

/// Read on every commit: straight from the variable PostgreSQL's GUC
/// machinery assigns, without GucSetting::get()'s per-call thread check
/// (a thread-local lookup that costs more than the read).
pub fn mode() -> Mode {
    read(&MODE)
}

/// The current value of one of the extension's GUCs, for per-commit paths.
pub fn read<T: pgrx::guc::GucValue>(setting: &GucSetting<T>) -> T {
    // SAFETY: the GUC variable is backend-local and only ever accessed from
    // the backend's one thread; PostgreSQL keeps it a valid value.
    unsafe { T::from_raw(*setting.as_ptr()) }
}
