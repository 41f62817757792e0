-- 0.2.0 -> 0.3.0: cached_currval() and cached_lastval(), what this session's
-- cached_nextval() returned last (currval()/lastval() do not see it).
\echo Use "ALTER EXTENSION delayed_durability UPDATE TO '0.3.0'" to load this file. \quit

CREATE FUNCTION cached_currval(seq regclass) RETURNS bigint
    VOLATILE PARALLEL UNSAFE STRICT
    LANGUAGE c AS 'MODULE_PATHNAME', 'cached_currval_wrapper';

CREATE FUNCTION cached_lastval() RETURNS bigint
    VOLATILE PARALLEL UNSAFE
    LANGUAGE c AS 'MODULE_PATHNAME', 'cached_lastval_wrapper';
