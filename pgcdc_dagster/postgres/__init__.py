"""psycopg2 adapters: they take a DSN, connection or cursor and never read configuration."""
