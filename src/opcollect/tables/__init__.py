"""Tables: merge shards into parquet tables with sidecars and a manifest; check, verify, compare."""
