"""RL jobs: the job specification, its protobuf form, the records kept in Redis and the gRPC client."""
