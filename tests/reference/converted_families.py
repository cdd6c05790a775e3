"""GGUF files of each model family made by llama.cpp's own tools, with transformers' logits.

The family fixtures in tests/fixtures/families/ are Hugging Face folders written by
transformers (families_reference.py). A user's GGUF file of the same family was written by
llama.cpp's converter and quantizer instead, which rename, reorder and rescale tensors and write
the metadata our loader reads. This script makes such files:

- F32 and Q8_0: each family's fixture folder (hidden 64), given a tiny tokenizer and the real
  model's chat template, converted with `convert_hf_to_gguf.py --outtype f32` and quantized with
  `llama-quantize`. Gemma 3's folder is written anew with six layers: its fixture's pattern of
  sliding and global layers is not the one llama.cpp assumes (every sixth global), and its
  converter does not write another.
- Q4_K_M: the same family at hidden 256 (K types quantize rows of 256; at 64 llama-quantize
  falls back to other types), written by transformers with seeded random weights, converted and
  quantized the same way.

For every file it reads the tensors back with gguf-py, dequantizes them, undoes the converter's
changes (Llama's q/k row order, Gemma's norms stored as 1 + w) and loads them into transformers'
own model class from the folder's config.json. The F32 file must give back the folder's weights
bit for bit, which checks that inversion; each file's logits for INPUT_IDS and its greedy ids are
written to tests/fixtures/converted/<family>/reference.json, beside the GGUF files, and read by
tests/model_families.rs.

The tokenizers are tiny (a vocabulary of 128 tokens: the fixtures' embedding), so the converter
cannot recognise a BPE pre-tokenizer from its hash; the script names the one each family's real
files carry (`tokenizer.ggml.pre`). Everything else is the converter's own.

    python tests/reference/converted_families.py --llama-cpp LLAMA_CPP_SOURCE \\
        [--llama-quantize BUILD/bin/llama-quantize] [--out tests/fixtures/converted]

Environment: as families_reference.py (torch 2.15.0, transformers 5.24.0), with sentencepiece
and numpy; llama.cpp from PyPI's llama-cpp-python==0.3.36 sdist (build_llama_cpp.sh).
"""

import argparse
import copy
import json
import pathlib
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers

import families_reference

HERE = pathlib.Path(__file__).resolve().parent
FIXTURES = HERE.parent / "fixtures"

# Family: (BPE pre-tokenizer of its real GGUF files, or None for a SentencePiece vocabulary;
# the real model's chat template in tests/fixtures/templates/).
FAMILIES = {
    "qwen2": ("qwen2", "Qwen-Qwen2.5-7B-Instruct.jinja"),
    "qwen3": ("qwen2", "Qwen-Qwen3-0.6B.jinja"),
    "smollm3": ("llama-bpe", "HuggingFaceTB-SmolLM3-3B.jinja"),
    "phi3": (None, "microsoft-Phi-3.5-mini-instruct.jinja"),
    "phi4": ("gpt-4o", "microsoft-Phi-3.5-mini-instruct.jinja"),
    "gemma3": (None, "google-gemma-2-2b-it.jinja"),
}

# Families whose narrow checkpoint is written here (with COMMON's sizes) rather than copied.
NARROW_EXTRA = {
    "gemma3": dict(
        num_hidden_layers=6,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
    ),
}

# The wide checkpoints' shape: every projection's rows a multiple of 256 wide, two layers.
WIDE = dict(hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
WIDE_EXTRA = {
    "qwen3": dict(head_dim=64),
    "smollm3": dict(num_hidden_layers=2),
    "gemma3": dict(
        num_hidden_layers=2,
        head_dim=64,
        query_pre_attn_scalar=64,
        layer_types=["sliding_attention", "sliding_attention"],
    ),
    # LongRoPE has one factor per rotated pair: 32 for heads of 64, 16 at half rotation.
    "phi3": dict(
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0 + 0.1 * i for i in range(32)],
            "long_factor": [1.0 + 0.5 * i for i in range(32)],
        }
    ),
    "phi4": dict(
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.5,
            "short_factor": [1.0 + 0.1 * i for i in range(16)],
            "long_factor": [1.0 + 0.5 * i for i in range(16)],
        }
    ),
}

INPUT_IDS = families_reference.INPUT_IDS
GREEDY_STEPS = families_reference.GREEDY_STEPS
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# Words every tiny vocabulary spells, for the GGUF tokenizer against transformers'.
TEXT = "the theater in an anthem"
# A conversation every template takes (Gemma's refuses a system turn).
CHAT = [
    dict(role="user", content="Hi there"),
    dict(role="assistant", content="Hello."),
    dict(role="user", content="Tell me a story."),
]


