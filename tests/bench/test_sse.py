"""The streaming-completions wire format: what counts as a token chunk."""

import pytest

from splitserve.bench.sse import DONE, StreamError, chunk_tokens, parse_line, usage_tokens


def test_parse_line():
    assert parse_line("") is None and parse_line(": keep-alive") is None
    assert parse_line("event: message") is None
    assert parse_line("data: [DONE]") is DONE and parse_line("data:[DONE]") is DONE
    assert parse_line('data: {"choices": []}') == {"choices": []}
    with pytest.raises(StreamError, match="bad_json"):
        parse_line("data: {oops")
    with pytest.raises(StreamError, match="stream_error: out of memory"):
        parse_line('data: {"error": {"message": "out of memory"}}')


@pytest.mark.parametrize("chunk, n", [
    ({"choices": [{"text": "a", "finish_reason": None}]}, 1),
    ({"choices": [{"text": "", "finish_reason": None}]}, 1),        # half a UTF-8 char
    ({"choices": [{"text": "z", "finish_reason": "length"}]}, 1),   # last token
    ({"choices": [{"text": "", "finish_reason": "stop"}]}, 0),      # closing marker only
    ({"choices": [{"text": "abc", "token_ids": [5, 6, 7]}]}, 3),
    ({"choices": [], "usage": {"completion_tokens": 9}}, 0),        # usage-only chunk
])
def test_chunk_tokens(chunk, n):
    assert chunk_tokens(chunk) == n


def test_usage_tokens():
    assert usage_tokens({"usage": {"completion_tokens": 9}}) == 9
    assert usage_tokens({"usage": None}) is None and usage_tokens({}) is None

