"""The edges of the flow: JDBC bulk reads/writes (Spark) and transactional SQL (mysql-connector)."""
