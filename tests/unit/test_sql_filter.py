"""The filter grammar: PostgreSQL's parser decides, an allow-list accepts.

Pure: libpg_query through pglast, no server. The server-side layers (EXPLAIN, READ ONLY,
statement_timeout) and the two signal channels are tested in
tests/integration/test_sql_filter_pg.py and tests/dagster/test_filter_channels.py.
"""

from __future__ import annotations

import pytest

from pgcdc_dagster.postgres.sql_filter import (
    FUNCTIONS,
    RejectedSql,
    canonical_filter,
    check_select,
    single_statement,
)

pytestmark = [pytest.mark.unit]

COLUMNS = ["id", "region", "total", "code", "at", "MixedCase", "name"]
TABLE = ("public", "orders")


def canon(text: str) -> str:
    return canonical_filter(text, COLUMNS, TABLE, "additional-conditions for public.orders")


LEGIT = [
    "id <= 100", "region = 'eu' AND total > 100", "id IN (1, 2, 3)", "id NOT IN (1, -2)",
    "total BETWEEN 1 AND 5", "total NOT BETWEEN SYMMETRIC 5 AND 1",
    "name LIKE 'a%' ESCAPE '!'", "name ILIKE 'A%'", "name NOT LIKE 'x'",
    "name SIMILAR TO 'a|b'", "code IS NOT NULL", "(id > 1) IS TRUE", "code IS UNKNOWN",
    "id IS DISTINCT FROM code", "id IS NOT DISTINCT FROM NULL",
    "at::timestamptz >= timestamptz '2024-01-01' AND date_trunc('day', at) = '2024-01-01'::date",
    "coalesce(code, 0) > 5", "total::numeric(10,2) > 1.5", "CAST(total AS text) = '3'",
    '"MixedCase" = 1', "lower(region) = upper(region)", "region || 'x' = E'eu\\\\x'",
    "CASE region WHEN 'eu' THEN 1 ELSE 2 END = 1", "nullif(code, 0) IS NULL",
    "greatest(id, code) > 3", "- id < 0", "extract(year FROM at) = 2024",
    "at > now() - interval '1 day'", "at < CURRENT_TIMESTAMP(3)", "orders.id > 1",
    "public.orders.id > 1", "(id > 1 AND id < 5) AND code = 1", "trim(region) = 'eu'",
    "at AT TIME ZONE 'UTC' > '2020-01-01'", "pg_catalog.lower(region) = 'eu'",
    "id OPERATOR(pg_catalog.=) 1", "$$eu$$ = region", "id > 0 -- a comment",
    "/* a comment */ id > 0", "NOT (id > 1 OR id < -1)", "id % 2 = 0 AND id * 2 / 1 + 0 > 0",
]


@pytest.mark.parametrize("text", LEGIT)
def test_accepted_filters_are_canonical_and_stable(text: str) -> None:
    out = canon(text)
    assert canon(out) == out  # a fixed point: what is stored is checked again unchanged
    assert "OPERATOR(pg_catalog." in out or "IS " in out
    for word in ("lower(", "upper(", "date_trunc(", "btrim(", "now(", "timezone("):
        if word in out:  # every call schema-qualified
            assert f'pg_catalog."{word[:-1]}"(' in out
    assert "--" not in out and "/*" not in out and "$$" not in out


def test_canonical_forms() -> None:
    assert canon("id <= 100") == '("id" OPERATOR(pg_catalog.<=) 100)'
    assert canon("id IN (1, 2)") == ('(("id" OPERATOR(pg_catalog.=) 1) OR '
                                     '("id" OPERATOR(pg_catalog.=) 2))')
    assert canon("total::numeric(10,2) > -1.5") == (
        '(CAST("total" AS pg_catalog."numeric"(10, 2)) OPERATOR(pg_catalog.>) (-1.5))')
    # Strings are E'' literals: read the same whatever standard_conforming_strings says.
    assert canon("region = 'a\\'") == "(\"region\" OPERATOR(pg_catalog.=) E'a\\\\')"
    assert canon("region = 'it''s'") == "(\"region\" OPERATOR(pg_catalog.=) E'it''s')"


