"""The popularity sketch, the FAE hot-set choice and the sketch worker."""
