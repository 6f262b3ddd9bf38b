"""Redis: the connection settings every process uses, the versioned weight channels (drafter,
policy) and the samples stream."""
