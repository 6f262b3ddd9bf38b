"""Errors the services' stores raise, each meaning one gRPC status (mapped in `tlt.rpc.service`)."""


class NotFound(Exception):
    """No such job, drafter or version."""


class AlreadyExists(Exception):
    """The thing exists already with other settings."""


class FailedPrecondition(Exception):
    """The request is valid but the state does not allow it (leased, lease ended, no weights)."""


class ResourceExhausted(Exception):
    """A configured limit is reached (e.g. the number of job records)."""


class Cancelled(Exception):
    """The caller went away or cancelled the work."""
