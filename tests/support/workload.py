"""A reproducible random workload over three tables, counting the events it should produce."""

from __future__ import annotations

import random

SCHEMA = """
CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, active boolean,
                       balance numeric(14,2), opened timestamptz);
CREATE TABLE events (id bigint PRIMARY KEY, account_id int, kind text, amount numeric,
                     at timestamptz, flag boolean, small smallint);
CREATE TABLE "Mixed Case" ("Key" int, part text, "Value" text, PRIMARY KEY ("Key", part));
INSERT INTO accounts SELECT g, 'owner ' || g, g % 2 = 0, g * 1.25,
    '2024-01-01'::timestamptz + g * interval '1 hour' FROM generate_series(1, 500) g;
INSERT INTO events SELECT g, 1 + g % 500, 'k' || (g % 7), g / 3.0, now(), NULL, (g % 100)::smallint
    FROM generate_series(1, 800) g;
INSERT INTO "Mixed Case" SELECT g, 'p' || (g % 3), 'v ' || g FROM generate_series(1, 300) g;
"""


class Workload:
    """Random inserts/updates/deletes; counts the change events each table should receive."""

    def __init__(self, conn, seed: int) -> None:
        self.conn = conn
        self.rng = random.Random(seed)
        self.next_event = 10_000
        self.next_account = 10_000
        self.expected: dict[str, dict[str, int]] = {
            t: {"c": 0, "u": 0, "d": 0} for t in ("accounts", "events", "Mixed Case")}

    def _count(self, table: str, op: str, n: int) -> None:
        self.expected[table][op] += n

    def run(self, transactions: int) -> int:
        rng = self.rng
        self.conn.autocommit = False
        with self.conn.cursor() as cur:
            for _ in range(transactions):
                for _ in range(rng.randint(1, 6)):
                    r = rng.random()
                    if r < 0.3:
                        self.next_event += 1
                        cur.execute(
                            "INSERT INTO events VALUES (%s, %s, %s, %s, now(), %s, %s)",
                            (self.next_event, rng.randint(1, 500), "ins",
                             rng.choice([None, "12.5", "-0.001", "123456789.123456789"]),
                             rng.choice([True, False, None]), rng.randint(-32768, 32767)))
                        self._count("events", "c", 1)
                    elif r < 0.45:
                        self.next_account += 1
                        cur.execute("INSERT INTO accounts VALUES (%s, %s, true, 0, now())",
                                    (self.next_account, f"ünïcode {self.next_account}"))
                        self._count("accounts", "c", 1)
                    elif r < 0.7:
                        cur.execute("UPDATE accounts SET balance = balance + 1.01, "
                                    "active = NOT active WHERE id = %s", (rng.randint(1, 600),))
                        self._count("accounts", "u", cur.rowcount)
                    elif r < 0.8:
                        cur.execute("UPDATE events SET kind = kind || '+', amount = NULL "
                                    "WHERE id BETWEEN %s AND %s", (n := rng.randint(1, 800), n + 3))
                        self._count("events", "u", cur.rowcount)
                    elif r < 0.9:
                        cur.execute('UPDATE "Mixed Case" SET "Value" = %s WHERE "Key" = %s',
                                    (f"w{rng.random()}", rng.randint(1, 300)))
                        self._count("Mixed Case", "u", cur.rowcount)
                    else:
                        cur.execute("DELETE FROM events WHERE id = %s", (rng.randint(1, 12_000),))
                        self._count("events", "d", cur.rowcount)
                        cur.execute('DELETE FROM "Mixed Case" WHERE "Key" = %s',
                                    (rng.randint(1, 300),))
                        self._count("Mixed Case", "d", cur.rowcount)
                self.conn.commit()
        self.conn.autocommit = True
        return sum(sum(v.values()) for v in self.expected.values())
