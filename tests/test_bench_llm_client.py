"""bench.llm_client's pure parts (AIPerf's command line, its JSON export and console table read
back) and the ``stream_options.include_usage`` reply AIPerf needs from our /v1 endpoint.
AIPerf itself is not needed (nor imported)."""

from __future__ import annotations

import json

import pytest

from bench import llm_client as lc
from workloads.serving import openai_api
from workloads.serving.requests import RequestError

MODEL = "raytpu-byte-lm"


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


@pytest.mark.parametrize(
    ("endpoint", "rate", "profile", "expected"),
    [
        (
            "completions",
            2.0,
            lc.Profile(),
            {"--endpoint-type": "completions", "--request-rate": "2", "--isl": "48"},
        ),
        (
            "chat",
            0.5,
            lc.Profile(prefixes=3, prefix_tokens=256, osl=8, requests=5),
            {
                "--endpoint-type": "chat",
                "--request-rate": "0.5",
                "--num-prefix-prompts": "3",
                "--prefix-prompt-length": "256",
                "--osl": "8",
                "--request-count": "5",
            },
        ),
    ],
)
def test_client_command(endpoint, rate, profile, expected):
    command = lc.client_command("aiperf", "http://h:1/app0", endpoint, rate, profile, "/t", "/o")
    assert command[:2] == ["aiperf", "profile"] and "--streaming" in command
    assert _flag(command, "--url") == "http://h:1/app0" and _flag(command, "--model") == MODEL
    assert _flag(command, "--tokenizer") == "/t" and _flag(command, "--artifact-dir") == "/o"
    assert "--use-server-token-count" in command
    for name, value in expected.items():
        assert _flag(command, name) == value


def test_client_command_refuses_an_unknown_endpoint():
    with pytest.raises(ValueError, match="endpoint: 'embeddings' is not valid"):
        lc.client_command("aiperf", "u", "embeddings", 1.0, lc.Profile(), "t", "o")


@pytest.mark.parametrize(
    ("export", "expected"),
    [
        (
            {
                "time_to_first_token": {"unit": "ms", "avg": 90.0, "p50": 80.0, "p99": 250.0},
                "inter_token_latency": {"unit": "ms", "p50": 4.0, "p99": 9.0},
                "output_token_throughput": {"unit": "tokens/sec", "avg": 31.5},
                "request_throughput": {"unit": "requests/sec", "avg": 1.9},
                "request_count": {"unit": "requests", "avg": 16},
            },
            {
                "ttftP50": 0.08,
                "ttftP99": 0.25,
                "itlP50": 0.004,
                "itlP99": 0.009,
                "outputTokensPerS": 31.5,
                "requestsPerS": 1.9,
                "completed": 16.0,
                "errors": None,
            },
        ),
        (
            {"time_to_first_token": {"unit": "ns", "p50": 2e6, "p99": 3e6}},
            {"ttftP50": 0.002, "ttftP99": 0.003, "itlP50": None, "requestsPerS": None},
        ),
        ({}, dict.fromkeys(lc.KEY_METRICS)),
    ],
)
def test_key_numbers(export, expected):
    got = lc.key_numbers(export)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value) if value is not None else got[key] is None


def test_key_numbers_refuses_an_unknown_unit():
    with pytest.raises(ValueError, match=r"time_to_first_token\.unit: 'fortnights'"):
        lc.key_numbers({"time_to_first_token": {"unit": "fortnights", "p50": 1}})


EFFECTIVE = (
    "┏━━━━━━━━┳━━━━━┓\n┃ Metric ┃ avg ┃\n┡━━━━━━━━╇━━━━━┩\n│ ITL/u  │ 9   │\n└────────┴─────┘"
)
LLM = "┏━━━━━━━━┳━━━━━┓\n┃ Metric ┃ avg ┃\n┡━━━━━━━━╇━━━━━┩\n│ Time to First Token │ 80  │\n└────────┴─────┘"
PANEL = "╭── Warning ──╮\n│  16 of 16   │\n╰─────────────╯"


