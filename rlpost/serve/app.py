"""The HTTP server speaking the Tinker API as the official ``tinker`` SDK calls it.

Every route is under ``/api/v1``. A training, saving or sampling request is a
future: the POST is answered at once with a ``request_id``, the work queued on its
base model's worker thread in arrival order, and the client long-polls
``retrieve_future`` for the result (JSON, or protobuf for forward-backward and
sample results, as the SDK asks). A poll that waits ``poll_s`` without a result
gets 408 ``try_again``, which the SDK answers by polling again. A failed request's
result is ``{"error": ..., "category": "user" | "server"}``, which the SDK raises
in the caller.

Names: a session is ``s<hex>``; its models are ``<session>:train:<n>`` (the SDK
computes this id itself when it loads a checkpoint into a new model), its
samplers ``<session>:sample:<n>``. Checkpoints are
``tinker://<model id>/weights/<name>`` (adapter and optimizer state) and
``tinker://<model id>/sampler_weights/<name>`` (adapter), kept under the state
directory; a request reads one only when it was written with the same API key
(``rlpost.serve.checkpoints``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from rlpost.serve import wire
from rlpost.serve.checkpoints import MODEL_ID, Checkpoints, stamp
from rlpost.serve.errors import NotFound, UserError
from rlpost.serve.host import LoraSpec, ModelHost, read_meta
from rlpost.serve.sampling import SampleRequest

log = logging.getLogger(__name__)

PROTO = "application/x-protobuf"
POLL_S = 25.0  # a retrieve_future waits this long before try_again (the SDK's timeout: 45 s)


@dataclass
class Session:
    owner: str
    models: list[str] = field(default_factory=list)
    samplers: list[str] = field(default_factory=list)


@dataclass
class Sampler:
    key: str  # the host's snapshot key
    host: ModelHost
    owner: str
    model_path: str | None
    issued: int = 0  # sample sequences handed out


Result = dict | bytes


class Service:
    """The Tinker API over ``hosts`` (served name -> its model), checkpoints under
    ``state_dir``; ``api_key``: the one key accepted (None: any, for localhost)."""

    def __init__(self, hosts: dict[str, ModelHost], state_dir: Path, api_key: str | None = None,
                 poll_s: float = POLL_S):  # fmt: skip
        self.hosts, self.state_dir, self.api_key, self.poll_s = hosts, state_dir, api_key, poll_s
        self.checkpoints = Checkpoints(state_dir)
        self.workers = {name: ThreadPoolExecutor(1, thread_name_prefix=f"serve-{name}")
                        for name in hosts}  # fmt: skip
        # sample requests waiting for their host's worker, which answers them together
        self.sampling: dict[str, deque[SampleRequest]] = {name: deque() for name in hosts}
        self.sessions: dict[str, Session] = {}
        self.samplers: dict[str, Sampler] = {}
        self.futures: dict[str, asyncio.Future[Result]] = {}
        self._ids = 0

    # -- the app ---------------------------------------------------------------
    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._errors], client_max_size=1 << 30)
        routes: list[tuple[str, str, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = [
            ("POST", "client/config", self.client_config),
            ("POST", "client/dynamic_config", self.dynamic_config),
            ("POST", "create_session", self.create_session),
            ("POST", "session_heartbeat", self.heartbeat),
            ("POST", "sessions/{session_id}/finish", self.finish),
            ("POST", "telemetry", self.telemetry),
            ("GET", "healthz", self.healthz),
            ("GET", "get_server_capabilities", self.capabilities),
            ("POST", "create_model", self.create_model),
            ("POST", "get_info", self.get_info),
            ("POST", "forward_backward", self.forward_backward),
            ("POST", "optim_step", self.optim_step),
            ("POST", "save_weights", self.save_weights),
            ("POST", "save_weights_for_sampler", self.save_for_sampler),
            ("POST", "load_weights", self.load_weights),
            ("POST", "create_sampling_session", self.create_sampling_session),
            ("GET", "samplers/{sampler_id}", self.get_sampler),
            ("POST", "asample", self.asample),
            ("POST", "retrieve_future", self.retrieve_future),
            ("POST", "cancel_future", self.cancel_future),
            ("GET", "training_runs/{run_id}", self.training_run),
            ("GET", "training_runs/{run_id}/checkpoints", self.list_checkpoints),
            ("DELETE", "training_runs/{run_id}/checkpoints/{kind}/{name}", self.delete_checkpoint),
            ("POST", "weights_info", self.weights_info),
        ]
        for method, path, handler in routes:
            app.router.add_route(method, f"/api/v1/{path}", handler)
        app.on_shutdown.append(self._shutdown)
        return app

    async def _shutdown(self, _app: web.Application) -> None:
        for worker in self.workers.values():
            worker.shutdown(wait=False, cancel_futures=True)

    @staticmethod
    def _json_error(status: int, message: str, category: str = "user") -> web.Response:
        return web.json_response({"error": message, "category": category}, status=status)

    @property
    def _errors(self):  # noqa: ANN202 (aiohttp's middleware signature)
        @web.middleware
        async def middleware(request: web.Request, handler):  # type: ignore[no-untyped-def]
            if not request.path.startswith("/api/v1/"):
                return self._json_error(404, f"no route {request.path}; the Tinker API is "
                                        "under /api/v1")  # fmt: skip
            if request.path != "/api/v1/healthz":
                key = request.headers.get("X-API-Key", "")
                if not key or (self.api_key is not None and key != self.api_key):
                    return self._json_error(401, "a valid X-API-Key is required (TINKER_API_KEY; "
                                            "the key this server was started with)")  # fmt: skip
            try:
                return await handler(request)
            except UserError as e:
                return self._json_error(e.status, str(e))
            except web.HTTPException:
                raise
            except (KeyError, TypeError, ValueError) as e:  # a request missing or mistyping a field
                return self._json_error(400, f"malformed request: {type(e).__name__}: {e}")
            except Exception as e:  # the server's fault: said as JSON, which the SDK reads
                log.exception("%s %s failed", request.method, request.path)
                return self._json_error(500, f"{type(e).__name__}: {e}", "server")

        return middleware

    @staticmethod
    def owner(request: web.Request) -> str:
        return hashlib.sha256(request.headers.get("X-API-Key", "").encode()).hexdigest()[:24]

    @staticmethod
    async def body(request: web.Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise UserError(f"the request body is not JSON ({exc})") from None
        if not isinstance(body, dict):
            raise UserError("the request body must be a JSON object")
        return body

    # -- sessions ------------------------------------------------------------
    async def client_config(self, request: web.Request) -> web.Response:
        return web.json_response({
            "pjwt_auth_enabled": False, "use_pyqwest_transport": False,
            "parallel_fwdbwd_chunks": True, "proto_compress_fwdbwd": False,
            "sample_use_retrieve_futures": False, "custom_loss_server_side": False,
        })  # fmt: skip

    async def dynamic_config(self, request: web.Request) -> web.Response:
        return web.json_response({"sample_cancel_enabled": False})

    async def create_session(self, request: web.Request) -> web.Response:
        await self.body(request)
        session_id = f"s{uuid.uuid4().hex[:16]}"
        self.sessions[session_id] = Session(self.owner(request))
        log.info("session %s opened", session_id)
        return web.json_response({"session_id": session_id, "type": "create_session"})

    def session(self, request: web.Request, session_id: object) -> Session:
        session = self.sessions.get(str(session_id))
        if session is None or session.owner != self.owner(request):
            raise NotFound(f"no session {session_id!r} on this server (it restarted, or the "
                           "session was made with another key)")  # fmt: skip
        return session

    async def heartbeat(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        self.session(request, body.get("session_id"))
        return web.json_response({"type": "session_heartbeat"})

    async def finish(self, request: web.Request) -> web.Response:
        self.session(request, request.match_info["session_id"])
        return web.json_response({})

    async def telemetry(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "accepted"})

    async def healthz(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def capabilities(self, request: web.Request) -> web.Response:
        models = [{"model_name": name, "max_context_length": host.max_len, "trainable": True,
                   "sampleable": True} for name, host in self.hosts.items()]  # fmt: skip
        return web.json_response({"supported_models": models})

    # -- futures -------------------------------------------------------------
    def _submit(
        self, host: ModelHost, fn: Callable[[], Any], finish: Callable[[Any], Result] | None = None
    ) -> str:
        """Queue ``fn`` on ``host``'s worker (arrival order); its future's id. ``fn``
        may answer with a future (the vLLM sampler's) that answers later; ``finish``
        makes the answer of what ``fn`` returned."""
        self._ids += 1
        request_id = f"r{self._ids}-{uuid.uuid4().hex[:8]}"
        loop = asyncio.get_running_loop()
        worker = self.workers[host.name]

        async def answer() -> Result:
            result = await loop.run_in_executor(worker, fn)
            if isinstance(result, Future):  # answered later, off the worker
                result = await asyncio.wrap_future(result)
            return finish(result) if finish is not None else result

        self.futures[request_id] = asyncio.ensure_future(answer())
        return request_id

    async def retrieve_future(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        request_id = str(body.get("request_id"))
        future = self.futures.get(request_id)
        if future is None:
            raise NotFound(f"no future {request_id!r} on this server")
        try:
            result = await asyncio.wait_for(asyncio.shield(future), self.poll_s)
        except asyncio.TimeoutError:
            return web.json_response({"type": "try_again", "request_id": request_id,
                                      "queue_state": "active"}, status=408)  # fmt: skip
        except UserError as exc:
            self.futures.pop(request_id, None)
            return web.json_response({"error": str(exc), "category": "user"})
        except Exception as exc:  # the operation's failure is its request's, not the server's
            self.futures.pop(request_id, None)
            log.exception("request %s failed", request_id)
            return web.json_response(
                {"error": f"{type(exc).__name__}: {exc}", "category": "server"}
            )
        self.futures.pop(request_id, None)
        if isinstance(result, bytes):
            return web.Response(body=result, content_type=PROTO)
        return web.json_response(result)

    async def cancel_future(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        future = self.futures.pop(str(body.get("request_id")), None)
        if future is not None:
            future.cancel()
        return web.json_response({})

    # -- models --------------------------------------------------------------
    def host_of(self, base_model: object) -> ModelHost:
        if base_model not in self.hosts:
            raise UserError(f"base_model={base_model!r} is not served here; served: "
                            f"{', '.join(self.hosts)} (rlpost serve --model NAME=PATH)")  # fmt: skip
        return self.hosts[str(base_model)]

    def model(self, request: web.Request, model_id: object) -> tuple[ModelHost, str]:
        match = MODEL_ID.match(str(model_id))
        if match is not None:
            session = self.sessions.get(match.group(1))
            if session is not None and session.owner == self.owner(request):
                for host in self.hosts.values():
                    if str(model_id) in host.tenants:
                        return host, str(model_id)
        raise NotFound(f"no model {model_id!r} on this server")

    async def create_model(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        session = self.session(request, body.get("session_id"))
        host = self.host_of(body.get("base_model"))
        lora = body.get("lora_config") or {}
        if not isinstance(lora, dict) or "rank" not in lora:
            raise UserError("create_model needs lora_config with a rank; full fine-tuning is not "
                            "served (create_lora_training_client)")  # fmt: skip
        optimizer = (body.get("optimizer_config") or {}).get("type", "adamw")
        if optimizer != "adamw":
            raise UserError(f"optimizer {optimizer!r}: this server steps with adamw")
        spec = LoraSpec(int(lora["rank"]), bool(lora.get("train_mlp", True)),
                        bool(lora.get("train_attn", True)), bool(lora.get("train_unembed", True)),
                        None if lora.get("seed") is None else int(lora["seed"]))  # fmt: skip
        model_id = (
            f"{body['session_id']}:train:{int(body.get('model_seq_id', len(session.models)))}"
        )
        owner = self.owner(request)
        metadata = body.get("user_metadata") or {}
        if not isinstance(metadata, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
        ):
            raise UserError("user_metadata must map strings to strings")

        def create() -> Result:
            host.create(model_id, spec, owner, metadata)
            return {"model_id": model_id, "type": "create_model"}

        session.models.append(model_id)
        return web.json_response({"request_id": self._submit(host, create), "model_id": model_id})

    async def get_info(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        host, model_id = self.model(request, body.get("model_id"))
        spec = host.tenants[model_id].spec
        return web.json_response({
            "type": "get_info", "model_id": model_id, "is_lora": True, "lora_rank": spec.rank,
            "model_name": host.name, "optimizer_config": {"type": "adamw"},
            "model_data": {"arch": host.arch, "model_name": host.name, "tokenizer_id": host.path},
        })  # fmt: skip

    async def forward_backward(self, request: web.Request) -> web.Response:
        raw = await request.read()
        fb = wire.decode_forward_backward(raw, request.headers.get("Content-Encoding"))
        host, _ = self.model(request, fb.model_id)

        def run() -> Result:
            outputs, metrics = host.forward_backward(fb)
            return wire.encode_forward_backward(outputs, metrics)

        return web.json_response({"request_id": self._submit(host, run)})

    async def optim_step(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        host, model_id = self.model(request, body.get("model_id"))
        adam = body.get("adam_params") or body.get("optim_params") or body.get("optimizer_params")
        adam = dict(adam or {})
        if adam.get("type", "adam") not in ("adam", "adamw"):
            raise UserError(f"optimizer {adam.get('type')!r}: this server steps with adam")

        def run() -> Result:
            return {"metrics": host.optim_step(model_id, adam)}

        return web.json_response({"request_id": self._submit(host, run)})

    # -- checkpoints (rlpost/serve/checkpoints.py) ----------------------------
    async def save_weights(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        host, model_id = self.model(request, body.get("model_id"))
        name = body.get("path")
        where = self.checkpoints.folder(model_id, "weights", name)

        def run() -> Result:
            host.save(host.tenants[model_id], where, optimizer=True)
            return {"path": f"tinker://{model_id}/weights/{name}", "type": "save_weights"}

        return web.json_response({"request_id": self._submit(host, run)})

    async def save_for_sampler(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        host, model_id = self.model(request, body.get("model_id"))
        tenant = host.tenants[model_id]
        owner = self.owner(request)
        name = body.get("path")
        if name is not None:
            where = self.checkpoints.folder(model_id, "sampler_weights", name)
            path = f"tinker://{model_id}/sampler_weights/{name}"

            def named() -> Result:
                host.save(tenant, where, optimizer=False)
                host.snapshot(tenant, path, named=True)
                return {"path": path, "type": "save_weights_for_sampler"}

            return web.json_response({"request_id": self._submit(host, named)})
        session_id = model_id.split(":")[0]
        seq = body.get("sampling_session_seq_id", len(self.sessions[session_id].samplers))
        sampler_id = f"{session_id}:sample:{int(seq)}"
        self.samplers[sampler_id] = Sampler(sampler_id, host, owner, None)
        self.sessions[session_id].samplers.append(sampler_id)

        def unnamed() -> Result:
            host.snapshot(tenant, sampler_id, named=False)
            return {"sampling_session_id": sampler_id, "type": "save_weights_for_sampler"}

        return web.json_response({"request_id": self._submit(host, unnamed)})

    async def load_weights(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        if "model_id" in body and "session_id" not in body:
            raise UserError("loading a checkpoint into an existing model is not served; "
                            "create_training_client_from_state(path) makes a new one from it")  # fmt: skip
        session = self.session(request, body.get("session_id"))
        kind, where = self.checkpoints.readable(body.get("path"), self.owner(request))
        if kind != "weights":
            raise UserError("a training client loads a tinker://.../weights/<name> checkpoint "
                            "(save_state), not sampler weights")  # fmt: skip
        meta = read_meta(where)
        host = self.host_of(body.get("base_model", meta["base_model"]))
        model_id = (
            f"{body['session_id']}:train:{int(body.get('model_seq_id', len(session.models)))}"
        )
        owner, optimizer = self.owner(request), bool(body.get("optimizer", False))

        def run() -> Result:
            host.load(model_id, where, optimizer, owner)
            return {"path": body.get("path"), "model_id": model_id, "type": "load_weights"}

        session.models.append(model_id)
        return web.json_response({"request_id": self._submit(host, run), "model_id": model_id})

    async def training_run(self, request: web.Request) -> web.Response:
        """A training run (a tenant) as the SDK's ``RestClient.get_training_run`` reads
        it, with the ``user_metadata`` it was made with (the cookbook keeps its
        renderer there); one no longer served is read from a checkpoint it wrote."""
        run_id = request.match_info["run_id"]
        owner = self.owner(request)
        try:
            host, model_id = self.model(request, run_id)
            t = host.tenant(model_id)
            base, rank, metadata = host.name, t.spec.rank, t.metadata
        except NotFound:
            meta = self.checkpoints.newest_meta(run_id, owner)
            if meta is None:
                raise
            base, rank = meta["base_model"], meta["lora"]["rank"]
            metadata = meta.get("user_metadata") or {}
        return web.json_response({
            "training_run_id": run_id, "base_model": base, "model_owner": owner, "is_lora": True,
            "corrupted": False, "lora_rank": rank,
            "last_request_time": stamp(),
            "last_checkpoint": None, "last_sampler_checkpoint": None, "user_metadata": metadata,
        })  # fmt: skip

    async def list_checkpoints(self, request: web.Request) -> web.Response:
        run_id = request.match_info["run_id"]
        self.model(request, run_id)
        return web.json_response({"checkpoints": self.checkpoints.listing(run_id)})

    async def delete_checkpoint(self, request: web.Request) -> web.Response:
        info = request.match_info
        path = f"tinker://{info['run_id']}/{info['kind']}/{info['name']}"
        self.checkpoints.delete(path, self.owner(request))
        return web.json_response({})

    async def weights_info(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        _, where = self.checkpoints.readable(body.get("tinker_path"), self.owner(request))
        return web.json_response(Checkpoints.info(where))

    # -- sampling ------------------------------------------------------------
    async def create_sampling_session(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        session = self.session(request, body.get("session_id"))
        seq = int(body.get("sampling_session_seq_id", len(session.samplers)))
        sampler_id = f"{body['session_id']}:sample:{seq}"
        owner = self.owner(request)
        if body.get("model_path") is not None:
            _, where = self.checkpoints.readable(body["model_path"], self.owner(request))
            host = self.host_of(read_meta(where)["base_model"])
            self.samplers[sampler_id] = Sampler(sampler_id, host, owner, str(body["model_path"]))
            await asyncio.get_running_loop().run_in_executor(
                self.workers[host.name], host.load_snapshot, sampler_id, where
            )
        else:
            host = self.host_of(body.get("base_model"))
            self.samplers[sampler_id] = Sampler(sampler_id, host, owner, None)
            host.base_snapshot(sampler_id)
        session.samplers.append(sampler_id)
        return web.json_response({"sampling_session_id": sampler_id,
                                  "type": "create_sampling_session"})  # fmt: skip

    def sampler(self, request: web.Request, sampler_id: object) -> Sampler:
        sampler = self.samplers.get(str(sampler_id))
        if sampler is None or sampler.owner != self.owner(request):
            raise NotFound(f"no sampling session {sampler_id!r} on this server")
        return sampler

    async def get_sampler(self, request: web.Request) -> web.Response:
        sampler = self.sampler(request, request.match_info["sampler_id"])
        return web.json_response({"sampler_id": sampler.key, "base_model": sampler.host.name,
                                  "model_path": sampler.model_path})  # fmt: skip

    async def asample(self, request: web.Request) -> web.Response:
        body = await self.body(request)
        sampler = self.sampler(request, body.get("sampling_session_id"))
        prompt = wire.prompt_tokens(body.get("prompt") or {})
        n = int(body.get("num_samples", 1))
        if n < 1:
            raise UserError(f"num_samples={n}: at least 1")
        for flag in ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k"):
            if body.get(flag):
                raise UserError(f"{flag}={body[flag]}: top-k log-probs are not served")
        if body.get("target_prompt_logprobs") is not None:
            raise UserError("target_prompt_logprobs is not served")
        params = wire.sample_params(body.get("sampling_params") or {}, sampler.host.max_len)
        with_prompt = bool(body.get("prompt_logprobs", False))
        host = sampler.host
        ids = [f"{sampler.key}:{sampler.issued + i}" for i in range(n)]
        sampler.issued += n
        asked = SampleRequest(sampler.key, prompt, n, params, with_prompt)
        queue = self.sampling[host.name]
        queue.append(asked)

        def run() -> Any:
            host.sample_queued(queue)  # this request and every one sent since, together
            return asked.answer

        request_id = self._submit(host, run, lambda out: wire.encode_sample(*out))
        return web.json_response({"request_id": request_id, "sample_sequence_ids": ids})


class Server:
    """A service running on an event loop in a thread of its own: for tests and
    notebooks (``rlpost serve`` runs it in the foreground)."""

    def __init__(self, service: Service, host: str = "127.0.0.1", port: int = 0):
        import threading

        self.service, self.host, self.port = service, host, port
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="rlpost-serve")  # fmt: skip
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Server:
        async def up() -> None:
            self._runner = web.AppRunner(self.service.app())
            await self._runner.setup()
            site = web.TCPSite(self._runner, self.host, self.port)
            await site.start()
            self.port = int(self._runner.addresses[0][1])

        self._thread.start()
        asyncio.run_coroutine_threadsafe(up(), self._loop).result(timeout=60)
        return self

    def close(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
