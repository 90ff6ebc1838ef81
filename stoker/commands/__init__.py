"""One module per CLI verb; importing a module registers its commands on stoker.app.app."""