def write_bpe_tokenizer(folder: pathlib.Path, template: str, tokenizer_class: str) -> None:
    """A byte-level BPE tokenizer of 3 specials, the 95 printable ASCII bytes and a few merges."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    byte_char = bytes_to_unicode()
    vocab = {token: i for i, token in enumerate(SPECIALS)}
    for b in range(0x20, 0x7F):
        vocab[byte_char[b]] = len(vocab)
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("a", "n"), ("e", "r")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIALS])
    tokenizer.save(str(folder / "tokenizer.json"))
    config = dict(
        tokenizer_class=tokenizer_class,
        bos_token=None,
        eos_token=SPECIALS[2],
        pad_token=SPECIALS[0],
        chat_template=template,
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def write_sentencepiece_tokenizer(
    folder: pathlib.Path, template: str, ids: dict[str, int], gemma: bool
) -> None:
    """A SentencePiece model of the family's special ids, the ASCII letters and a few words;
    Gemma's, as its real one, puts no space before the text."""
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    proto = model_pb2.ModelProto()
    proto.trainer_spec.model_type = model_pb2.TrainerSpec.BPE
    proto.trainer_spec.vocab_size = 0
    proto.trainer_spec.byte_fallback = False
    proto.normalizer_spec.name = "identity"
    proto.normalizer_spec.add_dummy_prefix = not gemma
    proto.normalizer_spec.escape_whitespaces = True
    special = {ids["unk"]: ("<unk>", 2), ids["bos"]: ("<s>", 3), ids["eos"]: ("</s>", 3)}
    if "pad" in ids:
        special[ids["pad"]] = ("<pad>", 3)
    words = [chr(c) for c in range(ord("a"), ord("z") + 1)]
    words += [chr(c) for c in range(ord("A"), ord("Z") + 1)] + ["▁", "▁t", "he", "▁the", "in", "an"]
    pieces = []
    for i in range(len(special) + len(words)):
        if i in special:
            pieces.append((*special[i], 0.0))
        else:
            word = words.pop(0)
            pieces.append((word, 1, -float(i)))
    for text, kind, score in pieces:
        piece = proto.pieces.add()
        piece.piece, piece.type, piece.score = text, kind, score
    proto.trainer_spec.unk_id = ids["unk"]
    proto.trainer_spec.bos_id = ids["bos"]
    proto.trainer_spec.eos_id = ids["eos"]
    proto.trainer_spec.pad_id = ids.get("pad", -1)
    proto.trainer_spec.vocab_size = len(pieces)
    (folder / "tokenizer.model").write_bytes(proto.SerializeToString())
    config = dict(
        tokenizer_class="GemmaTokenizer" if gemma else "LlamaTokenizer",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        chat_template=template,
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=1))


def add_tokenizer(family: str, folder: pathlib.Path) -> None:
    pre, template_name = FAMILIES[family]
    template = (FIXTURES / "templates" / template_name).read_text()
    if pre is None:
        # Gemma: pad 0, eos 1, bos 2, unk 3; Phi-3: unk 0, bos 1, eos 2 (as their fixtures' configs).
        ids = dict(pad=0, eos=1, bos=2, unk=3) if family == "gemma3" else dict(unk=0, bos=1, eos=2)
        write_sentencepiece_tokenizer(folder, template, ids, gemma=family == "gemma3")
    else:
        write_bpe_tokenizer(folder, template, "GPT2Tokenizer" if family == "phi4" else "PreTrainedTokenizerFast")


def checkpoint(family: str, seed: int, folder: pathlib.Path, sizes: dict, changes: dict) -> None:
    """The family's fixture config with `sizes` and `changes`, seeded random weights."""
    config_class, model_class, extra = families_reference.FAMILIES[family]
    common = {**families_reference.COMMON, **sizes}
    extra = {**extra, **changes}
    model = model_class(config_class(**{**common, **extra})).eval()
    families_reference.randomised(model, seed)
    model.save_pretrained(folder, safe_serialization=True)


def convert(llama_cpp: pathlib.Path, family: str, folder: pathlib.Path, out: pathlib.Path) -> None:
    """llama.cpp's converter in a process of its own, with the family's pre-tokenizer named."""
    pre = FAMILIES[family][0]
    program = f"""
import sys
sys.path.insert(0, {str(llama_cpp)!r})
sys.path.insert(1, {str(llama_cpp / 'gguf-py')!r})
import convert_hf_to_gguf
from conversion import base
base.TextModel.get_vocab_base_pre = lambda self, tokenizer: {pre!r}
sys.argv = ["convert_hf_to_gguf.py", {str(folder)!r}, "--outtype", "f32", "--outfile", {str(out)!r}]
convert_hf_to_gguf.main()
"""
    subprocess.run([sys.executable, "-c", program], check=True, capture_output=True)


def quantize(llama_quantize: pathlib.Path, source: pathlib.Path, out: pathlib.Path, kind: str) -> None:
    subprocess.run([str(llama_quantize), str(source), str(out), kind], check=True, capture_output=True)


