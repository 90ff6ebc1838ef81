"""Inference backends: the contract, an OpenAI-compatible client and the simulated GPU."""
