"""``--frontends``: the supervisor, the engine process, the link between them and its wire format."""