def dequantized_state(path: pathlib.Path, model: torch.nn.Module, family: str) -> dict[str, torch.Tensor]:
    """The GGUF file's tensors under the model's parameter names, as the model holds them."""
    import gguf

    reader = gguf.GGUFReader(path)
    arch = reader.fields["general.architecture"]
    arch = bytes(arch.parts[arch.data[0]]).decode()
    arch_enum = next(a for a, name in gguf.MODEL_ARCH_NAMES.items() if name == arch)
    config = model.config.get_text_config()
    names = gguf.get_tensor_name_map(arch_enum, config.num_hidden_layers)
    tensors = {t.name: t for t in reader.tensors}
    state = {}
    for name, param in model.state_dict().items():
        hf = name.removeprefix("model.language_model.").removeprefix("model.")
        hf = "model." + hf if not hf.startswith("lm_head") else hf
        gguf_name = names.get_name(hf, try_suffixes=(".weight", ".bias"))
        if gguf_name is None or gguf_name not in tensors:
            if name.startswith("lm_head") and config.tie_word_embeddings:
                continue
            if "vision" in name or "multi_modal" in name:
                continue
            raise SystemExit(f"{path.name}: no tensor for {name} ({gguf_name})")
        tensor = tensors[gguf_name]
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        values = torch.from_numpy(np.array(values, dtype=np.float32)).reshape(param.shape)
        if family == "smollm3" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            values = (
                values.reshape(heads, values.shape[0] // heads // 2, 2, *values.shape[1:])
                .swapaxes(1, 2)
                .reshape(values.shape)
            )
        if family == "gemma3" and name.endswith("norm.weight"):
            values = values - 1.0
        state[name] = values
    return state


def answers(model: torch.nn.Module) -> dict:
    ids = torch.tensor([INPUT_IDS])
    with torch.no_grad():
        logits = model(ids).logits[0]
        greedy = model.generate(
            ids, max_new_tokens=GREEDY_STEPS, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(INPUT_IDS):]
    # Eight digits hold an f32 (the tests' tolerance is 1e-3) in half the text of Python's.
    logits = [[float(f"{v:.8g}") for v in row] for row in logits.tolist()]
    return dict(logits=logits, greedy_ids=greedy.tolist())


def tensor_types(path: pathlib.Path) -> dict[str, str]:
    import gguf

    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-cpp", type=pathlib.Path, required=True)
    parser.add_argument("--llama-quantize", type=pathlib.Path)
    parser.add_argument("--out", type=pathlib.Path, default=FIXTURES / "converted")
    args = parser.parse_args()
    llama_quantize = args.llama_quantize or args.llama_cpp / "build" / "bin" / "llama-quantize"
    sys.path.insert(0, str(args.llama_cpp / "gguf-py"))
    torch.manual_seed(0)
    for seed, family in enumerate(FAMILIES):
        out = args.out / family
        out.mkdir(parents=True, exist_ok=True)
        reference = dict(transformers=transformers.__version__, torch=torch.__version__, input_ids=INPUT_IDS)
        with tempfile.TemporaryDirectory() as work:
            work = pathlib.Path(work)
            narrow, wide = work / "narrow", work / "wide"
            if family in NARROW_EXTRA:
                checkpoint(family, 200 + seed, narrow, {}, NARROW_EXTRA[family])
            else:
                shutil.copytree(FIXTURES / "families" / family, narrow)
                (narrow / "reference.json").unlink()
            checkpoint(family, 100 + seed, wide, WIDE, WIDE_EXTRA.get(family, {}))
            for folder in (narrow, wide):
                add_tokenizer(family, folder)
                convert(args.llama_cpp, family, folder, folder / "F32.gguf")
            shutil.copy(narrow / "F32.gguf", out / "F32.gguf")
            tokenizer = transformers.AutoTokenizer.from_pretrained(narrow)
            reference["text"] = TEXT
            reference["text_ids"] = tokenizer.encode(TEXT, add_special_tokens=False)
            reference["chat"] = tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)
            quantize(llama_quantize, narrow / "F32.gguf", out / "Q8_0.gguf", "Q8_0")
            quantize(llama_quantize, wide / "F32.gguf", out / "Q4_K_M.gguf", "Q4_K_M")
            for kind, folder in (("F32", narrow), ("Q8_0", narrow), ("Q4_K_M", wide)):
                model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
                original = copy.deepcopy(model.state_dict())
                state = dequantized_state(out / f"{kind}.gguf", model, family)
                if kind == "F32":
                    for name, values in state.items():
                        # Gemma's norms are stored as 1 + w, which f32 rounds: compare that form.
                        shift = 1.0 if family == "gemma3" and name.endswith("norm.weight") else 0.0
                        if not torch.equal(values + shift, original[name] + shift):
                            raise SystemExit(f"{family}: F32 {name} differs from the folder's")
                model.load_state_dict(state, strict=False)
                reference[kind] = dict(answers(model), tensor_types=tensor_types(out / f"{kind}.gguf"))
        (out / "reference.json").write_text(json.dumps(reference))
        kinds = {kind: sorted(set(reference[kind]["tensor_types"].values())) for kind in ("F32", "Q8_0", "Q4_K_M")}
        print(family, kinds, {k: (out / f"{k}.gguf").stat().st_size for k in kinds})


if __name__ == "__main__":
    main()
