"""The service over a real socket with the tiny random Qwen3 through vLLM's AsyncLLM: concurrent requests each get a
valid answer of the job's form, and the label line reaches the client before the rest of the answer."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn

from qwenspark.config import validate_config
from qwenspark.errors import EngineError
from qwenspark.prompts import get_template
from qwenspark.schemas import SENTIMENTS
from qwenspark.scoring import in_language
from qwenspark.serve.app import Service, create_app, serve_engine_config
from qwenspark.serve.engine import AsyncVllm
from tests.conftest import SAMPLE_REVIEWS

pytestmark = pytest.mark.engine


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# v13 writes its answers as lines: the label is the first line, sent as soon as its newline is decoded.
@pytest.mark.parametrize("version", ["v10", "v13"])
def test_concurrent_requests_and_the_label_first_stream_over_a_socket(version: str, tiny_model: Path) -> None:
    cfg = validate_config({
        "engine": {"kind": "vllm", "model": str(tiny_model), "max_tokens": 160, "max_model_len": 2048,
                   "enforce_eager": True, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
        "prompt": {"version": version}, "serve": {"max_queue": 64},
    })
    port = _port()

    async def go() -> tuple[list[httpx.Response], list[tuple[float, dict[str, Any]]]]:
        engine = await AsyncVllm.start(serve_engine_config(cfg))
        spec = engine._llm.vllm_config.speculative_config
        server = uvicorn.Server(uvicorn.Config(create_app(Service(cfg, engine)), host="127.0.0.1", port=port,
                                               log_level="warning"))
        serving = asyncio.create_task(server.serve())
        try:
            while not server.started:
                await asyncio.sleep(0.05)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as client:
                posts = [client.post("/v1/analyze", json={"text": text, "lang": lang, "review_id": i})
                         for i, (text, lang) in enumerate(SAMPLE_REVIEWS * 2)]
                answers = list(await asyncio.gather(*posts))
                lines: list[tuple[float, dict[str, Any]]] = []
                started = time.perf_counter()
                async with client.stream("POST", "/v1/analyze?stream=true",
                                         json={"text": SAMPLE_REVIEWS[0][0], "lang": "zh"}) as response:
                    async for line in response.aiter_lines():
                        if line:
                            lines.append((time.perf_counter() - started, json.loads(line)))
                metrics = (await client.get("/metrics")).text
        finally:
            server.should_exit = True
            await serving
            await engine.close()
        assert 'qwenspark_serve_requests_total{code="200"} 13.0' in metrics
        # the service's CPU default, as vLLM took it (serve.engine.SERVE_CPU_DEFAULTS): the answers above were
        # decoded with n-gram proposals
        assert (spec.method, spec.num_speculative_tokens) == ("ngram", 4)
        return answers, lines

    answers, lines = asyncio.run(go())
    for i, response in enumerate(answers):
        assert response.status_code == 200, response.text
        [result] = response.json()["results"]
        lang = (SAMPLE_REVIEWS * 2)[i][1]
        assert result["review_id"] == i and result["error"] is None, result
        assert result["sentiment"] in ("positive", "negative", "neutral", "mixed")
        assert in_language(result["summary"], lang), result  # the version's grammar, per request's language
        assert result["prompt_version"] == version and result["tokens_out"] > 0
    (t_label, label), (t_result, result) = lines
    assert set(label) == {"index", "sentiment", "label_ms"} and result["result"]["sentiment"] == label["sentiment"]
    assert t_label < t_result, "the label line arrived before the answer's end"


# A retry after the label was sent is pinned to it: the grammar allows that label only. The tiny random model would
# write any of the four; pinned, every answer starts with the label asked for, in both answer formats.
@pytest.mark.parametrize("version", ["v10", "v13"])
def test_a_pinned_retry_writes_the_label_it_is_pinned_to(version: str, tiny_model: Path) -> None:
    cfg = validate_config({
        "engine": {"kind": "vllm", "model": str(tiny_model), "max_tokens": 24, "max_model_len": 2048,
                   "enforce_eager": True, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
        "prompt": {"version": version},
    })
    engine_cfg = serve_engine_config(cfg)
    conversation = get_template(version).messages(SAMPLE_REVIEWS[1][0], SAMPLE_REVIEWS[1][1])
    first = {"v10": '{"sentiment":"', "v13": ""}[version]

    async def go() -> dict[str, str]:
        engine = await AsyncVllm.start(engine_cfg)
        try:
            texts = {}
            for label in SENTIMENTS:
                async for part in engine.stream(conversation, SAMPLE_REVIEWS[1][1], "grammar", label):
                    if part.done is not None:
                        texts[label] = part.done.text
            return texts
        finally:
            await engine.close()

    texts = asyncio.run(go())
    assert set(texts) == set(SENTIMENTS)
    for label, text in texts.items():
        assert text.startswith(first + label + ('"' if first else "\n")), (label, text)


# A second attempt at an answer the engine ended in an error ("fault") asks vLLM for its prompt with a cache salt of
# its own (its KV computed afresh, none of the faulted attempt's cached blocks reused); every other attempt shares
# the prefix cache. Read at vLLM's AsyncLLM.generate, as vLLM receives each request.
def test_a_fault_retry_asks_vllm_for_its_prompt_computed_afresh(tiny_model: Path) -> None:
    cfg = validate_config({
        "engine": {"kind": "vllm", "model": str(tiny_model), "max_tokens": 24, "max_model_len": 2048,
                   "enforce_eager": True, "env": {"VLLM_CPU_KVCACHE_SPACE": "1"}},
        "prompt": {"version": "v14"},
    })
    conversation = get_template("v14").messages(SAMPLE_REVIEWS[1][0], SAMPLE_REVIEWS[1][1])
    attempts = [(None, None), ("grammar", None), ("fault", None), ("fault", "negative"), ("fault", None)]

    async def go() -> tuple[list[Any], list[str]]:
        engine = await AsyncVllm.start(serve_engine_config(cfg))
        salts: list[Any] = []
        own = engine._llm.generate

        def generate(prompt: Any, params: Any, request_id: str, *args: Any, **kwargs: Any) -> Any:
            salts.append(prompt.get("cache_salt"))
            return own(prompt, params, request_id, *args, **kwargs)

        engine._llm.generate = generate
        try:
            texts = []
            for retry, pin in attempts:
                async for part in engine.stream(conversation, SAMPLE_REVIEWS[1][1], retry, pin):
                    if part.done is not None:
                        texts.append(part.done.text)
            return salts, texts
        finally:
            await engine.close()

    salts, texts = asyncio.run(go())
    assert len(texts) == len(attempts) and all(texts), texts
    assert salts[:2] == [None, None], salts
    assert all(isinstance(salt, str) and salt for salt in salts[2:]) and len(set(salts[2:])) == 3, salts
    assert texts[3].startswith("negative\n"), texts[3]  # pinned as ever


def test_the_gpu_defaults_sit_under_the_users_settings_and_vllm_reads_them() -> None:
    from vllm.config import CUDAGraphMode

    from qwenspark.engines.vllm_feeds import engine_args
    from qwenspark.serve.engine import gpu_kwargs

    args = engine_args(gpu_kwargs({"dtype": "bfloat16"}), "m", asynchronous=True)
    assert (args.max_num_seqs, args.max_num_batched_tokens) == (256, 2048)
    assert args.compilation_config.cudagraph_mode == CUDAGraphMode.FULL
    assert args.compilation_config.max_cudagraph_capture_size == 2048
    assert args.attention_config.backend.name == "TRITON_ATTN"  # FA3's mixed full graphs alter answers (stop 57)
    # What the user set wins, key by key; the graphs follow a smaller step budget; eager means no graphs asked for.
    mine = gpu_kwargs({"max_num_seqs": 64, "max_num_batched_tokens": 1024,
                       "compilation_config": {"cudagraph_mode": "FULL_AND_PIECEWISE"}})
    assert mine["max_num_seqs"] == 64
    assert mine["compilation_config"] == {"cudagraph_mode": "FULL_AND_PIECEWISE", "max_cudagraph_capture_size": 1024}
    assert mine["attention_config"] == {"backend": "TRITON_ATTN"}
    assert gpu_kwargs({"attention_config": {"backend": "FLASH_ATTN"}})["attention_config"] == {"backend": "FLASH_ATTN"}
    assert "attention_config" not in gpu_kwargs({"attention_backend": "FLASH_ATTN"})  # vLLM's other spelling
    assert "compilation_config" not in gpu_kwargs({"enforce_eager": True})


def test_the_cpu_defaults_speculate_from_the_prompt_unless_the_user_says_otherwise() -> None:
    from qwenspark.engines.vllm_feeds import engine_args
    from qwenspark.serve.engine import cpu_kwargs

    args = engine_args(cpu_kwargs({"dtype": "float32"}, {}), "m", asynchronous=True)
    assert args.speculative_config == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2,
                                       "prompt_lookup_max": 4}
    mine = {"method": "ngram", "num_speculative_tokens": 2}
    assert cpu_kwargs({"speculative_config": mine}, {"speculative_config": mine})["speculative_config"] == mine
    # engine.engine_kwargs.speculative_config: null turns it off (engines.vllm.engine_kwargs drops the None)
    assert "speculative_config" not in cpu_kwargs({"dtype": "float32"}, {"speculative_config": None})


# vLLM builds its grammar backend and compiles the GPU's mask kernel at the first guided request, in the step loop
# every running answer waits on; the service runs each of its answer settings once, short and all at once, first.
def test_the_engine_is_warmed_under_every_answer_setting_at_once(tiny_model: Path) -> None:
    from transformers import AutoTokenizer
    from vllm.sampling_params import StructuredOutputsParams

    from qwenspark.engines.vllm import sampling_params
    from qwenspark.parse import answer_grammars
    from qwenspark.serve.engine import WARM_TOKENS

    engine_cfg = serve_engine_config(validate_config({
        "engine": {"kind": "vllm", "model": str(tiny_model), "max_tokens": 200}, "prompt": {"version": "v13"},
        "serve": {"optimistic": True}}))
    params = sampling_params(engine_cfg)
    seen: list[Any] = []
    in_flight = {"now": 0, "most": 0}

    class Llm:
        async def generate(self, prompt: Any, settings: Any, request_id: str) -> Any:
            seen.append(settings)
            in_flight["now"] += 1
            in_flight["most"] = max(in_flight["most"], in_flight["now"])
            await asyncio.sleep(0.01)
            in_flight["now"] -= 1
            yield prompt

    engine = AsyncVllm(Llm(), AutoTokenizer.from_pretrained(tiny_model), params, "m", engine_cfg)
    count = asyncio.run(engine.warm())
    # every attempt (the first, two kinds of retry) for every language the summary's script is checked in; an answer
    # the engine ended in an error, or one that borrowed an example's summary, is generated again with the grammar
    # retry's settings, warmed once
    assert all(params[lang, "fault"] is params[lang, "borrowed"] is params[lang, "grammar"] for lang, _ in params)
    assert count == len(seen) == in_flight["most"] == len({id(p) for p in params.values()}) >= 3
    assert {s.max_tokens for s in seen} == {WARM_TOKENS} and {p.max_tokens for p in params.values()} == {200}
    grammars = [s.structured_outputs for s in seen]
    assert None in grammars, "the unguided first attempt"
    for lang, grammar in answer_grammars(engine_cfg).items():
        assert StructuredOutputsParams(**grammar) in grammars, f"the retries' grammar for {lang}"


class _Out:
    """One step of vLLM's output for a request, its new token ids (RequestOutputKind.DELTA)."""

    def __init__(self, ids: list[int], finished: bool) -> None:
        self.finished = finished
        self.outputs = [type("Best", (), {"token_ids": ids, "text": "", "logprobs": None,
                                           "finish_reason": "stop" if finished else None})()]


