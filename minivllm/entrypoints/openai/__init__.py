"""OpenAI's completions and chat completions: request bodies, sampling parameters, constraints,
logprobs, and the two endpoints' handlers."""
