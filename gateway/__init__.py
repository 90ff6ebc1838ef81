"""`stoker gateway`: an OpenAI-compatible caching proxy in front of any OpenAI-compatible upstream."""