def test_dead_ends_are_read_only_in_unguided_answers_and_whole_characters(tiny_model: Path) -> None:
    from transformers import AutoTokenizer

    from qwenspark.engines.vllm import sampling_params
    from qwenspark.serve.engine import DEAD_END

    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    engine_cfg = serve_engine_config(validate_config({
        "engine": {"kind": "vllm", "model": str(tiny_model)}, "prompt": {"version": "v13"},
        "serve": {"optimistic": True}}))
    closed: list[str] = []

    class Llm:
        def __init__(self) -> None:
            self.answer: list[int] = []

        async def generate(self, prompt: Any, settings: Any, request_id: str) -> Any:
            try:
                for n, token in enumerate(self.answer):
                    yield _Out([token], n == len(self.answer) - 1)
            except GeneratorExit:
                closed.append(request_id)  # AsyncLLM aborts the request here
                raise

    llm = Llm()
    engine = AsyncVllm(llm, tokenizer, sampling_params(engine_cfg), "m", engine_cfg)

    async def run(text: str, retry: Any = None, ids: list[int] | None = None) -> Any:
        llm.answer = ids or tokenizer.encode(text)
        async for step in engine.steps([1, 2], "zh", retry):
            last = step
        return last

    # a fitting answer whose Han characters are split over byte tokens runs to its end
    fits = 'negative\n"房间很脏，龘靐齉"\nroom:negative'
    assert any("\ufffd" in tokenizer.decode([t]) for t in tokenizer.encode(fits)), "no character split over tokens"
    done = asyncio.run(run(fits))
    assert done.finish_reason == "stop" and tokenizer.decode(done.ids) == fits and not closed
    # read as the parser reads it: a special token inside the summary is not text (its name would be Latin letters)
    special = [*tokenizer.encode('negative\n"房间'), tokenizer.convert_tokens_to_ids("<|endoftext|>"),
               *tokenizer.encode('很脏"\nroom:negative')]
    assert asyncio.run(run("", ids=special)).finish_reason == "stop" and not closed
    # an English summary of a Chinese review: cut at its first letter, the request closed
    dead = asyncio.run(run('negative\n"Dirty room, rude staff"\nroom:negative'))
    assert dead.finish_reason == DEAD_END and tokenizer.decode(dead.ids).endswith('"Dirty') and len(closed) == 1
    # the grammar's attempt is never cut
    guided = asyncio.run(run('negative\n"Dirty room"\n', "grammar"))
    assert guided.finish_reason == "stop" and len(closed) == 1


