"""The EAGLE drafter: model, training data packing, loss and offline acceptance measurement."""
