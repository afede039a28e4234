"""Stop conditions on token ids: stop tokens, EOS, max_tokens, max_model_len; and a step's new
tokens appended up to the first that ends the request (a stop, or its grammar's end)."""

from __future__ import annotations

from minivllm.engine.sched.grammar import end_grammar
from minivllm.engine.sched.request import Request, RequestStatus
from minivllm.engine.types import FinishReason, LogprobsDict
from minivllm.structured_output.request_state import AdvanceOutcome


def append_until_stop(
    request: Request,
    token_ids: list[int],
    logprobs: list[LogprobsDict] | None,
    advanced: dict[str, AdvanceOutcome],
    max_model_len: int,
) -> bool:
    """Appends token_ids to request's output up to the first that ends it, and drops those
    after that one from token_ids (and logprobs); returns whether one ended it (finished, not
    yet released). advanced: the step's batched grammar advance (grammar.advance_grammars)."""
    for n, token_id in enumerate(token_ids, 1):
        request.append_output_token(token_id)
        # The grammar's matcher follows every token; its end or failure ends the request.
        grammar_ended = request.structured_output is not None and end_grammar(request, advanced)
        if grammar_ended or check_stop(request, max_model_len):
            del token_ids[n:]  # tokens after the end are dropped
            if logprobs is not None:
                del logprobs[n:]
            return True
    return False


def check_stop(request: Request, max_model_len: int) -> bool:
    """Marks request finished if its last output token ends it; returns whether it did.

    Stop tokens and EOS count only once min_tokens tokens (this one included) exist.
    """
    params = request.sampling_params
    num_output_tokens = len(request.output_token_ids)
    if num_output_tokens >= params.min_tokens:
        token_id = request.output_token_ids[-1]
        if token_id in params.stop_token_ids or (
            not params.ignore_eos and token_id in params.eos_token_ids
        ):
            _finish(request, RequestStatus.FINISHED_STOPPED, "stop")
            return True
    max_tokens = params.max_tokens
    if max_tokens is not None and num_output_tokens >= max_tokens:
        _finish(request, RequestStatus.FINISHED_LENGTH, "length")
        return True
    if len(request.all_token_ids) >= max_model_len:
        _finish(request, RequestStatus.FINISHED_LENGTH, "length")
        return True
    return False


def _finish(request: Request, status: RequestStatus, reason: FinishReason) -> None:
    request.status = status
    request.finish_reason = reason
