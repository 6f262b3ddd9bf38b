"""Generated gRPC stubs of `proto/tlt/v1/` (`make proto`); do not edit the *_pb2* files by hand."""