@pytest.mark.parametrize(
    ("stdout", "expected"),
    [
        ("no table here\n", ""),
        (
            f"INFO starting\n  NVIDIA AIPerf | LLM Metrics\n{EFFECTIVE}\n{LLM}\n{PANEL}\nINFO x\n",
            LLM,
        ),
        (f"{EFFECTIVE}\nINFO between\n{PANEL}\n", EFFECTIVE),
        (f"{PANEL}\n{LLM}   \n", LLM),
    ],
)
def test_client_table(stdout, expected):
    assert lc.client_table(stdout) == expected


def test_side_by_side_rows():
    rows = lc.side_by_side(
        [
            {"endpoint": "chat", "rate": 2.0, "app": "cache on", "completed": 16, "errors": None,
             "ttftP50": 0.08, "ttftP99": 0.25, "itlP50": 0.004, "outputTokensPerS": 31.5,
             "requestsPerS": 1.9, "prefixHitRate": 0.75},
            {"endpoint": "completions", "rate": 4.0, "app": "floor", "error": "exited 1"},
        ]
    )  # fmt: skip
    assert rows[0] == [
        "/v1/chat/completions", "2", "cache on", "16/0", "80 ms", "250 ms", "4 ms", "31.5",
        "1.90", "75%",
    ]  # fmt: skip
    assert rows[1][:4] == ["/v1/completions", "4", "floor", "error"]
    assert rows[1][4:] == ["n/a"] * 6
    assert len(lc.HEADERS) == len(rows[0])


def test_the_byte_tokenizer_has_one_token_per_byte(tmp_path):
    from tokenizers import Tokenizer

    folder = lc.write_tokenizer(tmp_path / "tok")
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    text = "Hello, wörld"
    assert len(tokenizer.encode(text).ids) == len(text.encode("utf-8"))
    assert tokenizer.decode(tokenizer.encode(text).ids) == text
    config = json.loads((folder / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"


# ------------------------------------------------------- stream_options, as AIPerf sends them
def _parse(route: str, **body):
    base = {"model": MODEL, "max_tokens": 2, "stream": True}
    base.update({"messages": [{"role": "user", "content": "hi"}]} if route == openai_api.CHAT
                else {"prompt": "hi"})  # fmt: skip
    base.update(body)
    return openai_api.parse(route, json.dumps(base).encode(), MODEL)


@pytest.mark.parametrize("route", [openai_api.COMPLETIONS, openai_api.CHAT])
@pytest.mark.parametrize("include", [True, False])
def test_include_usage_adds_a_usage_event_before_done(route, include):
    request = _parse(route, stream_options={"include_usage": include})
    assert request.include_usage is include
    completion = openai_api.Completion(request)
    completion.event([104], last=False)
    last = completion.event([105], last=True).decode()
    events = [e.removeprefix("data: ") for e in last.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    if include:
        usage = json.loads(events[-2])
        assert usage["choices"] == []
        assert usage["usage"] == {"prompt_tokens": len(request.generate.prompt),
                                  "completion_tokens": 2,
                                  "total_tokens": len(request.generate.prompt) + 2}  # fmt: skip
    else:
        assert len(events) == 2 and "usage" not in json.loads(events[0])


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"stream": False, "stream_options": {"include_usage": True}}, "only with stream"),
        ({"stream_options": {"include_usage": "yes"}}, "stream_options.include_usage: 'yes'"),
        ({"stream_options": {"extra": 1}}, "stream_options: {'extra': 1} is not valid"),
        ({"stream_options": {"continuous_usage_stats": True}}, "continuous_usage_stats: True"),
    ],
)
def test_stream_options_are_validated(body, fragment):
    with pytest.raises(RequestError) as refused:
        _parse(openai_api.COMPLETIONS, **body)
    assert refused.value.status == 422 and fragment in str(refused.value)


def test_stream_options_false_continuous_stats_and_absent_are_accepted():
    assert not _parse(openai_api.COMPLETIONS).include_usage
    options = {"include_usage": True, "continuous_usage_stats": False}
    assert _parse(openai_api.CHAT, stream_options=options).include_usage
