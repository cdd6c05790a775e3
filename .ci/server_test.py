"""`smolchat serve` as OpenAI's own Python client sees it.

Starts the server on a free port with the tiny test model, then runs chat and completions,
streamed and not, log-probabilities, stop strings and usage through the official `openai`
package, and checks seeded replies against `smolchat generate --json` with the same settings.
Prints "N passed, 0 failed"; exits non-zero on any failure.

    python .ci/server_test.py target/debug/smolchat tests/fixtures/tiny-smollm
"""

import json
import math
import subprocess
import sys
import traceback

import openai

BINARY, MODEL_DIR = sys.argv[1], sys.argv[2]
MODEL = "tiny-smollm"
KEY = "ci-key"


def start_server():
    process = subprocess.Popen(
        [BINARY, "serve", "--model", MODEL_DIR, "--port", "0", "--api-key", KEY],
        stdout=subprocess.PIPE,
        text=True,
    )
    line = process.stdout.readline()
    if "http://" not in line:
        process.kill()
        raise SystemExit(f"the server did not start: {line!r}")
    return process, line.split("at ")[-1].strip()


def generate_json(prompt, *extra):
    output = subprocess.run(
        [BINARY, "generate", "--model", MODEL_DIR, "--prompt", prompt, "--json", *extra],
        check=True,
        capture_output=True,
        text=True,
    )
    return json.loads(output.stdout)


SETTINGS = ["--temperature", "0.9", "--top-p", "0.95", "--seed", "1234", "--max-tokens", "12"]
SETTINGS_KW = dict(temperature=0.9, top_p=0.95, seed=1234, max_tokens=12)


def test_models(client):
    models = client.models.list()
    assert [model.id for model in models.data] == [MODEL], models


def test_chat(client):
    reply = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Hello there"}], **SETTINGS_KW
    )
    reference = generate_json("Hello there", *SETTINGS)
    choice = reply.choices[0]
    assert choice.message.content == reference["text"], (choice.message.content, reference["text"])
    assert reply.usage.completion_tokens == len(reference["token_ids"]), reply.usage
    assert reply.usage.prompt_tokens == reference["prompt_tokens"], reply.usage
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    expected_reason = "stop" if reference["finish_reason"] == "stop_token" else "length"
    assert choice.finish_reason == expected_reason, choice.finish_reason


def test_chat_stream(client):
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello there"}],
        stream=True,
        stream_options={"include_usage": True},
        **SETTINGS_KW,
    )
    text, reason, usage = "", None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            text += choice.delta.content or ""
            reason = choice.finish_reason or reason
    reference = generate_json("Hello there", *SETTINGS)
    assert text == reference["text"], (text, reference["text"])
    assert reason in ("stop", "length"), reason
    assert usage is not None and usage.completion_tokens == len(reference["token_ids"]), usage


def test_completion(client):
    reply = client.completions.create(
        model=MODEL, prompt="Once upon a time", temperature=0, max_tokens=10
    )
    reference = generate_json("Once upon a time", "--raw", "--temperature", "0", "--max-tokens", "10")
    assert reply.choices[0].text == reference["text"], (reply.choices[0].text, reference["text"])
    assert reply.usage.completion_tokens == len(reference["token_ids"])


def test_completion_stream(client):
    stream = client.completions.create(
        model=MODEL, prompt="Once upon a time", temperature=0, max_tokens=10, stream=True
    )
    text = "".join(chunk.choices[0].text for chunk in stream if chunk.choices)
    reference = generate_json("Once upon a time", "--raw", "--temperature", "0", "--max-tokens", "10")
    assert text == reference["text"], (text, reference["text"])


def test_logprobs(client):
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hello there"}],
        logprobs=True,
        top_logprobs=3,
        **SETTINGS_KW,
    )
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    reference = generate_json("Hello there", *SETTINGS, "--logprobs", "3")
    for ours, theirs in zip(content, reference["tokens"]):
        assert len(ours.top_logprobs) == 3
        values = [top.logprob for top in ours.top_logprobs]
        assert values == sorted(values, reverse=True), values
        assert math.isclose(ours.logprob, theirs["logprob"], abs_tol=1e-5), (ours, theirs)
        for value, top in zip(values, theirs["top_logprobs"], strict=True):
            assert math.isclose(value, top["logprob"], abs_tol=1e-5), (values, theirs)
    completion = client.completions.create(
        model=MODEL, prompt="Once upon a time", temperature=0, max_tokens=5, logprobs=2
    )
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.tokens) == len(logprobs.token_logprobs) == len(logprobs.top_logprobs)
    for chosen, top in zip(logprobs.token_logprobs, logprobs.top_logprobs):
        assert max(top.values()) >= chosen - 1e-6


def test_seed_determinism(client):
    def ask(seed):
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Pick a word"}],
            temperature=1.0,
            seed=seed,
            max_tokens=16,
        )
        return reply.choices[0].message.content

    assert ask(7) == ask(7)
    assert ask(7) == generate_json(
        "Pick a word", "--temperature", "1.0", "--seed", "7", "--max-tokens", "16"
    )["text"]


def test_stop(client):
    full = client.completions.create(
        model=MODEL, prompt="Once upon a time", temperature=0, max_tokens=24
    ).choices[0].text
    stop = full[len(full) // 2 : len(full) // 2 + 2]
    cut = client.completions.create(
        model=MODEL, prompt="Once upon a time", temperature=0, max_tokens=24, stop=[stop]
    ).choices[0]
    assert cut.text == full[: full.index(stop)], (cut.text, full, stop)
    assert cut.finish_reason == "stop"


def test_errors(client):
    try:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}], n=2
        )
        raise AssertionError("n=2 was accepted")
    except openai.BadRequestError as error:
        assert error.body["param"] == "n", error.body
    try:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "x"}])
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError:
        pass
    wrong = openai.OpenAI(base_url=client.base_url, api_key="wrong", max_retries=0)
    try:
        wrong.models.list()
        raise AssertionError("a wrong key was accepted")
    except openai.AuthenticationError:
        pass


def main():
    process, base_url = start_server()
    passed, failed = 0, 0
    try:
        client = openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=120)
        tests = [value for name, value in globals().items() if name.startswith("test_")]
        for test in tests:
            try:
                test(client)
                passed += 1
                print(f"ok   {test.__name__}")
            except Exception:
                failed += 1
                print(f"FAIL {test.__name__}")
                traceback.print_exc()
    finally:
        process.terminate()
        process.wait(timeout=30)
    print(f"{passed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
