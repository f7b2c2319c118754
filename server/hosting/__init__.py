"""Where a model version lives: the route table (host), engines here (local) or in the engine process (remote)."""
