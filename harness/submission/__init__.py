"""MLPerf Inference v6.x submissions: package recorded runs into the official tree, run the
compliance audits (TEST01, TEST04), and check a tree against the official checker's rules
before it is submitted. Nothing here imports a deep-learning framework."""
