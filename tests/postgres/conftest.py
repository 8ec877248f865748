"""PostgreSQL-only tests.

The fixtures they use (`pg`, `dsn`, `schema`) live in tests/conftest.py, which
also marks every test in this folder `postgres`.
"""
