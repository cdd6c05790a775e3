"""Real models' chat templates rendered by transformers, the reference for smolchat's renderer.

The templates in tests/fixtures/templates/ are copied from llama.cpp's models/templates/ in the
llama-cpp-python==0.3.36 sdist (MIT). For each template and each conversation in CASES this
renders with transformers' own renderer (`render_jinja_template`, what `apply_chat_template`
calls) and writes tests/fixtures/templates/expected.json.

    python tests/reference/templates_reference.py

Environment: transformers 5.24.0 from PyPI.
"""

import json
import pathlib

import transformers
from transformers.utils.chat_template_utils import render_jinja_template

HERE = pathlib.Path(__file__).resolve().parent
TEMPLATES = HERE.parent / "fixtures" / "templates"

# What each model's tokenizer passes as bos_token and eos_token.
SPECIAL_TOKENS = {
    "Qwen-Qwen3-0.6B": (None, "<|im_end|>"),
    "Qwen-Qwen2.5-7B-Instruct": (None, "<|im_end|>"),
    "HuggingFaceTB-SmolLM3-3B": ("<|begin_of_text|>", "<|im_end|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
}

SYSTEM = {"role": "system", "content": "You are terse."}
USER = {"role": "user", "content": "What is 2+2?"}
ANSWER = {"role": "assistant", "content": "4."}
USER_2 = {"role": "user", "content": "And 3+3?\nShow the sum."}
THOUGHT = {
    "role": "assistant",
    "content": "6.",
    "reasoning_content": "Three plus three is six.",
}
FINAL = {"role": "assistant", "content": "The answer"}

# name, messages, add_generation_prompt, extra template variables
CASES = [
    ("user only", [USER], True, {}),
    ("system and several turns", [SYSTEM, USER, ANSWER, USER_2], True, {}),
    ("final assistant message", [SYSTEM, USER, ANSWER, USER_2, FINAL], False, {}),
    ("thinking on", [USER, ANSWER, USER_2], True, {"enable_thinking": True}),
    ("thinking off", [USER, ANSWER, USER_2], True, {"enable_thinking": False}),
    ("earlier reasoning", [USER, THOUGHT, USER_2], True, {}),
    ("think flag in system", [{"role": "system", "content": "/no_think"}, USER], True, {}),
]

# Templates that refuse a system message (Gemma 2 raises) are rendered without one.
NO_SYSTEM = {"google-gemma-2-2b-it"}


def main() -> None:
    expected = []
    for path in sorted(TEMPLATES.glob("*.jinja")):
        name = path.stem
        template = path.read_text()
        bos, eos = SPECIAL_TOKENS[name]
        for case, messages, add_generation_prompt, extra in CASES:
            if name in NO_SYSTEM:
                messages = [m for m in messages if m["role"] != "system"]
            variables = dict(extra)
            # Llama 3.x prints today's date unless it is given one.
            variables["date_string"] = "26 Nov 2026"
            if bos is not None:
                variables["bos_token"] = bos
            variables["eos_token"] = eos
            rendered, _ = render_jinja_template(
                conversations=[messages],
                chat_template=template,
                add_generation_prompt=add_generation_prompt,
                **variables,
            )
            expected.append(
                {
                    "template": name,
                    "case": case,
                    "messages": messages,
                    "add_generation_prompt": add_generation_prompt,
                    "variables": variables,
                    "rendered": rendered[0],
                }
            )
    out = TEMPLATES / "expected.json"
    out.write_text(json.dumps({"transformers": transformers.__version__, "cases": expected}, indent=1) + "\n")
    print(f"{len(expected)} renderings -> {out}")


if __name__ == "__main__":
    main()
