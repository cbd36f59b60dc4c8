"""User SQL checked with PostgreSQL's own parser (libpg_query through ``pglast``).

``additional-conditions`` filters (incremental snapshots, INC-06) come from whoever may write
the signalling table or launch a Dagster run. They are parsed, never pattern-matched, and
only this grammar is accepted (docs/incremental.md, "Filter grammar")::

    expr := column | constant | expr op expr | op expr | NOT expr | expr AND expr | expr OR expr
          | expr [NOT] IN (expr, ...) | expr [NOT] BETWEEN [SYMMETRIC] expr AND expr
          | expr [NOT] LIKE | ILIKE | SIMILAR TO expr [ESCAPE expr]
          | expr IS [NOT] NULL | expr IS [NOT] TRUE | FALSE | UNKNOWN
          | expr IS [NOT] DISTINCT FROM expr | NULLIF(expr, expr) | COALESCE(expr, ...)
          | GREATEST(expr, ...) | LEAST(expr, ...) | CASE [expr] WHEN expr THEN expr ... END
          | CAST(expr AS type) | expr::type | type 'literal' | function(expr, ...)
          | CURRENT_DATE | CURRENT_TIMESTAMP[(p)] | LOCALTIMESTAMP[(p)] | ...

with ``column`` a column of the table, ``op`` one of :data:`OPERATORS`, ``type`` one of
:data:`TYPES` and ``function`` one of :data:`FUNCTIONS`. Everything else (sub-queries,
parameters, row and array constructors, subscripts, COLLATE, aggregates, window functions,
named or VARIADIC arguments, ``= ANY``, other schemas, several statements) is refused with
:class:`RejectedSql`, naming what was refused and what is allowed.

What runs is never the user's text: :func:`canonical_filter` writes the accepted tree out
again, fully parenthesised, with every identifier quoted, every string an ``E''`` literal and
every function, operator and type schema-qualified with ``pg_catalog`` (``OPERATOR
(pg_catalog.=)``, ``pg_catalog."lower"(...)``, ``CAST(... AS pg_catalog."numeric")``), so
neither the session's ``search_path`` nor a function or operator created in a user schema
can change what it calls. ``IN``, ``BETWEEN``, ``IS DISTINCT FROM``, ``NULLIF`` and simple
``CASE`` are written out with qualified operators (they would otherwise look ``=`` up in the
search path). The canonical text is a fixed point: checking it again gives it back.

``snapshot.select.statement.overrides`` SELECTs are whole queries by design (Debezium);
:func:`check_select` applies the checks that make sense for one: a single SELECT, nothing
that writes or locks, and the same function, operator and type allow-lists.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterator
from typing import Any

from pgcdc_dagster.exceptions import ConfigurationError

MAX_CHARS = 65536
"""Longest filter accepted (characters)."""
MAX_DEPTH = 64
"""Deepest expression nesting accepted."""
MAX_NODES = 5000
"""Most parse-tree nodes accepted in one filter."""

FUNCTIONS = frozenset({
    # text
    "lower", "upper", "initcap", "length", "char_length", "character_length", "octet_length",
    "btrim", "ltrim", "rtrim", "substring", "substr", "left", "right", "strpos", "position",
    "replace", "translate", "starts_with", "split_part", "reverse", "concat", "concat_ws",
    "md5", "like_escape", "similar_to_escape",
    # numbers
    "abs", "round", "trunc", "floor", "ceil", "ceiling", "mod", "sign", "div",
    # dates and times
    "date_trunc", "date_part", "extract", "timezone", "now", "to_timestamp", "to_date",
    "to_char", "to_number", "make_date", "make_time", "make_timestamp", "make_timestamptz",
    "make_interval", "age", "isfinite", "date_bin",
    # nulls
    "num_nulls", "num_nonnulls",
})
"""Side-effect-free built-in functions a filter may call, always as ``pg_catalog.<name>``
(every overload in ``pg_catalog`` is immutable or stable and returns one value; a test
checks that against the server's catalog)."""

OPERATORS = frozenset({
    "=", "<>", "<", "<=", ">", ">=",          # comparison
    "+", "-", "*", "/", "%",                  # arithmetic
    "||",                                     # concatenation
    "~~", "!~~", "~~*", "!~~*",               # LIKE, NOT LIKE, ILIKE, NOT ILIKE
    "~", "!~", "~*", "!~*", "^@",             # regular expressions, starts-with
})
"""Binary operators a filter may use, always as ``OPERATOR(pg_catalog.<op>)``."""
PREFIX_OPERATORS = frozenset({"-", "+"})

TYPES = frozenset({
    "bool", "int2", "int4", "int8", "numeric", "float4", "float8", "text", "varchar",
    "bpchar", "date", "time", "timetz", "timestamp", "timestamptz", "interval", "uuid",
    "bytea", "inet", "cidr",
})
"""Built-in types a filter may cast to (``pg_catalog`` names: ``integer`` is ``int4``,
``timestamp with time zone`` is ``timestamptz``, ``varchar(n)`` is ``varchar``); no ``reg*``
type, whose input function looks objects up."""

_VALUE_FUNCTIONS = {
    "SVFOP_CURRENT_DATE": "CURRENT_DATE", "SVFOP_CURRENT_TIME": "CURRENT_TIME",
    "SVFOP_CURRENT_TIME_N": "CURRENT_TIME", "SVFOP_CURRENT_TIMESTAMP": "CURRENT_TIMESTAMP",
    "SVFOP_CURRENT_TIMESTAMP_N": "CURRENT_TIMESTAMP", "SVFOP_LOCALTIME": "LOCALTIME",
    "SVFOP_LOCALTIME_N": "LOCALTIME", "SVFOP_LOCALTIMESTAMP": "LOCALTIMESTAMP",
    "SVFOP_LOCALTIMESTAMP_N": "LOCALTIMESTAMP",
}
_BOOL_TESTS = {"IS_TRUE": "IS TRUE", "IS_NOT_TRUE": "IS NOT TRUE", "IS_FALSE": "IS FALSE",
               "IS_NOT_FALSE": "IS NOT FALSE", "IS_UNKNOWN": "IS UNKNOWN",
               "IS_NOT_UNKNOWN": "IS NOT UNKNOWN"}
_NUMBER = re.compile(r"-?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")

NODE_NAMES = {
    "SubLink": "a sub-query", "SelectStmt": "a sub-query", "ParamRef": "a parameter ($n)",
    "RowExpr": "a row constructor", "A_ArrayExpr": "an array constructor",
    "A_Indirection": "a subscript or field selection", "CollateClause": "COLLATE",
    "NamedArgExpr": "a named argument (name => value)", "A_Star": "*",
    "GroupingFunc": "GROUPING", "XmlExpr": "an XML expression",
    "XmlSerialize": "an XML expression", "SetToDefault": "DEFAULT",
    "MultiAssignRef": "a multiple assignment", "RangeFunction": "a function in FROM",
    "JsonObjectConstructor": "a JSON constructor", "JsonArrayConstructor":
    "a JSON constructor", "JsonFuncExpr": "a JSON function", "JsonIsPredicate": "IS JSON",
    "JsonParseExpr": "a JSON expression", "JsonScalarExpr": "a JSON expression",
    "JsonSerializeExpr": "a JSON expression", "JsonObjectAgg": "an aggregate",
    "JsonArrayAgg": "an aggregate", "MergeSupportFunc": "MERGE_ACTION()",
}

WHAT_IS_ALLOWED = ("allowed: columns of the table, constants, the operators "
                   + " ".join(sorted(OPERATORS)) + ", AND/OR/NOT, [NOT] IN (list), "
                   "[NOT] BETWEEN, [NOT] LIKE/ILIKE/SIMILAR TO, IS [NOT] NULL/TRUE/FALSE/"
                   "UNKNOWN, IS [NOT] DISTINCT FROM, CASE, COALESCE, NULLIF, GREATEST, LEAST, "
                   "casts to " + ", ".join(sorted(TYPES)) + ", and the functions "
                   + ", ".join(sorted(FUNCTIONS)) + " (see docs/incremental.md)")


class RejectedSql(ConfigurationError):
    """User SQL that is not in the accepted grammar (or that PostgreSQL rejects)."""


Node = dict[str, Any]


def quote_ident(name: str) -> str:
    """``name`` as a double-quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def quote_string(value: str) -> str:
    """``value`` as an ``E''`` literal (read the same whatever standard_conforming_strings)."""
    return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"


def _only(node: Node) -> tuple[str, Node]:
    if len(node) != 1:
        raise ValueError(f"not one node: {sorted(node)}")
    kind, body = next(iter(node.items()))
    return str(kind), body if isinstance(body, dict) else {}


def _names(items: list[Node]) -> list[str]:
    out = []
    for item in items:
        kind, body = _only(item)
        if kind != "String":
            raise RejectedSql(f"{NODE_NAMES.get(kind, kind)} is not allowed in a name")
        out.append(str(body.get("sval", "")))
    return out


def parse_one(text: str, label: str, prefix: str = "") -> Node:
    """Parse ``prefix + text`` as one SQL statement; the statement node
    (``{"SelectStmt": ...}``).

    Raises:
        RejectedSql: empty, too long, not parseable, or more than one statement (a ``;``).
    """
    if not text.strip():
        raise RejectedSql(f"{label}: it is empty")
    if len(text) > MAX_CHARS:
        raise RejectedSql(f"{label}: it is {len(text)} characters long; at most {MAX_CHARS}")
    from pglast.parser import ParseError, parse_sql_json, scan  # only where user SQL is

    try:
        tokens = list(scan(prefix + text))
        tree = json.loads(parse_sql_json(prefix + text))
    except ParseError as exc:
        at = f" (at character {exc.args[1] - len(prefix) + 1})" if len(exc.args) > 1 and \
            isinstance(exc.args[1], int) and exc.args[1] >= len(prefix) else ""
        raise RejectedSql(f"{label}: PostgreSQL's parser rejected it: {exc.args[0]}{at}") \
            from None
    if any(t.name == "ASCII_59" for t in tokens) or len(tree.get("stmts", [])) != 1:
        raise RejectedSql(f"{label}: ';' is not allowed: it must be one expression or "
                          "statement, not several statements")
    stmt: Node = tree["stmts"][0]["stmt"]
    return stmt


# --- filters ------------------------------------------------------------------------------

class _Filter:
    """Checks one filter's parse tree and writes its canonical text."""

    def __init__(self, columns: Collection[str], table: tuple[str, str], label: str,
                 noun: str = "a filter") -> None:
        self.columns = set(columns)
        self.table = table
        self.label = label
        self.noun = noun
        self.nodes = 0

    def refuse(self, what: str, fix: str = "") -> RejectedSql:
        return RejectedSql(f"{self.label}: {what} is not allowed in {self.noun}; "
                           + (fix or WHAT_IS_ALLOWED))

    def expr(self, node: Node, depth: int) -> str:
        self.nodes += 1
        if depth > MAX_DEPTH or self.nodes > MAX_NODES:
            raise RejectedSql(f"{self.label}: the filter is too large or nested too deeply "
                              f"(at most {MAX_DEPTH} levels and {MAX_NODES} terms)")
        kind, body = _only(node)
        handler: Callable[[Node, int], str] | None = getattr(self, "_" + kind, None)
        if handler is None:
            raise self.refuse(NODE_NAMES.get(kind, kind))
        return handler(body, depth + 1)

    def _fields(self, body: Node, allowed: Collection[str], what: str) -> None:
        extra = sorted(set(body) - set(allowed) - {"location"})
        if extra:
            names = {"agg_order": "ORDER BY", "agg_filter": "FILTER (WHERE …)",
                     "over": "a window (OVER)", "agg_within_group": "WITHIN GROUP",
                     "agg_star": "*", "agg_distinct": "DISTINCT in a call",
                     "func_variadic": "VARIADIC", "arrayBounds": "an array type",
                     "setof": "SETOF", "pct_type": "%TYPE"}
            raise self.refuse(f"{names.get(extra[0], extra[0])} in {what}")

    def _ColumnRef(self, body: Node, depth: int) -> str:
        self._fields(body, ("fields",), "a column reference")
        parts = body.get("fields", [])
        if any(_only(p)[0] == "A_Star" for p in parts):
            raise self.refuse("*", "name the columns")
        names = _names(parts)
        column = names[-1]
        qualifier = names[:-1]
        if qualifier not in ([], [self.table[1]], list(self.table)):
            raise self.refuse(f"the reference {'.'.join(names)!r} (not this table)",
                              f"name columns of {self.table[0]}.{self.table[1]} alone")
        if column not in self.columns:
            hint = ""
            folded = {c.lower(): c for c in self.columns}
            if column in folded:
                hint = (f"; the column is {quote_ident(folded[column])}: a mixed-case name "
                        "must be double-quoted")
            raise RejectedSql(f"{self.label}: {column!r} is not a column of "
                              f"{self.table[0]}.{self.table[1]}{hint}")
        return quote_ident(column)

    def _A_Const(self, body: Node, depth: int) -> str:
        if body.get("isnull"):
            return "NULL"
        if "ival" in body:
            value = int(body["ival"].get("ival", 0))
            return f"({value})" if value < 0 else str(value)
        if "fval" in body:
            text = str(body["fval"].get("fval", ""))
            if not _NUMBER.fullmatch(text):
                raise self.refuse(f"the number {text!r}", "write numbers in decimal")
            return f"({text})" if text.startswith("-") else text
        if "boolval" in body:
            return "TRUE" if body["boolval"].get("boolval") else "FALSE"
        if "sval" in body:
            return quote_string(str(body["sval"].get("sval", "")))
        raise self.refuse("a bit-string constant", "compare with a cast string or number")

    def _TypeCast(self, body: Node, depth: int) -> str:
        self._fields(body, ("arg", "typeName"), "a cast")
        return f"CAST({self.expr(body['arg'], depth)} AS {self.type_name(body['typeName'])})"

    def type_name(self, body: Node) -> str:
        self._fields(body, ("names", "typmods", "typemod"), "a type")
        names = _names(body.get("names", []))
        if names[:-1] not in ([], ["pg_catalog"]) or names[-1] not in TYPES:
            raise self.refuse(f"a cast to {'.'.join(names)}",
                              "casts may only be to " + ", ".join(sorted(TYPES)))
        mods = []
        for mod in body.get("typmods", []):
            kind, const = _only(mod)
            if kind != "A_Const" or "ival" not in const:
                raise self.refuse("a type modifier that is not an integer",
                                  "write type modifiers as integers, e.g. numeric(10,2)")
            mods.append(str(int(const["ival"].get("ival", 0))))
        return f"pg_catalog.{quote_ident(names[-1])}" + (f"({', '.join(mods)})" if mods else "")

    def _FuncCall(self, body: Node, depth: int) -> str:
        names = _names(body.get("funcname", []))
        self._fields(body, ("funcname", "args", "funcformat"), f"a call of {'.'.join(names)}")
        if names[:-1] not in ([], ["pg_catalog"]) or names[-1] not in FUNCTIONS:
            raise self.refuse(f"the function {'.'.join(names)}",
                              "the functions allowed are " + ", ".join(sorted(FUNCTIONS))
                              + " (built-in, side-effect free, resolved in pg_catalog)")
        args = ", ".join(self.expr(a, depth) for a in body.get("args", []))
        return f"pg_catalog.{quote_ident(names[-1])}({args})"

    def operator(self, name: list[Node], prefix: bool = False) -> str:
        names = _names(name)
        allowed = PREFIX_OPERATORS if prefix else OPERATORS
        if names[:-1] not in ([], ["pg_catalog"]) or names[-1] not in allowed:
            shown = f"OPERATOR({'.'.join(names)})" if len(names) > 1 else names[-1]
            raise self.refuse(f"the operator {shown}",
                              "the operators allowed are " + " ".join(sorted(allowed))
                              + " (resolved in pg_catalog)")
        return f"OPERATOR(pg_catalog.{names[-1]})"

    def _binary(self, op: str, left: str, right: str) -> str:
        return f"({left} {op} {right})"

    def _A_Expr(self, body: Node, depth: int) -> str:
        self._fields(body, ("kind", "name", "lexpr", "rexpr", "rexpr_list_start",
                            "rexpr_list_end"), "an operator expression")
        kind = body.get("kind", "AEXPR_OP")
        name = body.get("name", [])
        if kind in ("AEXPR_OP", "AEXPR_LIKE", "AEXPR_ILIKE", "AEXPR_SIMILAR"):
            if "lexpr" not in body:
                return f"({self.operator(name, prefix=True)} {self.expr(body['rexpr'], depth)})"
            return self._binary(self.operator(name), self.expr(body["lexpr"], depth),
                                self.expr(body["rexpr"], depth))
        left = self.expr(body["lexpr"], depth)
        if kind == "AEXPR_IN":
            op = self.operator(name)
            items = body["rexpr"].get("List", {}).get("items", []) \
                if isinstance(body.get("rexpr"), dict) else []
            if not items:
                raise self.refuse("IN without a list of values", "write IN (value, …)")
            terms = [self._binary(op, left, self.expr(i, depth)) for i in items]
            joiner = " OR " if _names(name) == ["="] else " AND "
            return "(" + joiner.join(terms) + ")"
        eq = "OPERATOR(pg_catalog.=)"
        if kind in ("AEXPR_BETWEEN", "AEXPR_NOT_BETWEEN", "AEXPR_BETWEEN_SYM",
                    "AEXPR_NOT_BETWEEN_SYM"):
            low, high = (self.expr(i, depth) for i in body["rexpr"]["List"]["items"])
            ge, le = "OPERATOR(pg_catalog.>=)", "OPERATOR(pg_catalog.<=)"

            def within(a: str, b: str) -> str:
                return f"({self._binary(ge, left, a)} AND {self._binary(le, left, b)})"

            test = within(low, high)
            if kind.endswith("_SYM"):
                test = f"({test} OR {within(high, low)})"
            return f"(NOT {test})" if "NOT" in kind else test
        right = self.expr(body["rexpr"], depth)
        if kind in ("AEXPR_DISTINCT", "AEXPR_NOT_DISTINCT"):
            distinct = (f"(CASE WHEN ({left} IS NULL) THEN ({right} IS NOT NULL) "
                        f"WHEN ({right} IS NULL) THEN TRUE "
                        f"ELSE (NOT {self._binary(eq, left, right)}) END)")
            return distinct if kind == "AEXPR_DISTINCT" else f"(NOT {distinct})"
        if kind == "AEXPR_NULLIF":
            return f"(CASE WHEN {self._binary(eq, left, right)} THEN NULL ELSE {left} END)"
        raise self.refuse("= ANY / ALL (…)" if kind in ("AEXPR_OP_ANY", "AEXPR_OP_ALL")
                          else kind, "write IN (value, …) instead")

    def _BoolExpr(self, body: Node, depth: int) -> str:
        self._fields(body, ("boolop", "args"), "a boolean expression")
        args = [self.expr(a, depth) for a in body.get("args", [])]
        op = body.get("boolop")
        if op == "NOT_EXPR":
            return f"(NOT {args[0]})"
        return "(" + (" AND " if op == "AND_EXPR" else " OR ").join(args) + ")"

    def _NullTest(self, body: Node, depth: int) -> str:
        self._fields(body, ("arg", "nulltesttype", "argisrow"), "IS NULL")
        test = "IS NOT NULL" if body.get("nulltesttype") == "IS_NOT_NULL" else "IS NULL"
        return f"({self.expr(body['arg'], depth)} {test})"

    def _BooleanTest(self, body: Node, depth: int) -> str:
        self._fields(body, ("arg", "booltesttype"), "IS TRUE/FALSE/UNKNOWN")
        return f"({self.expr(body['arg'], depth)} {_BOOL_TESTS[body['booltesttype']]})"

    def _CoalesceExpr(self, body: Node, depth: int) -> str:
        self._fields(body, ("args",), "COALESCE")
        return f"COALESCE({', '.join(self.expr(a, depth) for a in body.get('args', []))})"

    def _MinMaxExpr(self, body: Node, depth: int) -> str:
        self._fields(body, ("op", "args"), "GREATEST/LEAST")
        name = "GREATEST" if body.get("op") == "IS_GREATEST" else "LEAST"
        return f"{name}({', '.join(self.expr(a, depth) for a in body.get('args', []))})"

    def _SQLValueFunction(self, body: Node, depth: int) -> str:
        self._fields(body, ("op", "typmod"), "a SQL value function")
        op = str(body.get("op"))
        if op not in _VALUE_FUNCTIONS:
            raise self.refuse(op.removeprefix("SVFOP_"), "CURRENT_DATE, CURRENT_TIME, "
                              "CURRENT_TIMESTAMP, LOCALTIME and LOCALTIMESTAMP are allowed")
        name = _VALUE_FUNCTIONS[op]
        return f"{name}({int(body['typmod'])})" if op.endswith("_N") else name

    def _CaseExpr(self, body: Node, depth: int) -> str:
        self._fields(body, ("arg", "args", "defresult"), "CASE")
        subject = self.expr(body["arg"], depth) if "arg" in body else None
        parts = ["CASE"]
        for when in body.get("args", []):
            kind, w = _only(when)
            if kind != "CaseWhen":
                raise self.refuse(NODE_NAMES.get(kind, kind))
            test = self.expr(w["expr"], depth)
            if subject is not None:
                test = self._binary("OPERATOR(pg_catalog.=)", subject, test)
            parts.append(f"WHEN {test} THEN {self.expr(w['result'], depth)}")
        if "defresult" in body:
            parts.append(f"ELSE {self.expr(body['defresult'], depth)}")
        parts.append("END")
        return "(" + " ".join(parts) + ")"


_CLAUSES = {"larg": "UNION/INTERSECT/EXCEPT", "rarg": "UNION/INTERSECT/EXCEPT",
            "sortClause": "ORDER BY", "fromClause": "FROM", "whereClause": "WHERE",
            "limitCount": "LIMIT", "limitOffset": "OFFSET", "intoClause": "INTO",
            "lockingClause": "FOR UPDATE/SHARE", "groupClause": "GROUP BY",
            "distinctClause": "DISTINCT", "havingClause": "HAVING", "windowClause": "WINDOW",
            "withClause": "WITH", "valuesLists": "VALUES"}


def canonical_filter(text: str, columns: Collection[str], table: tuple[str, str],
                     label: str) -> str:
    """Check an ``additional-conditions`` filter against the grammar; its canonical text.

    ``columns`` are the names of the table's columns (the only names a filter may use).

    Raises:
        RejectedSql: naming what is refused and what is allowed.
    """
    stmt = parse_one(text, label, prefix="SELECT ")
    kind, select = _only(stmt)
    targets = select.get("targetList", []) if kind == "SelectStmt" else []
    extra = set(select) - {"targetList", "limitOption", "op"}
    if extra or len(targets) != 1 or select.get("op") != "SETOP_NONE":
        clause = _CLAUSES.get(sorted(extra)[0], sorted(extra)[0]) if extra else \
            "a list of expressions"
        raise RejectedSql(f"{label}: {clause} is not allowed: a filter is one boolean "
                          "expression over the table's columns")
    target = _only(targets[0])[1]
    if set(target) - {"val", "location"}:
        raise RejectedSql(f"{label}: an alias is not allowed: a filter is one boolean "
                          "expression over the table's columns")
    return _Filter(columns, table, label).expr(target["val"], 0)


# --- whole SELECTs (snapshot.select.statement.overrides) ----------------------------------

def single_statement(text: str) -> str:
    """The one statement in ``text``, without a trailing ``;`` or comment (PostgreSQL's
    parser splits it: quotes, dollar quotes, nested comments and ``U&`` forms are its own).

    Raises:
        ConfigurationError: empty, not parseable, or more than one statement.
    """
    if not text.strip():
        raise ConfigurationError("it is empty")
    from pglast.parser import ParseError, parse_sql_json, scan  # only where user SQL is

    try:
        stmts = json.loads(parse_sql_json(text)).get("stmts", [])
    except ParseError as exc:
        raise ConfigurationError(f"PostgreSQL's parser rejected it ({exc.args[0]})") from None
    if not stmts:
        raise ConfigurationError("it is empty")
    if len(stmts) > 1:
        raise ConfigurationError("it holds more than one statement")
    data = text.encode()  # parser locations are byte offsets
    start = int(stmts[0].get("stmt_location", 0))
    length = int(stmts[0].get("stmt_len", 0)) or len(data) - start
    body = data[start:start + length].decode()
    tokens = list(scan(body))
    return body + "\n" if tokens and tokens[-1].name == "SQL_COMMENT" else body  # -- …


_WRITES = {"InsertStmt": "INSERT", "UpdateStmt": "UPDATE", "DeleteStmt": "DELETE",
           "MergeStmt": "MERGE"}


def _walk(node: Any) -> Iterator[tuple[str, Node]]:
    if isinstance(node, list):
        for item in node:
            yield from _walk(item)
    elif isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, dict) and key[:1].isupper():
                yield key, value
            yield from _walk(value)


