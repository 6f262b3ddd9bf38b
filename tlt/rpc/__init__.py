"""gRPC plumbing shared by the services: server and channel construction, auth, TLS, the error
mapping, and the drafter service's validated requests."""
