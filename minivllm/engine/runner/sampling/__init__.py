"""The runner's sampling state: params, penalty tables, thinking budgets, prompt logprobs."""
