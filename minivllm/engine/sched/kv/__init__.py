"""The KV cache's bookkeeping, no torch: blocks and the prefix cache, hybrid models' state slots."""
