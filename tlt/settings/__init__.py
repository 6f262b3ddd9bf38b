"""Settings of TLT's processes: one pydantic model per process (one module each, named after it),
the single source of truth for its flags, defaults and limits. Each is filled from the command line,
then `TLT_*` environment variables, then the defaults. Redis and gRPC connection settings live
with their layers (`tlt.store.connection`, `tlt.rpc.settings`)."""
