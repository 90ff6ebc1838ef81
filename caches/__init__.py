"""The cache client the serving side imports: keys, exact/semantic/embedding/negative stores."""
