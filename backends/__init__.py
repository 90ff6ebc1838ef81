"""The model server as stoker reaches it: the backend contract, one HTTP client, its engine's metrics."""
