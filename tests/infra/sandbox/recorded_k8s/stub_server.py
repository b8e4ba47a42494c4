"""A STUB Kubernetes API server for the sandbox backend's tests (not a real API server).

It answers the official client on 127.0.0.1 with the response bodies in this folder (trimmed
copies of what a 1.33 API server returns, `$NAME`/`$NAMESPACE` filled per request) and plays
the kubelet: when a Job is created it runs the pod's command (the pod launcher with its checker
and candidate, the real code) as a local process with the pod's env, as root like the pod's
container, and serves its stdout as the pod log. There is no pod pid namespace here: the
launcher is a child subreaper instead of PID 1.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes import client

from contracts.task import SandboxLimits
from infra.sandbox.kubernetes import KubernetesBackend, build_job_manifest
from infra.sandbox.verifier import checker_job
from infra.settings import KubernetesSandboxSettings

RECORDED = Path(__file__).parent
NAMESPACE = "tempered-sandbox"
SYSTEM_PYTHON = "/usr/bin/python3"


def recorded(name: str, **fill: str) -> Any:
    text = (RECORDED / name).read_text()
    for key, value in fill.items():
        text = text.replace(f"${key}", value)
    return json.loads(text)


class StubKubeApi:
    """STUB of the Kubernetes API (jobs, pods, pods/log) with a local fake kubelet."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str]] = []
        self.deleted: list[tuple[str, dict[str, Any]]] = []
        self.pod_selectors: list[str] = []
        self.fail_create: int | None = None
        self.hang = False  # pods stay Pending forever
        self.terminated_reason: str | None = None  # e.g. OOMKilled: the pod fails, no log line
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @staticmethod
    def as_served(manifest: dict[str, Any]) -> dict[str, Any]:
        """The Job as the API server returns it: the posted object plus server metadata."""
        body = recorded("job-created.json", NAME=manifest["metadata"]["name"], NAMESPACE=NAMESPACE)
        body["metadata"]["labels"] = manifest["metadata"]["labels"]
        body["spec"] = manifest["spec"]
        return body

    def pod(self, job_name: str, template: dict[str, Any]) -> dict[str, Any]:
        """The Job's pod as the API lists it, in the phase the fake kubelet has reached."""
        job = self.jobs[job_name]
        pod = json.loads(json.dumps(template).replace("$NAME", job_name))
        pod["metadata"]["labels"].update(job["manifest"]["spec"]["template"]["metadata"]["labels"])
        if job["done"]:
            pod["status"]["phase"] = job["phase"]
            code = 0 if job["phase"] == "Succeeded" else 137
            reason = self.terminated_reason or ("Completed" if code == 0 else "Error")
            pod["status"]["containerStatuses"][0]["state"] = {
                "terminated": {"exitCode": code, "reason": reason}
            }
        return pod

    def add_job(self, name: str, worker: str) -> None:
        limits = SandboxLimits()
        job = checker_job("", "", "", [], None, limits, {})
        manifest = build_job_manifest(name, NAMESPACE, "python:3.11-slim", job, limits, "n", worker)
        self.jobs[name] = {"manifest": manifest, "done": True, "log": "", "phase": "Succeeded"}

    def _kubelet(self, name: str) -> None:
        """Run the pod's container command the way the kubelet would, with its env."""
        job = self.jobs[name]
        container = job["manifest"]["spec"]["template"]["spec"]["containers"][0]
        env = {item["name"]: item["value"] for item in container["env"]}
        with tempfile.TemporaryDirectory() as work:
            env.update(HOME=work, TMPDIR=work)
            done = subprocess.run(
                [SYSTEM_PYTHON, *container["command"][1:]],
                env=env,
                cwd=work,
                capture_output=True,
                text=True,
                timeout=60,
            )
        job.update(
            log=done.stdout, phase="Succeeded" if done.returncode == 0 else "Failed", done=True
        )

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def reply(self, code: int, body: Any, content_type: str = "application/json") -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                stub.requests.append(("POST", self.path))
                manifest = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                name = manifest["metadata"]["name"]
                if stub.fail_create:
                    return self.reply(
                        stub.fail_create,
                        recorded(f"status-{stub.fail_create}.json", NAME=name, NAMESPACE=NAMESPACE),
                    )
                stub.jobs[name] = {
                    "manifest": manifest,
                    "done": False,
                    "log": "",
                    "phase": "Pending",
                }
                if stub.terminated_reason:
                    stub.jobs[name].update(done=True, phase="Failed", log="Killed\n")
                elif not stub.hang:
                    threading.Thread(target=stub._kubelet, args=(name,), daemon=True).start()
                self.reply(201, stub.as_served(manifest))

            def do_GET(self) -> None:
                url = urlparse(self.path)
                stub.requests.append(("GET", url.path))
                selector = parse_qs(url.query).get("labelSelector", [""])[0]
                key, _, value = selector.partition("=")
                if url.path.endswith("/jobs"):
                    body = recorded("job-list.json")
                    body["items"] = [
                        stub.as_served(j["manifest"])
                        for j in list(stub.jobs.values())  # a run's thread may add one
                        if j["manifest"]["metadata"]["labels"].get(key) == value
                    ]
                    return self.reply(200, body)
                if url.path.endswith("/pods"):
                    stub.pod_selectors.append(selector)
                    body = recorded("pod-list.json", NAMESPACE=NAMESPACE)  # $NAME: per pod
                    template = body.pop("items")[0]
                    body["items"] = [
                        stub.pod(name, template)
                        for name, job in list(stub.jobs.items())
                        if job["manifest"]["spec"]["template"]["metadata"]["labels"].get(key)
                        == value
                    ]
                    return self.reply(200, body)
                match = re.fullmatch(r".*/pods/(.+)-x7k2p/log", url.path)
                if match and match.group(1) in stub.jobs:
                    return self.reply(200, stub.jobs[match.group(1)]["log"], "text/plain")
                self.reply(404, recorded("status-404.json", NAME=url.path, NAMESPACE=NAMESPACE))

            def do_DELETE(self) -> None:
                stub.requests.append(("DELETE", self.path))
                body = json.loads(
                    self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}"
                )
                name = self.path.rsplit("/", 1)[-1]
                stub.deleted.append((name, body))
                if stub.jobs.pop(name, None) is None:
                    return self.reply(
                        404, recorded("status-404.json", NAME=name, NAMESPACE=NAMESPACE)
                    )
                self.reply(200, recorded("status-deleted.json", NAME=name))

        return Handler

    def backend(self, **kwargs: Any) -> KubernetesBackend:
        config = client.Configuration(host=self.url)
        config.retries = 0
        kwargs.setdefault("poll_interval_s", 0.05)
        return KubernetesBackend(
            KubernetesSandboxSettings(namespace=NAMESPACE),
            api_client=client.ApiClient(config),
            worker_id="sandbox-7f9c",
            **kwargs,
        )

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
