"""Other caching gateways, run side by side with stoker's in one benchmark."""
