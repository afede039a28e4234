"""The device caches (paged KV, recurrent-state pool), their memory and their sizing."""
