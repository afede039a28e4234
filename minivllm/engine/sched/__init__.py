"""Scheduling: which tokens of which requests each step computes, KV blocks, stops."""
