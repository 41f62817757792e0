-- The policy GUC: values, errors, privileges and where it can be set.
CREATE EXTENSION delayed_durability;
SELECT current_user AS superuser \gset

SHOW delayed_durability.mode;
SELECT name, setting, context, vartype, enumvals, boot_val
  FROM pg_settings WHERE name = 'delayed_durability.mode';

SET delayed_durability.mode = 'allowed';
SHOW delayed_durability.mode;
SET delayed_durability.mode = FORCED;
SHOW delayed_durability.mode;
RESET delayed_durability.mode;
SHOW delayed_durability.mode;

-- Invalid values list the valid ones.
SET delayed_durability.mode = 'on';
SET delayed_durability.mode = '';
SET delayed_durability.mode = 1;
-- The prefix is reserved: a misspelt setting is an error, not a placeholder.
SET delayed_durability.mdoe = 'forced';

-- A non-superuser cannot weaken durability.
CREATE ROLE dd_user LOGIN;
CREATE ROLE dd_owner LOGIN;
SET ROLE dd_user;
SET delayed_durability.mode = 'forced';
SET LOCAL delayed_durability.mode = 'forced';
SELECT set_config('delayed_durability.mode', 'forced', false);
SHOW delayed_durability.mode;
RESET ROLE;

-- ... unless a superuser grants it.
GRANT SET ON PARAMETER delayed_durability.mode TO dd_owner;
SET ROLE dd_owner;
SET delayed_durability.mode = 'forced';
SHOW delayed_durability.mode;
RESET delayed_durability.mode;
RESET ROLE;
REVOKE SET ON PARAMETER delayed_durability.mode FROM dd_owner;

-- Non-superusers cannot set it per database or per role either.
CREATE DATABASE dd_other OWNER dd_user;
SET ROLE dd_user;
ALTER DATABASE dd_other SET delayed_durability.mode = 'forced';
ALTER ROLE dd_user SET delayed_durability.mode = 'forced';
RESET ROLE;

-- ALTER DATABASE / ALTER ROLE SET take effect in new connections.
ALTER DATABASE dd_other SET delayed_durability.mode = 'forced';
\c dd_other :superuser
SHOW delayed_durability.mode;
\c regression :superuser
SHOW delayed_durability.mode;
ALTER ROLE dd_owner SET delayed_durability.mode = 'allowed';
\c regression dd_owner
SHOW delayed_durability.mode;
\c regression :superuser
ALTER ROLE dd_owner RESET delayed_durability.mode;
-- The role setting is more specific than the database setting.
ALTER ROLE dd_owner IN DATABASE dd_other SET delayed_durability.mode = 'disabled';
\c dd_other dd_owner
SHOW delayed_durability.mode;
\c regression :superuser

-- A SQL-level SET by a superuser inside a transaction is transaction-local.
BEGIN;
SET LOCAL delayed_durability.mode = 'forced';
SHOW delayed_durability.mode;
COMMIT;
SHOW delayed_durability.mode;

DROP DATABASE dd_other;
DROP ROLE dd_owner;
DROP ROLE dd_user;
