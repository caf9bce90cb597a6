"""PostgreSQL targets and ledgers under real faults (issue 3)."""