HOSTILE = [
    # Unicode-escaped identifiers, with and without UESCAPE, quoted and in other cases
    ('U&"pg_terminate_backend"(pg_backend_pid()) IS NULL', "function pg_terminate_backend"),
    ('U&"\\0070g_terminate_backend"(1) IS NULL', "function pg_terminate_backend"),
    ('U&"!0070g_terminate_backend" UESCAPE \'!\'(1) IS NULL', "function pg_terminate_backend"),
    ('U&"\\+000070g_drop_replication_slot"(\'s\') IS NULL',
     "function pg_drop_replication_slot"),
    ('"pg_terminate_backend"(1)', "function pg_terminate_backend"),
    ("PG_TERMINATE_BACKEND(1)", "function pg_terminate_backend"),
    ("pg_catalog.pg_terminate_backend(1)", "function pg_catalog.pg_terminate_backend"),
    ('"pg_catalog"."pg_drop_replication_slot"(\'s\') IS NULL',
     "function pg_catalog.pg_drop_replication_slot"),
    ("public.lower(region) = 'x'", "function public.lower"),
    ('U&"lower"(region) = \'x\' OR U&"\\0073et_config"(\'a\', \'b\', false) = \'\'',
     "function set_config"),
    # a backslash in a standard string ends it where PostgreSQL says, not a regex
    ("region = '\\' OR pg_terminate_backend(1) OR 'x' = '\\'", "function pg_terminate_backend"),
    ("region = E'\\'' OR pg_sleep(10) IS NULL", "function pg_sleep"),
    ("region = E'\\\\' OR pg_terminate_backend(1)", "function pg_terminate_backend"),
    ("region = $q$'$q$ OR pg_drop_replication_slot('s') IS NULL",
     "function pg_drop_replication_slot"),
    ("region = $$ $$ OR pg_sleep(1) IS NULL", "function pg_sleep"),
    # comments hide nothing: the parser drops them, what is left is checked
    ("id > 0 /* ; */ OR pg_sleep(1) IS NULL", "function pg_sleep"),
    ("id > 0 --\n OR pg_terminate_backend(1)", "function pg_terminate_backend"),
    # several statements
    ("id > 0; DROP TABLE orders", "';' is not allowed"),
    ("id > 0; SELECT pg_terminate_backend(1)", "';' is not allowed"),
    ("id > 0;", "';' is not allowed"),
    # sub-queries and other clauses
    ("id IN (SELECT id FROM orders)", "a sub-query"),
    ("EXISTS (SELECT pg_terminate_backend(1))", "a sub-query"),
    ("(SELECT true)", "a sub-query"),
    ("id > 1 UNION SELECT pg_terminate_backend(1)", "UNION"),
    ("id FROM orders", "FROM"),
    ("id > 1 ORDER BY pg_sleep(1)", "ORDER BY"),
    ("id > 1 LIMIT 1", "LIMIT"),
    ("id > 1 AS x", "an alias"),
    ("id > 1, pg_sleep(1)", "a list"),
    # set-returning, volatile, setting and catalog functions, aggregates, windows
    ("generate_series(1, 2) > 1", "function generate_series"),
    ("nextval('s') > 0", "function nextval"),
    ("random() < 0.5", "function random"),
    ("current_setting('is_superuser') = 'on'", "function current_setting"),
    ("pg_read_file('/etc/passwd') IS NULL", "function pg_read_file"),
    ("dblink_exec('x') IS NULL", "function dblink_exec"),
    ("count(*) > 1", "*"),
    ("sum(id) OVER () > 1", "a window"),
    ("lower(region ORDER BY id) = 'x'", "ORDER BY"),
    ("lower(VARIADIC ARRAY['x']) = 'x'", "VARIADIC"),
    ("concat(x => region) = 'x'", "a named argument"),
    # casts to reg* and other types that look objects up
    ("'orders'::regclass IS NOT NULL", "cast to regclass"),
    ("'pg_sleep'::regproc IS NOT NULL", "cast to regproc"),
    ("CAST('now' AS regprocedure) IS NULL", "cast to regprocedure"),
    ("id::public.mytype = 1", "cast to public.mytype"),
    ("id::int[] IS NULL", "an array type"),
    # operators: user-defined, OPERATOR() syntax to other schemas, = ANY
    ("id === 1", "operator ==="),
    ("id OPERATOR(public.=) 1", "operator OPERATOR(public.=)"),
    ("id OPERATOR(evil.+) 1 > 0", "operator OPERATOR(evil.+)"),
    ("@ id > 1", "operator @"),
    ("id = ANY('{1,2}')", "= ANY"),
    # parameters, constructors, subscripts, COLLATE, bit strings
    ("$1 = id", "a parameter"),
    ("ROW(id, code) = ROW(1, 2)", "a row constructor"),
    ("(id, code) > (1, 2)", "a row constructor"),
    ("ARRAY[id] = ARRAY[1]", "an array constructor"),
    ("region COLLATE \"C\" = 'x'", "COLLATE"),
    ("B'101' = B'101'", "bit-string"),
    ("current_user = 'postgres'", "CURRENT_USER"),
    # names: only columns of the table
    ("nope = 1", "'nope' is not a column of public.orders"),
    ("MixedCase = 1", 'the column is "MixedCase"'),
    ("other.id = 1", "not this table"),
    ("xmin = '1'", "'xmin' is not a column"),
    ("", "it is empty"),
    ("id > (1", "parser rejected it: syntax error"),
]


