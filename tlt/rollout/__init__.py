"""Talking to rollout servers: the HTTP client, the pool that spreads a batch over live servers,
their discovery on Kubernetes, and held-out evaluation over them."""
