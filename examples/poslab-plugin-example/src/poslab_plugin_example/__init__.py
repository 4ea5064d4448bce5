"""An example poslab plugin: poslab imports each entry point's module when its registries load."""