def test_the_service_publishes_its_answers_in_flight_for_a_batch_beside_it(tiny_model: Path) -> None:
    # engine.yield_to_service: a batch engine on the host reads these counts (qwenspark/engines/yielding.py).
    from transformers import AutoTokenizer

    from qwenspark.engines import yielding
    from qwenspark.engines.vllm import sampling_params

    engine_cfg = serve_engine_config(validate_config({"engine": {"kind": "vllm", "model": str(tiny_model)}}))
    release = asyncio.Event()

    class Llm:
        async def generate(self, prompt: Any, settings: Any, request_id: str) -> Any:
            await release.wait()
            if request_id.endswith("-2"):
                raise RuntimeError("engine core died")
            yield _Out([1], True)

        def shutdown(self) -> None:
            pass

    async def run() -> None:
        engine = AsyncVllm(Llm(), AutoTokenizer.from_pretrained(tiny_model), sampling_params(engine_cfg), "m",
                           engine_cfg)
        board = yielding.Board(yielding.board_dir(), mine="")
        mine = yielding.board_dir() / f"{os.getpid()}.busy"

        def count() -> int:
            return int(yielding._COUNT.unpack_from(mine.read_bytes())[0])

        assert count() == 0 and not board.busy(time.monotonic())

        async def answer() -> None:
            async for _ in engine.steps([1, 2], None):
                pass

        answers = [asyncio.create_task(answer()) for _ in range(4)]
        await asyncio.sleep(0.05)
        assert count() == 4 and board.busy(time.monotonic())
        answers[3].cancel()  # a client gone
        await asyncio.sleep(0.05)
        assert count() == 3
        release.set()
        results = await asyncio.gather(*answers, return_exceptions=True)
        assert isinstance(results[2], EngineError) and isinstance(results[3], asyncio.CancelledError)
        assert count() == 0 and not board.busy(time.monotonic())
        board.close()
        await engine.close()

    asyncio.run(run())
