"""The answers of `bundle serve`'s completion routes in OpenAI's shapes: a request handed to the decoding worker,
its text streamed back as server-sent events or answered whole, the client's going away turned into a cancel."""

from __future__ import annotations

__all__ = ["Answer", "generate"]

import asyncio
import json
import time
import uuid
from typing import Any, AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from bundler.serve.jobs import Job
from bundler.serve.openai_requests import CompletionRequest
from bundler.serve.worker import Requests

TEXT_MARK = "\x00text\x00"  # stands for a chunk's text while the rest of the chunk is encoded (no ref holds a NUL)


class Answer:
    """The OpenAI shapes of one request's answer: its id, object type, model and creation time."""

    def __init__(self, model_id: str, chat: bool):
        self.chat, self.model_id, self.created = chat, model_id, int(time.time())
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.object = "chat.completion" if chat else "text_completion"

    def chunk(self, text: str | None, finish: str | None, first: bool = False) -> dict[str, Any]:
        """One streamed event (the chat's first one carries the role)."""
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {"id": self.id, "object": self.object + ".chunk" if self.chat else self.object, "created": self.created,
                "model": self.model_id, "choices": [choice]}

    def whole(self, done: dict) -> dict[str, Any]:
        """The answer not streamed, from the worker's done event."""
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": done["text"]}, "logprobs": None,
                      "finish_reason": done["finish_reason"]}
        else:
            choice = {"index": 0, "text": done["text"], "logprobs": None, "finish_reason": done["finish_reason"]}
        return {"id": self.id, "object": self.object, "created": self.created, "model": self.model_id, "choices": [choice],
                "usage": _usage(done), "specbundle": {"stats": done["stats"]}}


def _usage(done: dict) -> dict[str, int]:
    return {"prompt_tokens": done["prompt_tokens"], "completion_tokens": done["completion_tokens"],
            "total_tokens": done["prompt_tokens"] + done["completion_tokens"]}


async def generate(requests: Requests, request: Request, req: CompletionRequest, prompt_ids: list[int], model_id: str,
                   time_limit_s: float) -> Response:
    """The request handed to the worker; its text streamed as it comes, or answered whole."""
    job = Job(prompt_ids, req.max_tokens, req.temperature, req.top_p, req.seed, req.stop, asyncio.get_running_loop(),
              asyncio.Queue(), time_limit_s, chat=req.chat)
    requests.submit(job)
    answer = Answer(model_id, req.chat)
    if req.stream:
        return StreamingResponse(_events(job, answer, req.include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return JSONResponse(answer.whole(await _done(request, job)))


async def _events(job: Job, answer: Answer, include_usage: bool) -> AsyncIterator[str]:
    """The server-sent events of a streamed answer, from the worker's events."""
    # Text chunks differ only in their text: the rest is encoded once, not at every token.
    head, _, tail = json.dumps(answer.chunk(TEXT_MARK, None)).partition(json.dumps(TEXT_MARK))
    try:
        if answer.chat:
            yield f"data: {json.dumps(answer.chunk(None, None, first=True))}\n\n"
        while True:
            kind, value = await job.events.get()
            texts = []
            while kind == "text":  # what came while the last chunk was sent goes in one chunk
                texts.append(value)
                if job.events.empty():
                    break
                kind, value = job.events.get_nowait()
            if texts:
                yield f"data: {head}{json.dumps(''.join(texts))}{tail}\n\n"
            if kind == "text":
                continue
            if kind == "error":
                yield f"data: {json.dumps(value.body())}\n\n"
                break
            else:
                yield f"data: {json.dumps(answer.chunk(None, value['finish_reason']))}\n\n"
                if include_usage:
                    yield f"data: {json.dumps({**answer.chunk(None, None), 'choices': [], 'usage': _usage(value)})}\n\n"
                break
        yield "data: [DONE]\n\n"
    finally:  # the client went away (the task is cancelled) or the stream ended: stop generating
        job.cancelled.set()


async def _done(request: Request, job: Job) -> dict:
    """The worker's done event of an answer not streamed; its error raised. A client that goes away
    (http.disconnect) cancels the job all the same."""
    watcher = asyncio.create_task(_cancel_on_disconnect(request, job))
    try:
        while True:
            kind, value = await job.events.get()
            if kind == "error":
                raise value
            if kind == "done":
                return value
    finally:
        job.cancelled.set()
        watcher.cancel()


async def _cancel_on_disconnect(request: Request, job: Job) -> None:
    """Sets job.cancelled when the client closes the connection (the body has been read: the next ASGI
    message is http.disconnect); the worker stops at its next token."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            job.cancelled.set()
            return
