"""Speculative decoding in the runner: proposers, draft slots, a drafted step's sampling."""