def check_select(text: str, label: str) -> tuple[set[str], set[str]]:
    """Check a whole SELECT (an override); the function and operator names it uses
    unqualified (the ones a same-named object in another schema could shadow).

    One SELECT (or VALUES) statement; no INSERT/UPDATE/DELETE/MERGE anywhere (data-modifying
    WITH), no SELECT INTO, no FOR UPDATE/SHARE, no function in FROM, no parameters; every
    function call, operator and cast as in a filter (allow-listed, ``pg_catalog`` only).

    Raises:
        RejectedSql: naming what is refused.
    """
    stmt = parse_one(text, label)
    if _only(stmt)[0] != "SelectStmt":
        raise RejectedSql(f"{label} must be a single read-only SELECT statement, not "
                          f"{_WRITES.get(_only(stmt)[0], _only(stmt)[0])}")
    check = _Filter((), ("", ""), label, "an override")
    functions: set[str] = set()
    operators: set[str] = set()
    for kind, body in _walk(stmt):
        if kind in _WRITES:
            raise RejectedSql(f"{label} must be a single read-only SELECT statement: "
                              f"{_WRITES[kind]} is not allowed (it writes)")
        if kind == "SelectStmt" and ("intoClause" in body or "lockingClause" in body):
            raise RejectedSql(f"{label} must be a single read-only SELECT statement: "
                              "SELECT INTO and FOR UPDATE/SHARE are not allowed")
        if kind in ("RangeFunction", "ParamRef", "RangeTableFunc", "RangeTableSample"):
            raise check.refuse(NODE_NAMES.get(kind, kind), "overrides may read tables and "
                               "views, call only allow-listed functions, and take no "
                               "parameters")
        if kind == "FuncCall":
            names = _names(body.get("funcname", []))
            if names[:-1] not in ([], ["pg_catalog"]) or names[-1] not in FUNCTIONS:
                raise check.refuse(f"the function {'.'.join(names)}",
                                   "the functions allowed are " + ", ".join(sorted(FUNCTIONS)))
            if len(names) == 1:
                functions.add(names[-1])
        elif kind == "A_Expr":
            names = _names(body.get("name", []))
            if body.get("kind") in ("AEXPR_OP_ANY", "AEXPR_OP_ALL"):
                raise check.refuse("= ANY / ALL (…)", "write IN (value, …) instead")
            if body.get("kind") not in ("AEXPR_BETWEEN", "AEXPR_NOT_BETWEEN",
                                        "AEXPR_BETWEEN_SYM", "AEXPR_NOT_BETWEEN_SYM"):
                check.operator(body.get("name", []), prefix="lexpr" not in body
                               and body.get("kind") == "AEXPR_OP")
                if len(names) == 1:
                    operators.add(names[-1])
            else:
                operators.update(("<=", ">="))
        elif kind == "TypeCast":
            check.type_name(body["typeName"])
        for field in ("useOp", "operName"):  # ORDER BY … USING op, x op ANY (SELECT …)
            if field in body:
                check.operator(body[field])
                if len(_names(body[field])) == 1:
                    operators.add(_names(body[field])[-1])
    return functions, operators
