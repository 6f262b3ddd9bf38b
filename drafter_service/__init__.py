"""The drafter service: a gRPC service that owns the drafters (DESIGN.md). Not built yet: it
arrives with the adaptive-drafter issue; the package exists so the distribution's layout is final."""
