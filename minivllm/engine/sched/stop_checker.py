"""Stop conditions on token ids: stop tokens, EOS, max_tokens, max_model_len."""

from __future__ import annotations

from minivllm.engine.sched.request import Request, RequestStatus
from minivllm.engine.types import FinishReason


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
