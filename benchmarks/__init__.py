"""agent-ledger benchmarks: `python -m benchmarks --help`. Not part of the test run."""
