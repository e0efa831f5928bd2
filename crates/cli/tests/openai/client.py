"""Drives a tenet coordinator with OpenAI's own Python client; prints one JSON object.

Usage: client.py BASE_URL [Q8_MODEL]. Every request goes through the `openai` package exactly as a user's
code would; the Rust test (tests/openai.rs) checks what this prints.
"""
import json
import sys

import openai

base = sys.argv[1]
client = openai.OpenAI(base_url=base + "/v1", api_key="test-key", max_retries=0, timeout=600)
out = {"models": [m.id for m in client.models.list().data]}
messages = [{"role": "user", "content": "What is the capital of France?"}]

r = client.chat.completions.create(model="smollm2", messages=messages, max_tokens=16)
extra = r.model_extra or {}
out["chat"] = {
    "content": r.choices[0].message.content,
    "finish_reason": r.choices[0].finish_reason,
    "usage": [r.usage.prompt_tokens, r.usage.completion_tokens],
    "tokens": extra.get("tenet_tokens"),
    "receipt": extra.get("tenet_receipt"),
    "jobs": extra.get("tenet_jobs"),
}

text, finish, receipt, jobs = "", None, None, None
for chunk in client.chat.completions.create(
    model="smollm2", messages=messages, max_tokens=16, stream=True
):
    if chunk.choices and chunk.choices[0].delta.content:
        text += chunk.choices[0].delta.content
    if chunk.choices and chunk.choices[0].finish_reason:
        finish = chunk.choices[0].finish_reason
        receipt = (chunk.model_extra or {}).get("tenet_receipt")
        jobs = (chunk.model_extra or {}).get("tenet_jobs")
out["stream"] = {"content": text, "finish_reason": finish, "receipt": receipt, "jobs": jobs}

sampled = [
    client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=8, temperature=0.8, top_p=0.9, seed=42
    ).choices[0].message.content
    for _ in range(2)
]
out["sampled"] = sampled

if len(sys.argv) > 2:
    # The same model deployed with `q8` arithmetic under another name.
    r = client.chat.completions.create(model=sys.argv[2], messages=messages, max_tokens=16)
    extra = r.model_extra or {}
    out["q8_chat"] = {
        "content": r.choices[0].message.content,
        "tokens": extra.get("tenet_tokens"),
        "receipt": extra.get("tenet_receipt"),
    }

c = client.completions.create(model="smollm2", prompt="1, 2, 3, 4,", max_tokens=16, stop=["7"])
out["completion"] = {"text": c.choices[0].text, "finish_reason": c.choices[0].finish_reason}

errors = {}
for name, call in {
    "unknown_model": lambda: client.chat.completions.create(model="nope", messages=messages),
    "absurd_max_tokens": lambda: client.chat.completions.create(
        model="smollm2", messages=messages, max_tokens=10**7
    ),
    "past_the_context": lambda: client.completions.create(
        model="smollm2", prompt="word " * 9000, max_tokens=4
    ),
    "no_messages": lambda: client.chat.completions.create(model="smollm2", messages=[]),
}.items():
    try:
        call()
        errors[name] = None
    except openai.APIStatusError as e:
        body = e.body if isinstance(e.body, dict) else {}
        errors[name] = {"status": e.status_code, "code": body.get("code"), "message": e.message}
out["errors"] = errors
print(json.dumps(out))
