"""The pooling routes of `minivllm serve` (a real subprocess, tiny reranker with
sentence-transformers' files): the openai client's embeddings.create (float and base64),
/v1/rerank, /rerank and /score against transformers, and 400s naming the field."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import torch

from minivllm.tiny_model import write_sentence_transformers_files
from tests.pooling.test_embed import reference
from tests.pooling.test_score import DOCUMENTS, QUERY, hf_score

API_KEY = "pool-key"
MAX_PROMPTS = 8
MAX_MODEL_LEN = 256
TEXTS = ["Paris is the capital of France.", "hello world", "The sun rises in the east."]


class _Server:
    def __init__(self, model_dir: str, log_path: str) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        cmd = [
            sys.executable, "-m", "minivllm", "serve", model_dir, "--port", str(self.port),
            "--served-model-name", "tiny", "--device", "cpu", "--dtype", "float32",
            "--block-size", "4", "--num-gpu-blocks-override", "512", "--api-key", API_KEY,
            "--max-prompts-per-request", str(MAX_PROMPTS), "--max-model-len", str(MAX_MODEL_LEN),
            "--disable-uvicorn-access-log",
        ]  # fmt: skip
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 120
        while time.time() < deadline:
            assert self.proc.poll() is None, open(log_path).read()[-3000:]
            try:
                if self.post("/health", None, method="GET")[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        raise TimeoutError(open(log_path).read()[-3000:])

    def post(self, path: str, body: dict | None, method: str = "POST", key: str = API_KEY):
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
            conn.request(
                method, path, body=None if body is None else json.dumps(body), headers=headers
            )
            response = conn.getresponse()
            data = response.read().decode()
        finally:
            conn.close()
        return response.status, (json.loads(data) if data else None)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()


@pytest.fixture(scope="module")
def model_dir(reranker_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    out = str(tmp_path_factory.mktemp("pool-serve") / "m")
    shutil.copytree(reranker_dir, out)
    write_sentence_transformers_files(out, "last", True)
    return out


@pytest.fixture(scope="module")
def server(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Server]:
    srv = _Server(model_dir, str(tmp_path_factory.mktemp("pool-log") / "server.log"))
    yield srv
    srv.stop()


def test_openai_client_embeddings(server: _Server, model_dir: str) -> None:
    import openai

    client = openai.OpenAI(base_url=f"http://127.0.0.1:{server.port}/v1", api_key=API_KEY)
    want = reference(model_dir, TEXTS, "last", True)
    as_floats = client.embeddings.create(model="tiny", input=TEXTS, encoding_format="float")
    got = torch.tensor([d.embedding for d in as_floats.data])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert [d.index for d in as_floats.data] == [0, 1, 2]
    num_tokens = as_floats.usage.prompt_tokens
    assert num_tokens == as_floats.usage.total_tokens > 0
    # The client's default asks for base64 and decodes it.
    as_base64 = client.embeddings.create(model="tiny", input=TEXTS)
    torch.testing.assert_close(torch.tensor([d.embedding for d in as_base64.data]), got)
    cut = client.embeddings.create(model="tiny", input=TEXTS[0], dimensions=16)
    assert len(cut.data[0].embedding) == 16
    ids = client.embeddings.create(model="tiny", input=[[5, 6, 7], [8, 9]])
    assert len(ids.data) == 2 and ids.usage.prompt_tokens == 5


def test_rerank_and_score(server: _Server, model_dir: str) -> None:
    want = [hf_score(model_dir, QUERY, d) for d in DOCUMENTS]
    body = {"model": "tiny", "query": QUERY, "documents": DOCUMENTS, "top_n": 2}
    for path in ("/v1/rerank", "/rerank"):
        status, out = server.post(path, body)
        assert status == 200, out
        order = sorted(range(len(want)), key=lambda i: -want[i])[:2]
        assert [r["index"] for r in out["results"]] == order
        for r in out["results"]:
            assert r["relevance_score"] == pytest.approx(want[r["index"]], abs=1e-5)
            assert r["document"]["text"] == DOCUMENTS[r["index"]]
    status, out = server.post("/v1/rerank", {**body, "return_documents": False, "top_n": 0})
    assert status == 200 and len(out["results"]) == 3
    assert all("document" not in r for r in out["results"])
    status, out = server.post("/score", {"model": "tiny", "text_1": QUERY, "text_2": DOCUMENTS})
    assert status == 200, out
    assert [d["score"] for d in out["data"]] == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/embeddings", {"input": []}, "input"),
        ("/v1/embeddings", {"input": [[1, 2, 10**6]]}, "input"),  # an id out of range
        ("/v1/embeddings", {"input": ["x"] * (MAX_PROMPTS + 1)}, "input"),  # too many
        ("/v1/embeddings", {"input": [list(range(1, MAX_MODEL_LEN + 10))]}, "input"),  # too long
        ("/v1/embeddings", {"input": "x", "dimensions": 100000}, "dimensions"),
        ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ("/v1/embeddings", {"input": "x", "colour": 1}, "colour"),
        ("/v1/rerank", {"query": "q", "documents": []}, "documents"),
        ("/v1/rerank", {"query": "q", "documents": ["d"] * (MAX_PROMPTS + 1)}, "documents"),
        ("/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}, "text_2"),
        ("/score", {"text_1": "a"}, "text_2"),
    ],
)  # fmt: skip
def test_bad_input_is_a_400_naming_the_field(server: _Server, path, body, param) -> None:
    status, out = server.post(path, body)
    assert status == 400, out
    assert out["error"]["param"] == param, out


def test_api_key_required(server: _Server) -> None:
    status, out = server.post("/v1/embeddings", {"input": "x"}, key="wrong")
    assert status == 401 and "API key" in out["error"]["message"]
