"""Records and the results tree: the run record (run.json), the per-run folders and their MLPerf-shaped view, LoadGen's logs, the named figures of a record."""
