"""Writers of the generated documentation tables (the README's results table, the TPU
table): tools, not part of a run. Each takes its provenance (commit, date) from the rows
it writes, never from the tree that runs it."""
