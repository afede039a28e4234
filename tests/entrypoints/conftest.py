"""Server fixtures: `minivllm serve` as a real subprocess on 127.0.0.1 with a tiny model.

(`tests/entrypoints/` is a package, and so are its folders: a folder named `openai` or
`anthropic` on `sys.path` would shadow the real client.)
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

API_KEY = "test-key-123"
MODEL_NAME = "tiny"
BLOCK_SIZE = 4
NUM_BLOCKS = 512
CPU_FLAGS = (
    "--device", "cpu", "--dtype", "float32", "--block-size", str(BLOCK_SIZE),
    "--num-gpu-blocks-override", str(NUM_BLOCKS),
)  # fmt: skip


# A small, closed schema: a random model can only finish it by following the mask.
WEATHER_PARAMS = {
    "type": "object",
    "properties": {
        "city": {"enum": ["Paris", "Oslo"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 7},
    },
    "required": ["city", "days"],
    "additionalProperties": False,
}
# A chat template in Qwen's layout, small, for servers whose tests need to see what reaches
# the prompt (the tiny model's own writes only contents): the tools, each message's
# reasoning, content and calls, tool results.
TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n"
    "{% if m.tool_call_id %}<tool_response id={{ m.tool_call_id }}>{% endif %}"
    "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}"
    '{{ m.content }}{% for c in m.tool_calls or [] %}<tool_call>{"name": '
    '{{ c.function.name | tojson }}, "arguments": {{ c.function.arguments | tojson }}}'
    "</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def child_pids(pid: int) -> list[int]:
    """Direct children of pid (from /proc)."""
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            children.append(int(entry))
    return children


def read_response(sock: socket.socket) -> str:
    """One HTTP response with a Content-Length, head and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return (head + b"\r\n\r\n" + body).decode()


class Server:
    """A running `minivllm serve`; `request` does raw HTTP (http.client, stdlib)."""

    def __init__(
        self,
        model_dir: str,
        log_path: str,
        *flags: str,
        env: dict | None = None,
        engine_flags: tuple[str, ...] = CPU_FLAGS,
    ):
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        cmd = [
            sys.executable, "-m", "minivllm", "serve", model_dir, "--port", str(self.port),
            "--served-model-name", MODEL_NAME, "other-name", *engine_flags,
            "--disable-uvicorn-access-log", "--timeout-graceful-shutdown", "5", *flags,
        ]  # fmt: skip
        self.log = open(log_path, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
        )
        self._wait_healthy(timeout=120)
        self.core_pid = child_pids(self.proc.pid)[0]

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.logs()}")
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"server not healthy in {timeout} s: {self.logs()}")

    def logs(self) -> str:
        self.log.flush()
        with open(self.log.name) as f:
            return f.read()[-4000:]

    def request(
        self, method: str, path: str, body=None, headers: dict | None = None, timeout=60.0
    ) -> tuple[int, object]:
        """(status, parsed JSON or text). body: dict (sent as JSON), bytes or str."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            if isinstance(body, dict):
                body = json.dumps(body)
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            data = response.read().decode()
        finally:
            conn.close()
        try:
            return response.status, json.loads(data)
        except ValueError:
            return response.status, data

    def metrics(self) -> dict[str, float]:
        """Unlabelled view of /metrics: 'minivllm:name' (first labelled sample) -> value."""
        _, text = self.request("GET", "/metrics")
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name_labels, value = line.rsplit(" ", 1)
            name = name_labels.split("{", 1)[0]
            if "finished_reason=" in name_labels:
                reason = name_labels.split('finished_reason="', 1)[1].split('"', 1)[0]
                name = f"{name}[{reason}]"
            values.setdefault(name, float(value))
        return values

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()
        return code


@pytest.fixture(scope="session")
def server(tiny_qwen3_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The shared server (with --api-key)."""
    log = str(tmp_path_factory.mktemp("serve") / "server.log")
    srv = Server(tiny_qwen3_dir, log, "--api-key", API_KEY)
    yield srv
    srv.stop()


@pytest.fixture
def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}


@pytest.fixture(scope="session")
def client(server: Server):
    import openai

    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0)
