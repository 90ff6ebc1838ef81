"""Event schemas and the one place that turns bytes into events."""
