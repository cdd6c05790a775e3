"""tiktoken's o200k pre-tokenization, the reference for smolchat's "gpt-4o" pre-tokenizer.

GGUF files of Phi-4-mini (and other vocabularies converted from tiktoken's o200k) name the
pre-tokenizer "gpt-4o". llama.cpp's test vocabularies include none, and its own version of the
split rewrites the pattern for its regex engine (letters "not a-z" for upper case), so the
reference is tiktoken itself: its o200k pattern over the Llama 3 test vocabulary
(`ggml-vocab-llama-bpe.gguf`, also converted from tiktoken, rank = id), encoding every case
of that file's `.inp` (llama.cpp's, MIT) and the cases below, which tell this split from
Llama 3's (case changes inside words, combining marks, slashes after symbols). The cases go to
tests/fixtures/vocab/gpt-4o-on-llama-bpe.inp and the ids to its `.out`, one line per case as
in llama.cpp's files; tests/gguf/vocab_files.rs names the vocabulary's pre-tokenizer "gpt-4o"
and compares. With llama.cpp's `llama-tokenize` (build_llama_cpp.sh) as a second
argument, the cases where llama.cpp differs are printed.

    python tests/reference/gpt4o_vocab_reference.py VOCAB_DIR [LLAMA_TOKENIZE]

VOCAB_DIR holds ggml-vocab-llama-bpe.gguf and its .inp (.ci/fetch-vocab-tests.sh).
Environment: tiktoken 0.14.0 and gguf 0.x from PyPI.
"""

import pathlib
import subprocess
import sys
import tempfile

import gguf
import tiktoken
import tiktoken_ext.openai_public as openai_public

HERE = pathlib.Path(__file__).resolve().parent
OUT = HERE.parent / "fixtures" / "vocab" / "gpt-4o-on-llama-bpe.out"
MARKER = "\n__ggml_vocab_test__\n"

# Where o200k's split differs from Llama 3's.
EXTRA = [
    "HelloWorld CamelCaseWords XMLHttpRequest iPhone macOS",
    "don't DON'T We'RE they'll O'Neil",
    "path/to/file ==//\n a+/b */\n\n",
    "e\u0301te\u0301 nai\u0308ve cafe\u0301 ÀÉÎÕÜ àéîõü ÀéÎõ",
    "Привет Мир ПРИВЕТмир ΑλφαΒήτα",
    "\u01c5ungla \u01c4 \u01c6 ＡＢＣｄｅｆ",
    "12345678 3.14159 ١٢٣٤٥ x²³",
    "\t\n  \n\nx  y\r\n\r\nz",
]


def byte_decoder() -> dict:
    """GPT-2's printable stand-ins back to the bytes they stand for."""
    printable = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("¡"), ord("¬") + 1))
        + list(range(ord("®"), ord("ÿ") + 1))
    )
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, codes)}


def o200k_pattern() -> str:
    """tiktoken's own o200k pattern, without fetching its ranks."""
    real = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = lambda *args, **kwargs: {}
    try:
        return openai_public.o200k_base()["pat_str"]
    finally:
        openai_public.load_tiktoken_bpe = real


def ranks(path: pathlib.Path) -> dict:
    """The vocabulary's normal tokens as tiktoken's byte ranks: rank = token id."""
    reader = gguf.GGUFReader(path)
    tokens = reader.fields["tokenizer.ggml.tokens"]
    types = reader.fields["tokenizer.ggml.token_type"]
    decode = byte_decoder()
    out = {}
    for token_id, (part, kind) in enumerate(zip(tokens.data, types.data)):
        if int(types.parts[kind][0]) != 1:  # normal tokens only
            continue
        text = bytes(tokens.parts[part]).decode()
        out[bytes(decode[c] for c in text)] = token_id
    return out


def renamed(data: bytes, old: str, new: str) -> bytes:
    """The file with `tokenizer.ggml.pre`'s value `old` replaced by `new` (a GGUF string is a
    little-endian u64 length and its bytes; a vocabulary-only file has no tensor data whose
    offset a shorter value would move)."""
    key = b"tokenizer.ggml.pre"
    at = data.index(len(key).to_bytes(8, "little") + key) + 8 + len(key) + 4
    length = int.from_bytes(data[at : at + 8], "little")
    assert data[at + 8 : at + 8 + length] == old.encode()
    return data[:at] + len(new).to_bytes(8, "little") + new.encode() + data[at + 8 + length :]


def llama_cpp_ids(tokenize: str, source: pathlib.Path, cases: list) -> list:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        model = pathlib.Path(tmp) / "ggml-vocab-gpt-4o.gguf"
        model.write_bytes(renamed(source.read_bytes(), "llama-bpe", "gpt-4o"))
        text = pathlib.Path(tmp) / "case.txt"
        for case in cases:
            text.write_bytes(case.encode())
            result = subprocess.run(
                [tokenize, "-m", str(model), "-f", str(text), "--ids", "--no-bos",
                 "--no-escape", "--log-disable"],
                capture_output=True, text=True, check=True,
            )
            out.append([int(i) for i in result.stdout.strip().strip("[]").replace(",", " ").split()])
    return out


def main() -> None:
    vocab_dir = pathlib.Path(sys.argv[1])
    source = vocab_dir / "ggml-vocab-llama-bpe.gguf"
    cases = (vocab_dir / "ggml-vocab-llama-bpe.gguf.inp").read_text().split(MARKER)[:-1]
    cases += EXTRA
    encoding = tiktoken.Encoding(
        name="o200k-pattern-on-llama-bpe",
        pat_str=o200k_pattern(),
        mergeable_ranks=ranks(source),
        special_tokens={},
    )
    expected = [encoding.encode_ordinary(case) for case in cases]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.with_suffix(".inp").write_text("".join(case + MARKER for case in cases))
    OUT.write_text("".join(" ".join(map(str, ids)) + "\n" for ids in expected))
    print(f"{len(cases)} cases -> {OUT}")
    if len(sys.argv) > 2:
        for case, want, got in zip(cases, expected, llama_cpp_ids(sys.argv[2], source, cases)):
            if want != got:
                print(f"llama.cpp differs on {case!r}: {got} against {want}")


if __name__ == "__main__":
    main()