@pytest.mark.parametrize(("text", "reason"), HOSTILE)
def test_hostile_filters_are_refused_naming_the_problem(text: str, reason: str) -> None:
    with pytest.raises(RejectedSql) as info:
        canon(text)
    message = str(info.value)
    assert message.startswith("additional-conditions for public.orders: ")
    assert reason in message, message


def test_refusals_say_what_is_allowed() -> None:
    with pytest.raises(RejectedSql, match="the functions allowed are abs, age"):
        canon("pg_sleep(1) IS NULL")
    with pytest.raises(RejectedSql, match="casts may only be to bool, bpchar"):
        canon("'t'::regclass IS NULL")
    with pytest.raises(RejectedSql, match=r"allowed: columns of the table, constants"):
        canon("id IN (SELECT 1)")


def test_bounded() -> None:
    with pytest.raises(RejectedSql, match="too large or nested too deeply"):
        canon("abs(" * 70 + "id" + ")" * 70 + " > 0")
    with pytest.raises(RejectedSql, match="characters long"):
        canon("id IN (" + ", ".join(["1"] * 30000) + ")")


def test_allow_lists_hold_no_unsafe_name() -> None:
    unsafe = {"pg_sleep", "pg_terminate_backend", "set_config", "nextval", "random",
              "current_setting", "pg_read_file", "generate_series", "repeat", "lpad", "rpad"}
    assert not unsafe & FUNCTIONS


@pytest.mark.parametrize(("text", "reason"), [
    ("DELETE FROM items RETURNING *", "not DELETE"),
    ("WITH d AS (DELETE FROM items RETURNING *) SELECT * FROM d", "DELETE is not allowed"),
    ("WITH d AS (UPDATE items SET id = 1 RETURNING *) SELECT * FROM d", "UPDATE is not"),
    ("SELECT * INTO t2 FROM items", "SELECT INTO"),
    ("SELECT * FROM items FOR UPDATE", "FOR UPDATE"),
    ("SELECT *, pg_terminate_backend(1) FROM items", "function pg_terminate_backend"),
    ('SELECT *, U&"pg_terminate_backend"(1) FROM items', "function pg_terminate_backend"),
    ("SELECT * FROM items WHERE id = (SELECT nextval('s'))", "function nextval"),
    ("SELECT * FROM generate_series(1, 3) g", "a function in FROM"),
    ("SELECT * FROM items ORDER BY id USING OPERATOR(public.<<<)", "operator OPERATOR(public.<<<)"),
    ("SELECT * FROM items WHERE id === 1", "operator ==="),
    ("SELECT * FROM items WHERE id::regclass IS NULL", "cast to regclass"),
    ("SELECT * FROM items WHERE id = $1", "a parameter"),
])
def test_override_checks(text: str, reason: str) -> None:
    with pytest.raises(RejectedSql, match=None) as info:
        check_select(single_statement(text), "snapshot.select.statement.overrides.public.items")
    assert reason in str(info.value), str(info.value)


def test_override_accepts_joins_and_subqueries_and_reports_unqualified_names() -> None:
    functions, operators = check_select(
        "SELECT i.* FROM public.items i JOIN public.other o ON o.id = i.id "
        "WHERE lower(i.name) LIKE 'a%' AND i.id IN (SELECT id FROM public.other) "
        "AND pg_catalog.upper(i.name) OPERATOR(pg_catalog.<>) ''", "override")
    assert functions == {"lower"} and operators == {"=", "~~"}


@pytest.mark.parametrize(("text", "body"), [
    ("SELECT * FROM t", "SELECT * FROM t"), ("SELECT * FROM t;", "SELECT * FROM t"),
    ("SELECT * FROM t ;  -- done\n", "SELECT * FROM t "),
    ("SELECT 1 -- trailing", "SELECT 1 -- trailing\n"),
    ("SELECT 'é;' AS x;", "SELECT 'é;' AS x"),
])
def test_single_statement_body(text: str, body: str) -> None:
    assert single_statement(text) == body
