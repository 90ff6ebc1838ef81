"""The shell: CLI, settings, wiring of the embedded stack. Nothing else."""
