"""PostgreSQL access: named SQL from sql/queries.sql and connection pools."""
